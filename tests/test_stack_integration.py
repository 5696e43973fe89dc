"""A real Prefect server and a real MLflow server on loopback: what they bind, refuse and outlive; `copc up`, `copc
dashboard`, `copc serve` and the temporary servers of commands. (A deployment triggered through Prefect's API, its runs
checked in MLflow and Optuna and its flow run in the UI: tests/test_prefect_browser.py.)"""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from infra.local_stack import LocalStack, ServerDownError, wait_healthy
from tests.conftest import cache_warm_start, tiny_config
from tests.stack_helpers import free_port, stack_env, start_dashboard, start_serve, start_up

pytestmark = pytest.mark.slow
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_prefect_refuses_cross_site_posts_and_its_ui_finds_its_api_on_any_port(tmp_path, used_stores):
    """CSRF protection on, CORS limited to the UI's own origin, /ui-settings pointing at this port; the
    servers die with the process that started them."""
    import urllib.error
    import urllib.request

    port = free_port()
    used_stores.prefect(tmp_path)
    with LocalStack(tmp_path, "127.0.0.1", port, free_port()) as stack:
        api = f"{stack.prefect_url}/api"
        with urllib.request.urlopen(f"{stack.prefect_url}/ui-settings", timeout=10) as r:
            assert json.loads(r.read())["api_url"] == api
        post = urllib.request.Request(
            f"{api}/flows/",
            data=json.dumps({"name": "x"}).encode(),
            method="POST",
            headers={"Content-Type": "application/json", "Origin": "http://evil.example"},
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(post, timeout=10)
        assert refused.value.code == 403
        assert refused.value.headers.get("access-control-allow-origin") in (None, stack.prefect_url)
        preflight = urllib.request.Request(
            f"{api}/flows/",
            method="OPTIONS",
            headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"},
        )
        try:
            with urllib.request.urlopen(preflight, timeout=10) as r:
                allowed = r.headers.get("access-control-allow-origin")
        except urllib.error.HTTPError as err:
            allowed = err.headers.get("access-control-allow-origin")
        assert allowed != "*" and allowed != "http://evil.example"
        # DNS rebinding: a page on evil.example resolving to 127.0.0.1 sends its own name as Host. Its CSRF token
        # request and its flow-run creation (Origin and Host the attacker's) answered 200 and 201; now refused
        import requests

        evil = {"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"}
        assert requests.get(f"{api}/csrf-token?client=x", headers=evil, timeout=30).status_code == 400
        assert requests.post(f"{api}/flows/", json={"name": "x"}, headers=evil, timeout=30).status_code == 400
        assert requests.get(f"{api}/health", headers={"Host": f"localhost:{port}"}, timeout=30).status_code == 200
        assert requests.get(f"{stack.prefect_url}/", timeout=30).status_code == 200  # the UI itself, on its own Host


def test_the_servers_die_with_the_process_that_started_them(tmp_path, used_stores):
    """`copc up` SIGKILLed: its Prefect and MLflow servers do not outlive it."""
    import signal

    pp, mp = free_port(), free_port()
    used_stores.prefect(tmp_path)
    proc = start_up(tmp_path, pp, mp)
    deadline = time.time() + 300
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line or "Ctrl-C" in line:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.time() + 60
    alive = [pp, mp]
    while alive and time.time() < deadline:
        alive = [p for p in alive if _listening(p)]
        time.sleep(1)
    assert not alive, f"still listening after the parent died: {alive}"


def test_a_server_that_is_down_gives_a_clear_error():
    port = free_port()
    with pytest.raises(ServerDownError, match=f"did not answer at http://127.0.0.1:{port}/health within 2 s"):
        wait_healthy(f"http://127.0.0.1:{port}/health", 2, "MLflow server")


def test_copc_up_prints_urls_binds_loopback_and_stops_cleanly_on_ctrl_c(tmp_path):
    """On a fresh data folder, as a new user's first `copc up` (its Prefect server migrates its database first; the
    other stack tests copy a used one in)."""
    import signal
    import urllib.request

    pp, mp = free_port(), free_port()
    proc = start_up(tmp_path, pp, mp)
    try:
        lines = []
        deadline = time.time() + 300
        while not any("Ctrl-C" in line for line in lines) and time.time() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
        text = "".join(lines)
        assert f"http://127.0.0.1:{pp}" in text and f"http://127.0.0.1:{mp}" in text, text
        for url in (f"http://127.0.0.1:{pp}/api/health", f"http://127.0.0.1:{mp}/health"):
            with urllib.request.urlopen(url, timeout=5) as r:
                assert r.status == 200
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=90) == 0
        for port in (pp, mp):
            with socket.socket() as s:
                assert s.connect_ex(("127.0.0.1", port)) != 0  # nothing listens any more
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_killed_sweep_takes_its_temporary_prefect_server_with_it(tmp_path, tiny_warm_state, used_stores):
    """Without PREFECT_API_URL a command starts a temporary Prefect server; SIGKILL on the command (alone,
    not its process group) ends the server too."""
    import re
    import signal

    base = tiny_config(steps=200)
    cache_warm_start(tmp_path / "cache", base, tiny_warm_state)
    used_stores.prefect(tmp_path, temporary=True)
    (tmp_path / "base.json").write_text(base.model_dump_json())
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"} | {"COPC_DATA_DIR": str(tmp_path)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "flows.cli",
            "sweep",
            "--name",
            "k",
            "--config",
            str(tmp_path / "base.json"),
            "--steps",
            "200",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = None
    deadline = time.time() + 300
    while time.time() < deadline and url is None:
        line = proc.stderr.readline()
        found = re.search(r"temporary Prefect server at (http://127\.0\.0\.1:(\d+))", line)
        if found:
            url, port = found.group(1), int(found.group(2))
    assert url, "no temporary server announced"
    wait_healthy(f"{url}/api/health", 300, "temporary Prefect server")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.time() + 30
    while _listening(port) and time.time() < deadline:
        time.sleep(0.5)
    assert not _listening(port), "the temporary Prefect server outlived its command"


