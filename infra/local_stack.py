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
    ):
        self.data = pathlib.Path(data)
        self.host, self.prefect_port, self.mlflow_port = host, prefect_port, mlflow_port
        self.prefect_url = f"http://{host}:{prefect_port}"
        self.mlflow_url = f"http://{host}:{mlflow_port}"
        self.prefect_auth = prefect_auth
        self.mlflow_allowed_hosts, self.mlflow_cors_origins = mlflow_allowed_hosts, mlflow_cors_origins
        self.mlflow_basic_auth = mlflow_basic_auth
        self.procs: list[subprocess.Popen] = []

    def prefect_env(self) -> dict[str, str]:
        env = dict(
            os.environ,
            PREFECT_HOME=str(self.data / "prefect"),
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

    def __enter__(self) -> LocalStack:
        logs = self.data / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        try:
            prefect = subprocess.Popen(
                [_bin("prefect"), "server", "start", "--host", self.host, "--port", str(self.prefect_port)],
                env=self.prefect_env(),
                stdout=open(logs / "prefect.log", "ab"),
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )
            self.procs.append(prefect)
            mlflow = subprocess.Popen(
                self.mlflow_command(),
                # MLflow 3.17 starts job consumers for GenAI scorers by default: 7 processes, ~2.3 GB, none used here
                env=os.environ | {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
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
def temporary_prefect_server(data: pathlib.Path, startup_timeout_s: float = 300.0) -> Iterator[str]:
    """A Prefect server for one command (when PREFECT_API_URL names none): loopback, a free port, its own
    home under the data folder, analytics off, CSRF on, dying with this process however it ends (Prefect's
    own temporary server outlived a SIGKILLed sweep by 90 s). Sets PREFECT_API_URL while it runs; yields it."""
    port = _free_port()
    stack = LocalStack(pathlib.Path(data), "127.0.0.1", port)
    env = stack.prefect_env() | {"PREFECT_HOME": str(pathlib.Path(data) / "prefect-temporary")}
    logs = pathlib.Path(data) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [_bin("prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=open(logs / "prefect-temporary.log", "ab"),
        stderr=subprocess.STDOUT,
        preexec_fn=_die_with_parent,
    )
    stack.procs.append(proc)
    api = f"{stack.prefect_url}/api"
    previous = os.environ.get("PREFECT_API_URL")
    try:
        print(
            f"temporary Prefect server at {stack.prefect_url} (log: {logs / 'prefect-temporary.log'})", file=sys.stderr
        )
        wait_healthy(f"{api}/health", startup_timeout_s, "temporary Prefect server", proc)
        os.environ["PREFECT_API_URL"] = api
        yield api
    finally:
        if previous is None:
            os.environ.pop("PREFECT_API_URL", None)
        else:
            os.environ["PREFECT_API_URL"] = previous
        stack.stop(grace_s=10)
