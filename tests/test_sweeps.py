"""Sweeps on a real Optuna SQLite storage and a real MLflow SQLite store (no mocks)."""

import math
import pathlib

import optuna
import pytest
from mlflow.tracking import MlflowClient
from pydantic import ValidationError

from sweeps.space import SweepSpace, objective_value
from sweeps.study import FAIL_REASON, open_study, pending_points, run_study
from tests.conftest import tiny_config

pytestmark = pytest.mark.slow


def tiny_space(**kw):
    return SweepSpace(**({"tau_policy": [2.0], "tau_advantage": [1.0, 2.0], "staleness": [0, 1], "seeds": [0],
                          "steps": 2} | kw))


def test_space_grid_and_configs():
    space = tiny_space()
    assert len(space.grid()) == 4
    cfg = space.run_config(tiny_config(), {"tau_policy": 2.0, "tau_advantage": 1.0, "staleness": 1, "seed": 3})
    assert cfg.method.tau_advantage == 1.0 and cfg.train.staleness == 1 and cfg.train.seed == 3 and cfg.train.steps == 2


@pytest.mark.parametrize("bad", [{"tau_policy": [0.5]}, {"tau_advantage": [math.nan]}, {"staleness": [-1]},
                                 {"method": "tis"}, {"method": "nope"}, {"seeds": []}])
def test_invalid_spaces_are_refused(bad):
    with pytest.raises(ValidationError):
        tiny_space(**bad)


def test_objective():
    s = {"final_accuracy": 0.8, "peak_accuracy": 0.9, "auc_accuracy": 0.7, "collapsed": False}
    assert objective_value(s, "final", 0.5) == 0.8 and objective_value(s, "auc", 0.5) == 0.7
    assert objective_value({**s, "collapsed": True}, "peak", 0.5) == pytest.approx(0.4)


def test_failed_trials_are_fail_with_reason_and_interrupted_ones_rerun(tmp_path):
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    space = tiny_space()
    study = open_study("s", storage, space)

    def half_fail(params_list, on_result):
        for i, p in enumerate(params_list):
            on_result(i, RuntimeError("worker exploded") if p["staleness"] == 1 else
                      {"summary": {"final_accuracy": 0.5, "peak_accuracy": 0.5, "auc_accuracy": 0.5, "collapsed": False}})

    run_study(study, space, pending_points(study, space), half_fail)
    states = [t.state for t in study.trials]
    assert states.count(optuna.trial.TrialState.COMPLETE) == 2 and states.count(optuna.trial.TrialState.FAIL) == 2
    assert all("worker exploded" in t.user_attrs[FAIL_REASON] for t in study.trials if t.state.name == "FAIL")
    # a sweep killed mid-trial leaves RUNNING trials: they are marked FAIL and their points rerun
    study.enqueue_trial({"tau_policy": 2.0, "tau_advantage": 1.0, "staleness": 1, "seed": 0})
    study.ask({k: optuna.distributions.CategoricalDistribution(v) for k, v in space.search_space().items()})
    again = open_study("s", storage, space)
    pending = pending_points(again, space)
    assert sorted(p["tau_advantage"] for p in pending) == [1.0, 2.0] and all(p["staleness"] == 1 for p in pending)
    assert any(t.user_attrs.get(FAIL_REASON, "").startswith("interrupted") for t in again.trials)


def test_sweep_end_to_end_tracks_runs_and_resume_skips_finished_trials(tmp_path, tiny_warm_state):
    from flows.sweep_job import run_sweep
    from infra.checkpoints import save_checkpoint
    from copc_core.warmstart import warm_start_key

    base = tiny_config()
    save_checkpoint(tmp_path / "cache" / f"warmstart-{warm_start_key(base)}.pt", tiny_warm_state)
    space = tiny_space()
    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first = run_sweep(space, "t", base, tmp_path, tracking=tracking)
    assert len([o for o in first["outcomes"] if o["state"] == "COMPLETE"]) == 4
    client = MlflowClient(tracking)
    exp = client.get_experiment_by_name("copc")
    children = client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{first['parent_run_id']}'")
    assert len(children) == 4
    run = children[0]
    assert run.data.params["method.name"] == "copc" and "train.staleness" in run.data.params
    assert run.data.tags["config_hash"] and "summary/final_accuracy" in run.data.metrics
    ess = client.get_metric_history(run.info.run_id, "correction/ess")
    assert [m.step for m in sorted(ess, key=lambda m: m.step)] == [1, 2]
    assert "config.json" in [a.path for a in client.list_artifacts(run.info.run_id)]
    study = optuna.load_study(study_name="t", storage=first["storage"])
    assert {t.user_attrs["mlflow_run_id"] for t in study.trials} == {r.info.run_id for r in children}
    second = run_sweep(space, "t", base, tmp_path, tracking=tracking)
    assert second["outcomes"] == [] and second["parent_run_id"] == first["parent_run_id"]
    assert len(optuna.load_study(study_name="t", storage=first["storage"]).trials) == 4

    # the report reads these real runs back from MLflow and is attached to the parent run
    from infra.tracking import read_sweeps
    from reports.build import build_report
    from reports.frames import HISTORY_KEYS, runs_frame

    found = read_sweeps(tracking, ["t"], HISTORY_KEYS)
    runs = runs_frame(found["trials"], found["experiment_id"], "http://ui")
    assert len(runs) == 4 and runs["scored"].all()
    by_id = {t.user_attrs["mlflow_run_id"]: t.value for t in study.trials}
    assert {r.run_id: r.objective for r in runs.itertuples()} == pytest.approx(by_id)  # what Optuna was told
    assert sorted(found["trials"][0]["history"]["eval/accuracy"])[0][0] == 0
    out = build_report(tracking, ["t"], tmp_path / "report.html")
    page = out.read_text()
    assert page.count('class="plotly-graph-div"') >= 6 and 'id="summary"' in page
    assert [a.path for a in client.list_artifacts(first["parent_run_id"], "report")] == ["report/report.html"]
    with pytest.raises(LookupError, match="no sweep named 'nope'.*known: t"):
        read_sweeps(tracking, ["nope"], [])