def test_copc_dashboard_serves_the_sweeps_studies_on_loopback_and_stops_on_sigterm(tmp_path):
    """optuna-dashboard over the data folder's storage: the study and its trials' user attributes are
    served on 127.0.0.1; SIGTERM stops it cleanly (as `copc dashboard &` is stopped)."""
    import signal
    import urllib.request

    from copc_core.results import TrialResult
    from sweeps.space import SweepSpace
    from sweeps.study import open_study, pending_points, run_study
    from tests.test_sweeps import summary

    space = SweepSpace(methods=["tis"], staleness=[0], seeds=[0], steps=2)
    sweep = open_study("dash", f"sqlite:///{tmp_path / 'optuna.db'}")
    run_study(
        sweep,
        pending_points(sweep, space),
        lambda ps, on_result: on_result(0, TrialResult(summary(0.625), objective=0.625)),
    )
    port = free_port()
    proc = start_dashboard(tmp_path, port)
    try:
        deadline = time.time() + 120
        while not _listening(port):
            assert proc.poll() is None and time.time() < deadline, proc.stderr.read() if proc.poll() is not None else ""
            time.sleep(0.3)
        studies = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=30).read())
        (study,) = studies["study_summaries"]
        assert study["study_name"] == "dash"
        detail = json.loads(
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies/{study['study_id']}", timeout=30).read()
        )
        (trial,) = detail["trials"]
        attrs = {a["key"]: a["value"] for a in trial["user_attrs"]}
        assert trial["values"] == [0.625] and attrs["final_accuracy"] == "0.625" and attrs["method"] == "tis"
        with socket.socket() as s:  # loopback only
            s.settimeout(2)
            other = socket.gethostbyname(socket.gethostname())
            assert other.startswith("127.") or s.connect_ex((other, port)) != 0
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            raise AssertionError("the dashboard did not stop on SIGTERM: " + err[-3000:]) from None
    assert proc.returncode == 0 and "Traceback" not in err, err[-2000:]


def test_copc_dashboard_without_a_storage_exits_2(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "flows.cli", "dashboard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=dict(os.environ, COPC_DATA_DIR=str(tmp_path)),
        timeout=120,
    )
    assert out.returncode == 2 and "run a sweep first" in out.stderr and not (tmp_path / "optuna.db").exists()


def test_copc_serve_stops_promptly_on_sigterm_when_its_prefect_server_has_gone(tmp_path, used_stores):
    """Prefect's own shutdown of `serve` retries the API for over a minute and ends in a traceback when
    the server is gone; `copc serve` checks the API first and exits at once, saying why."""
    import signal

    log = tmp_path / "serve.log"
    used_stores.prefect(tmp_path)
    with LocalStack(tmp_path, "127.0.0.1", free_port(), free_port()) as stack:
        server = start_serve(stack_env(stack, tmp_path), log)
        assert "copc-sweep/embedded-default" in log.read_text(), log.read_text()[-3000:]
        time.sleep(5)  # the runner is up and polling
    # the stack is down now: the API does not answer
    before = len(log.read_text())
    start = time.monotonic()
    server.send_signal(signal.SIGTERM)
    try:
        rc = server.wait(timeout=30)
    finally:
        server.kill()
    assert time.monotonic() - start < 30 and rc == 0, log.read_text()[-3000:]
    after = log.read_text()[before:]  # (Prefect logs its own errors while serving, once the server is gone)
    assert "the Prefect server is gone; stopped without telling it" in after, after[-3000:]
    assert "ConnectError" not in after, after[-3000:]


