"""The local stack: a Prefect server and an MLflow server on loopback, started and stopped cleanly."""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time
import urllib.request


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
        checks.append((tracking_uri.rstrip("/") + "/health", "MLflow tracking server",
                       "start it (`copc up`) or point --tracking-uri / MLFLOW_TRACKING_URI elsewhere"))
    api = os.environ.get("PREFECT_API_URL") if prefect else None
    if api:
        checks.append((api.rstrip("/") + "/health", "Prefect API (PREFECT_API_URL)",
                       "start it (`copc up`) or unset PREFECT_API_URL to use a temporary local server"))
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


class LocalStack:
    def __init__(self, data: pathlib.Path, host: str = "127.0.0.1", prefect_port: int = 4200, mlflow_port: int = 5000):
        self.data = pathlib.Path(data)
        self.host, self.prefect_port, self.mlflow_port = host, prefect_port, mlflow_port
        self.prefect_url = f"http://{host}:{prefect_port}"
        self.mlflow_url = f"http://{host}:{mlflow_port}"
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> LocalStack:
        logs = self.data / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PREFECT_HOME=str(self.data / "prefect"), PREFECT_SERVER_ANALYTICS_ENABLED="false")
        try:
            prefect = subprocess.Popen([_bin("prefect"), "server", "start", "--host", self.host, "--port",
                                        str(self.prefect_port)], env=env, stdout=open(logs / "prefect.log", "ab"),
                                       stderr=subprocess.STDOUT, start_new_session=True)
            self.procs.append(prefect)
            mlflow = subprocess.Popen([_bin("mlflow"), "server", "--host", self.host, "--port", str(self.mlflow_port),
                                       "--backend-store-uri", f"sqlite:///{self.data / 'mlflow.db'}",
                                       "--default-artifact-root", str(self.data / "mlartifacts"), "--workers", "1"],
                                      stdout=open(logs / "mlflow.log", "ab"), stderr=subprocess.STDOUT,
                                      start_new_session=True)
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
