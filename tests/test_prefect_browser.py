"""The Prefect UI as a person sees it: `copc up` and `copc serve`, the deployments' forms and a triggered sweep's
flow run, opened in headless Chromium."""

import json
import pathlib
import subprocess
import sys
import urllib.request

import pytest

from infra.local_stack import LocalStack
from tests.browser import page_text, require_chromium, screenshot, wait_for
from tests.stack_helpers import ROOT, free_port, stack_env, start_serve

require_chromium()
pytestmark = pytest.mark.slow


def _deployment_id(stack, name: str) -> str:
    with urllib.request.urlopen(f"{stack.prefect_url}/api/deployments/name/{name}", timeout=30) as response:
        return json.loads(response.read())["id"]


def _form(browser, stack, name: str, ready: str) -> tuple[str, int]:
    """The custom-run form of deployment `name`: its text and its height in pixels."""
    browser.get(f"{stack.prefect_url}/deployments/deployment/{_deployment_id(stack, name)}/run")
    text = wait_for(browser, lambda d: ready in page_text(d) and page_text(d), 90, f"the form of {name}")
    return text, browser.execute_script("return document.querySelector('form').scrollHeight")


def _sweep_params(name: str, data: pathlib.Path, **axes) -> dict:
    from tests.conftest import tiny_config

    return {"params": {"name": name, "base": tiny_config().model_dump(mode="json"), "data_dir": str(data), **axes}}


# What a caller of Prefect's API (as the UI's Submit) gets from `copc serve`: a three-trial sweep from a whole space
# with what the UI shows of its flow run (log lines, task nodes and their times, artifacts), a one-trial sweep from the
# form's short fields, then a report asked to write outside the data folder.
TRIGGER = """
import json, sys
from prefect.client.orchestration import get_client
from prefect.client.schemas import filters as F
from prefect.deployments import run_deployment

form, space, evil_out = (json.loads(a) for a in sys.argv[1:])
def tasks_of(c, run):
    return c.read_task_runs(flow_run_filter=F.FlowRunFilter(id=F.FlowRunFilterId(any_=[run.id])))
with get_client(sync_client=True) as c:
    run = run_deployment("copc-sweep/embedded-default", timeout=600, parameters=space)
    print("SPACE_RUN", json.dumps([str(run.id), run.state.type.value]))
    logs = c.read_logs(log_filter=F.LogFilter(flow_run_id=F.LogFilterFlowRunId(any_=[run.id])))
    arts = c.read_artifacts(artifact_filter=F.ArtifactFilter(flow_run_id=F.ArtifactFilterFlowRunId(any_=[run.id])))
    tasks = tasks_of(c, run)
    ui = run_deployment("copc-sweep/embedded-default", timeout=600, parameters=form)
    ui_trials = sorted(t.name for t in tasks_of(c, ui) if t.task_key.startswith("trial"))
    print("FORM_RUN", json.dumps([ui.state.type.value, ui_trials, str(ui.id)]))
print("TRIAL_LINES", sum(l.message.startswith("trial ") for l in logs))
print("TRIAL_NODES", json.dumps(sorted([t.name, t.state.type.value] for t in tasks if t.task_key.startswith("trial"))))
times = [(t.name, t.start_time.timestamp(), t.end_time.timestamp()) for t in tasks if t.end_time]
print("NODE_TIMES", json.dumps(dict((n, [a, b]) for n, a, b in times)))
print("PROGRESS", json.dumps([a.data for a in arts if a.key == "warm-start"]))
sweep_arts = sorted((a for a in arts if a.key == "copc-sweep"), key=lambda a: a.created)
print("ARTIFACT", json.dumps([a.data for a in sweep_arts]))
print("ARTIFACT_RUNS", json.dumps([str(a.flow_run_id) == str(run.id) for a in sweep_arts]))
evil = run_deployment("copc-report/report", timeout=300, parameters={"params": {"sweeps": ["it"], "out": evil_out}})
print("EVIL", evil.state.type.value)
"""


def _printed(out: str, key: str):
    return json.loads(out.split(f"{key} ")[1].splitlines()[0])


