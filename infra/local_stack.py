"""The local stack: a Prefect server and an MLflow server on loopback, started and stopped cleanly."""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator


class ServerDownError(RuntimeError):
    """A server did not come up (or is not reachable) at the given URL."""


def wait_healthy(url: str, timeout_s: float, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ServerDownError(f"{what} exited with code {proc.returncode} before answering at {url}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise ServerDownError(f"{what} did not answer at {url} within {timeout_s:.0f} s")


def require_servers(tracking_uri: str | None = None, prefect: bool = True, timeout_s: float = 5.0) -> None:
    """Fail fast, before any work, when a configured server does not answer: an http(s) MLflow
    tracking URI (`<uri>/health`) and, if `prefect`, the Prefect API named by PREFECT_API_URL
    (`<api>/health`). Local stores (SQLite, files) and Prefect's temporary server need no check."""
    checks = []
    if tracking_uri and tracking_uri.startswith(("http://", "https://")):
        checks.append(
            (
                tracking_uri.rstrip("/") + "/health",
                "MLflow tracking server",
                "start it (`copc up`) or point --tracking-uri / MLFLOW_TRACKING_URI elsewhere",
            )
        )
    api = os.environ.get("PREFECT_API_URL") if prefect else None
    if api:
        checks.append(
            (
                api.rstrip("/") + "/health",
                "Prefect API (PREFECT_API_URL)",
                "start it (`copc up`) or unset PREFECT_API_URL to use a temporary local server",
            )
        )
    for url, what, hint in checks:
        try:
            wait_healthy(url, timeout_s, what)
        except ServerDownError as err:
            raise ServerDownError(f"{err}: {hint}") from None


def _bin(name: str) -> str:
    found = shutil.which(name, path=os.path.dirname(sys.executable)) or shutil.which(name)
    if not found:
        raise FileNotFoundError(f"{name} is not installed beside {sys.executable}")
    return found


def _die_with_parent() -> None:
    """In the child, before exec: start a session of its own (Ctrl-C in the terminal reaches the parent
    only) and ask Linux for SIGTERM when the parent dies, however it dies (SIGKILL included)."""
    os.setsid()
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def prefect_command(host: str, port: int, allowed_hosts: str | None = None) -> list[str]:
    """`prefect server start` with a Host check in front (flows/prefect_server.py, against DNS rebinding; a program
    this layer runs, as it runs `mlflow server`, not a module it imports)."""
    extra = ["--allowed-hosts", allowed_hosts] if allowed_hosts else []
    return [sys.executable, "-m", "flows.prefect_server", "--host", host, "--port", str(port), *extra]


def prefect_home(data: pathlib.Path, temporary: bool = False) -> pathlib.Path:
    """Where a data folder's Prefect server keeps its database: `copc up`'s, or a command's own temporary server's."""
    return pathlib.Path(data) / ("prefect-temporary" if temporary else "prefect")


class LocalStack:
    """A Prefect server and an MLflow server on `host`, with their own protections on.

    Prefect: CSRF protection, CORS limited to the UI's own origin, the UI pointed at this API (whatever
    the port), anonymous analytics off, and an optional basic-auth string (clients then need
    PREFECT_API_AUTH_STRING). MLflow: its host and CORS checks with the values given (its defaults
    admit localhost and private-network hosts), and basic auth when asked. Both servers die with this
    process, however it ends.
    """

    def __init__(
        self,
        data: pathlib.Path,
        host: str = "127.0.0.1",
        prefect_port: int = 4200,
        mlflow_port: int = 5000,
        prefect_auth: str | None = None,
        mlflow_allowed_hosts: str | None = None,
        mlflow_cors_origins: str | None = None,
        mlflow_basic_auth: bool = False,
        prefect_allowed_hosts: str | None = None,
    ):
        self.data = pathlib.Path(data)
        self.host, self.prefect_port, self.mlflow_port = host, prefect_port, mlflow_port
        self.prefect_url = f"http://{host}:{prefect_port}"
        self.mlflow_url = f"http://{host}:{mlflow_port}"
        self.prefect_auth = prefect_auth
        self.mlflow_allowed_hosts, self.mlflow_cors_origins = mlflow_allowed_hosts, mlflow_cors_origins
        self.mlflow_basic_auth = mlflow_basic_auth
        self.prefect_allowed_hosts = prefect_allowed_hosts
        self.procs: list[subprocess.Popen] = []

    def prefect_env(self) -> dict[str, str]:
        env = dict(
            os.environ,
            PREFECT_HOME=str(prefect_home(self.data)),
            PREFECT_SERVER_ANALYTICS_ENABLED="false",
            PREFECT_SERVER_CSRF_PROTECTION_ENABLED="true",
            PREFECT_SERVER_CORS_ALLOWED_ORIGINS=self.prefect_url,
            PREFECT_UI_API_URL=f"{self.prefect_url}/api",
        )
        if self.prefect_auth:
            env["PREFECT_SERVER_API_AUTH_STRING"] = self.prefect_auth
        return env

    def mlflow_command(self) -> list[str]:
        cmd = [
            _bin("mlflow"),
            "server",
            "--host",
            self.host,
            "--port",
            str(self.mlflow_port),
            "--backend-store-uri",
            f"sqlite:///{self.data / 'mlflow.db'}",
            "--default-artifact-root",
            str(self.data / "mlartifacts"),
            "--workers",
            "1",
        ]
        if self.mlflow_allowed_hosts:
            cmd += ["--allowed-hosts", self.mlflow_allowed_hosts]
        if self.mlflow_cors_origins:
            cmd += ["--cors-allowed-origins", self.mlflow_cors_origins]
        if self.mlflow_basic_auth:
            cmd += ["--app-name", "basic-auth"]
        return cmd

    def mlflow_env(self) -> dict[str, str]:
        """The MLflow server's environment. MLflow 3.17 starts job consumers for GenAI scorers by default (7
        processes, ~2.3 GB, none used here): off. With basic auth: its user store in the data folder (MLflow's own
        default is `basic_auth.db` in the working directory), through an auth config written there; MLflow makes
        the admin user on first start with $MLFLOW_AUTH_ADMIN_PASSWORD; its CSRF secret
        ($MLFLOW_FLASK_SERVER_SECRET_KEY, required) is made once and kept there too, unless the caller sets one."""
        env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
        if self.mlflow_basic_auth:
            from mlflow.server import auth

            ini = self.data / "mlflow-auth.ini"
            shipped = (pathlib.Path(auth.__file__).parent / "basic_auth.ini").read_text()
            ini.write_text(
                shipped.replace("sqlite:///basic_auth.db", f"sqlite:///{self.auth_store()}"), encoding="utf-8"
            )
            env["MLFLOW_AUTH_CONFIG_PATH"] = str(ini)
            env.setdefault("MLFLOW_FLASK_SERVER_SECRET_KEY", self._secret_key())
        return env

    def _secret_key(self) -> str:
        """The key MLflow's auth app signs its CSRF tokens with: made once, kept in the data folder (owner-only)."""
        import secrets

        path = self.data / "mlflow-secret-key"
        if not path.exists():
            path.touch(mode=0o600)
            path.write_text(secrets.token_hex(32), encoding="utf-8")
        return path.read_text(encoding="utf-8").strip()

    def auth_store(self) -> pathlib.Path:
        """Where MLflow's basic-auth app keeps its users."""
        return self.data / "mlflow-auth.db"

    def __enter__(self) -> LocalStack:
        logs = self.data / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        try:
            prefect = subprocess.Popen(
                prefect_command(self.host, self.prefect_port, self.prefect_allowed_hosts),
                env=self.prefect_env(),
                stdout=open(logs / "prefect.log", "ab"),
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )
            self.procs.append(prefect)
            mlflow = subprocess.Popen(
                self.mlflow_command(),
                env=self.mlflow_env(),
                stdout=open(logs / "mlflow.log", "ab"),
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )
            self.procs.append(mlflow)
            wait_healthy(f"{self.prefect_url}/api/health", 180, "Prefect server", prefect)
            wait_healthy(f"{self.mlflow_url}/health", 180, "MLflow server", mlflow)
        except BaseException:
            self.stop()
            raise
        return self

    def wait(self) -> None:
        try:
            while all(p.poll() is None for p in self.procs):
                time.sleep(1)
        except KeyboardInterrupt:
            pass

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM every server's process group; what is still up after one shared grace period is killed."""
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for p in self.procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
        self.procs.clear()

    def __exit__(self, *exc) -> None:
        self.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _exclusive(path: pathlib.Path) -> Iterator[None]:
    """An exclusive lock on `path` (flock: released when its holder ends, however it ends) while the block runs."""
    import fcntl

    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def temporary_prefect_server(data: pathlib.Path, startup_timeout_s: float = 300.0) -> Iterator[str]:
    """A Prefect server for one command (when PREFECT_API_URL names none): loopback, a free port, its own
    home under the data folder, analytics off, CSRF on, dying with this process however it ends (Prefect's
    own temporary server outlived a SIGKILLed sweep by 90 s). Sets PREFECT_API_URL while it runs; yields it."""
    port = _free_port()
    stack = LocalStack(pathlib.Path(data), "127.0.0.1", port)
    env = stack.prefect_env() | {"PREFECT_HOME": str(prefect_home(data, temporary=True))}
    logs = pathlib.Path(data) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    api = f"{stack.prefect_url}/api"
    previous = os.environ.get("PREFECT_API_URL")
    try:
        print(
            f"temporary Prefect server at {stack.prefect_url} (log: {logs / 'prefect-temporary.log'})", file=sys.stderr
        )
        # one server starts at a time on this home: two commands started together on a fresh data folder both ran
        # the database's migrations and the second server died (exit 3); the second now starts on a migrated home
        with _exclusive(pathlib.Path(data) / "prefect-temporary.lock"):
            proc = subprocess.Popen(
                prefect_command("127.0.0.1", port),
                env=env,
                stdout=open(logs / "prefect-temporary.log", "ab"),
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )
            stack.procs.append(proc)
            wait_healthy(f"{api}/health", startup_timeout_s, "temporary Prefect server", proc)
        os.environ["PREFECT_API_URL"] = api
        yield api
    finally:
        if previous is None:
            os.environ.pop("PREFECT_API_URL", None)
        else:
            os.environ["PREFECT_API_URL"] = previous
        stack.stop(grace_s=10)


class HostCheck:
    """WSGI middleware against DNS rebinding and cross-site requests, for a server that has no such check of its own
    (optuna-dashboard): a request is refused (403) unless its Host names this server (a loopback name, the bound
    address, or one of `allowed`), and a request that can change something (any method but GET, HEAD, OPTIONS) is
    refused unless its Origin, when sent, is this server's own."""

    SAFE = ("GET", "HEAD", "OPTIONS")

    def __init__(self, app, bound: str, allowed: tuple[str, ...] = ()):
        self.app = app
        self.hosts = {h.lower().strip("[]") for h in (*LOOPBACK, bound, *allowed)}

    def _host_name(self, host: str) -> str:
        host = host.strip().lower()
        if host.startswith("["):  # [::1]:8080
            return host[1 : host.find("]")] if "]" in host else host
        return host.rsplit(":", 1)[0] if host.count(":") == 1 else host

    def __call__(self, environ, start_response):
        host = environ.get("HTTP_HOST", "")
        origin = environ.get("HTTP_ORIGIN")
        why = None
        if self._host_name(host) not in self.hosts:
            why = f"Host {host!r} is not this server's (allowed: {', '.join(sorted(self.hosts))})"
        elif environ.get("REQUEST_METHOD", "GET") not in self.SAFE and origin is not None:
            own = {f"{scheme}://{host.lower()}" for scheme in ("http", "https")}
            if origin.lower() not in own:
                why = f"a {environ.get('REQUEST_METHOD')} from another origin ({origin!r})"
        if why is None:
            return self.app(environ, start_response)
        body = f"refused: {why}\n".encode()
        start_response(
            "403 Forbidden", [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))]
        )
        return [body]


def serve_wsgi(app, host: str, port: int, allowed_hosts: tuple[str, ...] = ()) -> None:
    """Serve `app` behind `HostCheck` on host:port until SIGINT or SIGTERM (wsgiref, as optuna-dashboard's own
    `run_server` does; its request log stays quiet). The server runs in a thread and the signal only sets an event:
    a KeyboardInterrupt raised inside a request is caught by wsgiref's error handler and the server went on serving."""
    import threading
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args) -> None:
            pass

    stop = threading.Event()
    with make_server(host, port, HostCheck(app, host, allowed_hosts), handler_class=Quiet) as server:
        serving = threading.Thread(target=server.serve_forever, name="wsgi", daemon=True)
        previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
        serving.start()
        try:
            while serving.is_alive() and not stop.wait(0.5):
                pass
        finally:
            server.shutdown()
            serving.join(timeout=30)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
