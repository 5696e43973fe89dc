"""Shared by the tests that run real servers: free loopback ports and `copc serve` against a stack."""

import contextlib
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class UsedStores:
    """A Prefect database and an MLflow store as a data folder holds them once it has been used (a real Prefect
    server started on it and stopped; a real MLflow client opened it): migrated, with nothing of a run. On a fresh
    folder the first Prefect server runs 116 migrations (~4 of its ~9 CPU-s to start) and the first MLflow client
    MLflow's (~1.4 CPU-s); the tests made ~40 fresh stores a run. A test that is not about a fresh data folder copies
    these in place first (the `used_stores` fixture). Each is made once a run, when first asked for, under `root`,
    which pytest-xdist's workers share (a file lock); a failed making is never taken for a made one."""

    def __init__(self, root: pathlib.Path):
        self.root = root

    def _made(self, kind: str, make) -> pathlib.Path:
        from filelock import FileLock

        made = self.root / kind
        self.root.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.root / f"{kind}.lock")):
            if not made.exists():
                partial = self.root / f"{kind}.partial"
                shutil.rmtree(partial, ignore_errors=True)  # what a failed making left
                partial.mkdir()
                make(partial)
                os.replace(partial, made)
        return made

    def prefect(self, data: pathlib.Path, temporary: bool = False) -> None:
        """A used Prefect database in data folder `data`: for `copc up`'s server, or with `temporary` for a command's
        own (`infra.local_stack.prefect_home`). Prefect's memo of its block types is not copied: it holds the
        database's path, so a copy elsewhere registers them again (~1.5 CPU-s)."""
        from infra.local_stack import prefect_home, temporary_prefect_server

        def make(made: pathlib.Path) -> None:
            with temporary_prefect_server(made):
                pass

        used = prefect_home(self._made("prefect", make), temporary=True)
        home = prefect_home(data, temporary)
        home.mkdir(parents=True, exist_ok=True)
        _copy_sqlite(used / "prefect.db", home / "prefect.db")

    def mlflow(self, db: pathlib.Path) -> str:
        """A used MLflow store at `db`; its tracking URI."""
        from mlflow.tracking import MlflowClient

        def make(made: pathlib.Path) -> None:
            MlflowClient(f"sqlite:///{made / 'mlflow.db'}").search_experiments()

        db.parent.mkdir(parents=True, exist_ok=True)
        _copy_sqlite(self._made("mlflow", make) / "mlflow.db", db)
        return f"sqlite:///{db}"


def _copy_sqlite(src: pathlib.Path, dest: pathlib.Path) -> None:
    """`src` copied whole to the new file `dest` by SQLite itself (its write-ahead log included); a missing `src`
    fails (opened read-only, SQLite would not make an empty one)."""
    import sqlite3

    assert not dest.exists(), dest
    with (
        contextlib.closing(sqlite3.connect(f"file:{src}?mode=ro", uri=True)) as a,
        contextlib.closing(sqlite3.connect(dest)) as b,
    ):
        a.backup(b)


def stack_env(stack, data: pathlib.Path, **extra: str) -> dict[str, str]:
    """The environment of a process that uses `stack` (a LocalStack) with `data` as its data folder."""
    return dict(
        os.environ,
        PREFECT_API_URL=f"{stack.prefect_url}/api",
        COPC_DATA_DIR=str(data),
        PREFECT_HOME=str(data / "prefect-client"),
        **extra,
    )


def start_serve(env: dict[str, str], log: pathlib.Path, wait: bool = True) -> subprocess.Popen:
    """`copc serve` in the background, its output in `log`; with `wait`, until it says it serves."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "serve"],
        cwd=ROOT,
        env=env,
        stdout=open(log, "wb"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 180
    while wait and "copc serve: serving" not in log.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(1)
    return proc


def start_up(data: pathlib.Path, prefect_port: int, mlflow_port: int) -> subprocess.Popen:
    """`copc up` on the given loopback ports, its output readable line by line from `stdout`."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "flows.cli",
            "up",
            "--prefect-port",
            str(prefect_port),
            "--mlflow-port",
            str(mlflow_port),
        ],
        cwd=ROOT,
        env=dict(os.environ, COPC_DATA_DIR=str(data)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def mlflow_server(data: pathlib.Path):
    """A real MLflow server on a free loopback port over `data`'s SQLite store, with `copc up`'s command and
    environment (without it, MLflow 3.17 starts its 7 job consumers: ~23 CPU-s a server): a context manager yielding
    its URL."""
    from infra.local_stack import LocalStack, wait_healthy

    @contextlib.contextmanager
    def serve():
        stack = LocalStack(data, "127.0.0.1", free_port(), free_port())
        log = open(data / "mlflow-server.log", "ab")
        proc = subprocess.Popen(stack.mlflow_command(), env=stack.mlflow_env(), stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_healthy(f"{stack.mlflow_url}/health", 180, "MLflow server", proc)
            yield stack.mlflow_url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            log.close()

    return serve()


def start_dashboard(data: pathlib.Path, port: int) -> subprocess.Popen:
    """`copc dashboard` over `data`'s Optuna storage on a loopback port (its output on pipes, as text)."""
    return subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "dashboard", "--port", str(port)],
        cwd=ROOT,
        env=dict(os.environ, COPC_DATA_DIR=str(data)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