def _trigger_sweeps(env: dict[str, str], data: pathlib.Path, serve_log: pathlib.Path) -> tuple[str, str]:
    """TRIGGER's two sweeps and the report; checks what Prefect's API shows of them, returns the two sweeps' run
    ids (the whole space's, the form's)."""
    form = _sweep_params(
        "ui", data, methods="copc[behavior]", tau_policy=[2.0], tau_advantage=[1.0], staleness=[1], seeds=[0], steps=2
    )  # a reading the preset does not spell: its flow run says so in its log
    space = _sweep_params(
        "it",
        data,
        space={
            "methods": [{"name": "copc", "tau_policy": [2.0], "tau_advantage": [1.0, 2.0]}, {"name": "tis"}],
            "staleness": [1],
            "seeds": [0],
            "steps": 2,
        },
    )
    evil = str(data.parent / "evil" / "x.sh")
    out = subprocess.run(
        [sys.executable, "-c", TRIGGER, *(json.dumps(x) for x in (form, space, evil))],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-3000:] + serve_log.read_text()[-3000:]
    run_id, state = _printed(out.stdout, "SPACE_RUN")
    assert state == "COMPLETED", serve_log.read_text()[-5000:]
    assert "TRIAL_LINES 3" in out.stdout  # a log line per trial in the flow run, as it ends
    # and a node per trial in the flow run's graph, named by its point
    nodes = _printed(out.stdout, "TRIAL_NODES")
    assert [state for _, state in nodes] == ["COMPLETED"] * 3, nodes
    assert sorted(name.split()[0] for name, _ in nodes) == ["copc", "copc", "tis"], nodes
    # the warm start is a node of its own with a progress artifact
    times = _printed(out.stdout, "NODE_TIMES")
    assert "warm start (SFT)" in times, times
    assert _printed(out.stdout, "PROGRESS") == [100.0]
    # the artifact says where to watch the sweep as it starts, then holds its table; both are the flow run's
    running, artifact = _printed(out.stdout, "ARTIFACT")
    assert "(running)" in running and "viewStateShareKey=" in running, running
    assert _printed(out.stdout, "ARTIFACT_RUNS") == [True, True]
    assert "| copc | 2.000 | 1.000 | 1 | 1 |" in artifact and "| tis | — | — | 1 | 1 |" in artifact
    assert artifact.count("](http://127.0.0.1:") >= 4  # the parent run and the three trials, as links
    # the form's short fields, as the UI's Submit sends them: one trial
    state, trials, form_run = _printed(out.stdout, "FORM_RUN")
    assert [state, trials] == ["COMPLETED", ["copc[behavior] tp=2 ta=1 k=1 s=0"]], out.stdout[-2000:]
    # a caller of the API may not choose where files are written
    assert "EVIL FAILED" in out.stdout and not (data.parent / "evil").exists()
    assert "must lie inside the data folder" in serve_log.read_text()
    _check_mlflow_and_optuna(env["MLFLOW_TRACKING_URI"], data, times)
    return run_id, form_run


def _check_mlflow_and_optuna(mlflow_url: str, data: pathlib.Path, times: dict[str, list[float]]) -> None:
    """The space's sweep's runs in MLflow, under their parent, and its trials in Optuna, each naming its run; each
    trial's node in Prefect runs from the trial's start (its MLflow run's start) to its end, not drawn after it."""
    import optuna
    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_url)
    exp = client.get_experiment_by_name("copc")
    parent = client.search_runs([exp.experiment_id], "tags.copc_sweep = 'it' and tags.copc_kind = 'sweep'")
    children = client.search_runs([exp.experiment_id], "tags.copc_sweep = 'it' and tags.copc_kind = 'trial'")
    assert len(parent) == 1 and len(children) == 3
    assert sorted(c.data.tags["method"] for c in children) == ["copc", "copc", "tis"]
    assert all(c.data.tags["mlflow.parentRunId"] == parent[0].info.run_id for c in children)
    assert all("summary/final_accuracy" in c.data.metrics for c in children)
    study = optuna.load_study(study_name="it", storage=f"sqlite:///{data / 'optuna.db'}")
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 3
    assert sorted(t.user_attrs["method"] for t in study.trials) == ["copc", "copc", "tis"]
    assert {t.user_attrs["mlflow_run_id"] for t in study.trials} == {c.info.run_id for c in children}
    for c in children:
        start, end = times[c.info.run_name]
        assert abs(start - c.info.start_time / 1000) < 5 and end >= c.info.end_time / 1000 - 1, (times, c.info)


