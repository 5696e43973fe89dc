"""Shared by the tests that run real servers: free loopback ports and `copc serve` against a stack."""

import os
import pathlib
import socket
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    """A real MLflow server on a free loopback port over `data`'s SQLite store (as `copc up` starts it): a context
    manager yielding its URL."""
    import contextlib

    from infra.local_stack import LocalStack, wait_healthy

    @contextlib.contextmanager
    def serve():
        stack = LocalStack(data, "127.0.0.1", free_port(), free_port())
        log = open(data / "mlflow-server.log", "ab")
        proc = subprocess.Popen(stack.mlflow_command(), stdout=log, stderr=subprocess.STDOUT)
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