def test_mlflow_basic_auth_starts_keeps_its_users_in_the_data_folder_and_refuses_anonymous_clients(tmp_path):
    """`copc up --mlflow-basic-auth` crashed (MLflow's auth app needs Flask-WTF; its user store is `basic_auth.db` in
    the working directory; it needs an admin password on first start). Started as `copc up` starts it: anonymous
    requests get 401, the admin's get 200, the users live in the data folder, nothing lands in the working directory;
    without a password the command exits 2 saying what to set."""
    import requests

    data, cwd = tmp_path / "data", tmp_path / "cwd"
    data.mkdir(), cwd.mkdir()
    env = dict(os.environ, COPC_DATA_DIR=str(data), MLFLOW_AUTH_ADMIN_PASSWORD="s3cret-Passw0rd!")
    no_password = subprocess.run(
        [sys.executable, "-m", "flows.cli", "up", "--mlflow-basic-auth"],
        cwd=ROOT,
        env={k: v for k, v in env.items() if k != "MLFLOW_AUTH_ADMIN_PASSWORD"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert no_password.returncode == 2 and "MLFLOW_AUTH_ADMIN_PASSWORD" in no_password.stderr
    assert "Traceback" not in no_password.stderr
    stack = LocalStack(data, "127.0.0.1", free_port(), free_port(), mlflow_basic_auth=True)
    proc = subprocess.Popen(
        stack.mlflow_command(),
        cwd=cwd,
        env=stack.mlflow_env() | env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_healthy(f"{stack.mlflow_url}/health", 180, "MLflow server", proc)
        api = f"{stack.mlflow_url}/api/2.0/mlflow/experiments/search?max_results=1"
        assert requests.get(api, timeout=30).status_code == 401
        assert requests.get(api, auth=("admin", "wrong"), timeout=30).status_code == 401
        assert requests.get(api, auth=("admin", "s3cret-Passw0rd!"), timeout=30).status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert stack.auth_store().exists() and list(cwd.iterdir()) == []
    assert (data / "mlflow-secret-key").stat().st_mode & 0o777 == 0o600  # the CSRF secret, the owner's only


def test_copc_dashboard_refuses_another_host_and_a_cross_site_change(tmp_path):
    """DNS rebinding: a page on evil.example that resolves to 127.0.0.1 deleted a study through `copc dashboard` (204).
    Requests naming another Host are refused, and so are changes from another origin; the study survives, and the
    dashboard's own page (loopback Host, its own origin) still works."""
    import requests

    from sweeps.study import open_study

    open_study("keep", f"sqlite:///{tmp_path / 'optuna.db'}")
    port = free_port()
    proc = start_dashboard(tmp_path, port)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while not _listening(port):
            assert proc.poll() is None and time.time() < deadline
            time.sleep(0.3)
        evil = {"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"}
        assert requests.delete(f"{base}/api/studies/1", headers=evil, timeout=30).status_code == 403
        assert (
            requests.get(f"{base}/api/studies", headers={"Host": f"evil.example:{port}"}, timeout=30).status_code == 403
        )
        cross = {"Origin": "http://evil.example"}  # the right Host, a change sent from another site
        assert requests.delete(f"{base}/api/studies/1", headers=cross, timeout=30).status_code == 403
        assert (
            requests.post(
                f"{base}/api/studies", json={"study_name": "x", "directions": ["maximize"]}, headers=cross, timeout=30
            ).status_code
            == 403
        )
        (study,) = requests.get(f"{base}/api/studies", timeout=30).json()["study_summaries"]
        assert study["study_name"] == "keep"
        for host in (f"localhost:{port}", f"[::1]:{port}", f"127.0.0.1:{port}"):
            assert requests.get(f"{base}/api/studies", headers={"Host": host}, timeout=30).status_code == 200
        own = {"Origin": base}  # the dashboard's own page renaming nothing, deleting its study: allowed
        assert requests.delete(f"{base}/api/studies/1", headers=own, timeout=30).status_code == 204
    finally:
        proc.terminate()
        proc.communicate(timeout=60)


def test_two_commands_on_a_fresh_data_folder_both_get_a_temporary_prefect_server(tmp_path):
    """Two `copc sweep` started 3 s apart on a fresh data folder: the second died, "temporary Prefect server exited
    with code 3" (both migrated the shared Prefect home at once). Started together, both servers now come up."""
    code = (
        "import sys; from infra.local_stack import temporary_prefect_server\n"
        "with temporary_prefect_server(sys.argv[1]) as api: print('up', api)"
    )
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    results = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0 and out.startswith("up http://127.0.0.1:"), err[-2000:]