def _check_forms(browser, stack, tmp_path) -> None:
    """The copc-sweep form was ~11,450 px tall (the whole base RunConfig, HF and vLLM knobs included, `max_parallel`
    at the bottom) and four deployments were all named `embedded`."""
    browser.get(f"{stack.prefect_url}/deployments")
    text = wait_for(browser, lambda d: "embedded-default" in page_text(d) and page_text(d), 90)
    for name in ("train", "embedded-default", "regime-search", "report", "bias-variance"):
        assert name in text.split(), text[:3000]
    assert "embedded" not in text.split(), text[:3000]
    screenshot(browser, "prefect-deployments.png", tmp_path)
    # copc-train: a preset, overrides and the runtime; no nested RunConfig field until asked for
    text, height = _form(browser, stack, "copc-train/train", "Runtime")
    assert "Preset" in text and "Overrides" in text and "Critic Lr Scale" not in text, text[:3000]
    screenshot(browser, "prefect-train-form.png", tmp_path)
    # copc-sweep: a preset, the axes, dotted overrides, the trials at once; the whole space and base config one
    # optional field away, not laid out
    text, height = _form(browser, stack, "copc-sweep/embedded-default", "Max Parallel")
    fields = ["Preset", "Methods", "Tau Policy", "Tau Advantage", "Staleness", "Seeds", "Max Parallel", "Base"]
    at = [text.index(f) for f in fields]
    assert at == sorted(at), at  # the short fields first, the whole config last
    for nested in ("Critic Lr Scale", "Vllm", "Hf Model", "Minibatches"):
        assert nested not in text, nested
    assert height < 3000, height  # it was ~11,450 px
    screenshot(browser, "prefect-sweep-form.png", tmp_path)


def test_deployments_served_by_copc_serve_in_the_prefect_ui_and_through_its_api(browser, tmp_path, used_stores):
    """`copc up` and `copc serve` on ports other than Prefect's 4200, as a person and as a caller of the API meet
    them: the UI finds its own API (it said "Can't connect to Server API at http://127.0.0.1:4200/api" until `copc up`
    pointed it there); short forms and deployment names a person tells apart; sweeps triggered through the API run
    (the form's short fields and a whole space), their trials tracked in MLflow and Optuna; a triggered sweep's run
    graph shows its warm start and each trial as nodes (it read "has not yet generated any task or subflow runs"
    through its warm start, and trials appeared only after they ended). One stack and one `copc serve` for all of it:
    each costs ~15 CPU-s to start."""
    used_stores.prefect(tmp_path)
    with LocalStack(tmp_path, "127.0.0.1", free_port(), free_port()) as stack:
        assert not stack.prefect_url.endswith(":4200")
        browser.get(stack.prefect_url + "/dashboard")
        text = wait_for(
            browser,
            lambda d: ("Can't connect" in page_text(d) or "Deployments" in page_text(d)) and page_text(d),
            90,
            "the dashboard",
        )
        at = text.find("Can't connect")
        assert at < 0, text[max(0, at - 300) : at + 300]
        assert "Runs" in text and "Deployments" in text, text[:2000]
        screenshot(browser, "prefect-ui.png", tmp_path)
        env = stack_env(stack, tmp_path, MLFLOW_TRACKING_URI=stack.mlflow_url)
        serve = start_serve(env, tmp_path / "serve.log")
        try:
            _check_forms(browser, stack, tmp_path)
            run, form_run = _trigger_sweeps(env, tmp_path, tmp_path / "serve.log")
            browser.get(f"{stack.prefect_url}/runs/flow-run/{run}")
            wait_for(browser, lambda d: "Task Runs" in page_text(d), 60, "the flow run")
            screenshot(browser, "prefect-sweep-run.png", tmp_path)
            browser.execute_script(
                "Array.from(document.querySelectorAll('button, [role=tab], a, li'))"
                ".find(e => e.innerText.trim().startsWith('Task Runs')).click()"
            )
            text = wait_for(
                browser, lambda d: "copc tp=2 ta=1 k=1 s=0" in page_text(d) and page_text(d), 60, "the task runs"
            )
            for node in ("warm start (SFT)", "copc tp=2 ta=2 k=1 s=0", "tis k=1 s=0"):
                assert node in text, (node, text[:3000])
            # the form's run says in its log that `copc[behavior]` is not the preset's `copc` (the logs tab first)
            browser.get(f"{stack.prefect_url}/runs/flow-run/{form_run}")
            notice = "methods: copc[behavior] is not an entry of this sweep (it has copc)"
            text = wait_for(browser, lambda d: notice in page_text(d) and page_text(d), 60, "the form run's log")
            assert text[: text.index(notice)].rstrip().endswith("WARNING"), text[:3000]  # its level's badge
            screenshot(browser, "prefect-form-run-notice.png", tmp_path)
        finally:
            serve.terminate()
            serve.wait(timeout=60)