def test_a_bounded_staleness_sweep_runs_on_the_ray_runtime_and_reads_back_as_such(tmp_path, tiny_warm_state):
    """`schedule: bounded`: the staleness axis holds η; each trial runs free-running sampling with actors of its
    own, is tracked with that runtime, and the report frame shows η as the method's staleness level."""
    from copc_core.warmstart import warm_start_key
    from flows.sweep_job import grid_table, run_sweep
    from infra.checkpoints import save_checkpoint
    from infra.tracking import read_sweeps
    from reports.frames import HISTORY_KEYS, runs_frame

    base = tiny_config()
    save_checkpoint(tmp_path / "cache" / f"warmstart-{warm_start_key(base)}.pt", tiny_warm_state)
    space = tiny_space(schedule="bounded", tau_advantage=[2.0], staleness=[0, 2], steps=3)
    assert space.run_config(base, space.grid()[1]).train.eta == 2
    assert space.run_config(base, space.grid()[1]).train.staleness == 0
    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = run_sweep(space, "b", base, tmp_path, tracking=tracking)
    assert [o["state"] for o in result["outcomes"]] == ["COMPLETE", "COMPLETE"]
    for outcome in result["outcomes"]:
        eta = outcome["params"]["staleness"]
        assert outcome["runtime"] == "ray (bounded staleness)"
        assert outcome["summary"]["staleness_max"] <= eta and outcome["summary"]["steps_completed"] == 3
    found = read_sweeps(tracking, ["b"], HISTORY_KEYS)
    runs = runs_frame(found["trials"], found["experiment_id"], "http://ui")
    assert set(runs["method"]) == {"copc (bounded η)"} and sorted(runs["staleness"]) == [0, 2]
    assert set(runs["runtime"]) == {"ray (bounded staleness)"}
    assert "η = 2" in grid_table(result["study"], space)


def test_a_killed_sweep_resumes_without_rerunning_finished_trials(tmp_path, tiny_warm_state):
    import os
    import signal
    import subprocess
    import sys
    import time

    from copc_core.warmstart import warm_start_key
    from infra.checkpoints import save_checkpoint

    base = tiny_config(steps=30)
    save_checkpoint(tmp_path / "cache" / f"warmstart-{warm_start_key(base)}.pt", tiny_warm_state)
    (tmp_path / "base.json").write_text(base.model_dump_json())
    (tmp_path / "space.json").write_text(tiny_space(steps=30).model_dump_json())
    env = dict(os.environ, COPC_DATA_DIR=str(tmp_path), PREFECT_HOME=str(tmp_path / "prefect"))
    cmd = [sys.executable, "-m", "flows.cli", "sweep", "--name", "kill", "--space", str(tmp_path / "space.json"),
           "--config", str(tmp_path / "base.json")]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"

    def complete():
        try:
            return [t for t in optuna.load_study(study_name="kill", storage=storage).trials if t.state.name == "COMPLETE"]
        except Exception:  # study not created yet
            return []

    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + 600
    while not complete() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = {t.number: t.params for t in complete()}
    assert 1 <= len(before) < 4, "the kill must land mid-sweep"
    out = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"{len(before)} already finished, {4 - len(before)} to run" in out.stderr
    report = pathlib.Path(out.stdout.split("HTML report: ")[1].split()[0])  # the CLI ends with the report's path
    assert report.is_file() and report.parent == tmp_path / "reports" and "plotly-graph-div" in report.read_text()
    study = optuna.load_study(study_name="kill", storage=storage)
    done = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert len(done) == 4 and len({tuple(sorted(t.params.items())) for t in done}) == 4
    assert all(study.trials[n].state.name == "COMPLETE" for n in before)  # the finished ones were kept, not redone
    assert any(t.user_attrs.get(FAIL_REASON, "").startswith("interrupted") for t in study.trials)
