"""Sweeps on a real Optuna SQLite storage and a real MLflow SQLite store (no mocks)."""

import dataclasses
import json
import math
import pathlib
import re

import optuna
import pytest
from mlflow.tracking import MlflowClient
from pydantic import ValidationError

from copc_core.results import TrialResult
from copc_core.train.stability import RunSummary
from sweeps.space import SweepPoint, SweepSpace, objective_value
from sweeps.study import (
    BANDS,
    FAIL_REASON,
    MANAGED,
    METHOD,
    open_study,
    pending_points,
    run_study,
    running_elsewhere,
    study_distributions,
    study_params,
    trial_point,
)
from tests.conftest import cache_warm_start, tiny_config

pytestmark = pytest.mark.slow


def tiny_space(**kw):
    return SweepSpace(
        **({"tau_policy": [2.0], "tau_advantage": [1.0, 2.0], "staleness": [0, 1], "seeds": [0], "steps": 2} | kw)
    )


def summary(
    final: float = 0.5, peak: float | None = None, auc: float | None = None, collapsed: bool = False, **kw
) -> RunSummary:
    return RunSummary(
        **{
            "steps_completed": 2,
            "warm_start_accuracy": 0.3,
            "final_accuracy": final,
            "peak_accuracy": final if peak is None else peak,
            "auc_accuracy": final if auc is None else auc,
            "final_accuracy_greedy": final,
            "collapsed": collapsed,
            "collapse_step": 2 if collapsed else None,
            "collapse_reason": "accuracy" if collapsed else None,
            "collapse_step_train": None,
            "ess_drop_steps": [],
            "grad_norm_spike_steps": [],
            "mean_step_s": 0.1,
            "mean_rollout_s": 0.05,
            "mean_train_s": 0.05,
            "staleness_mean": 0.0,
            "staleness_max": 0.0,
            "staleness_updates_mean": 0.0,
            "kl_step_mean": None,
            "critic_explained_var_first": None,
            "critic_warmup_explained_var": None,
        }
        | kw
    )


def test_space_grid_and_configs():
    space = tiny_space()
    assert len(space.grid()) == 4
    cfg = space.run_config(tiny_config(), SweepPoint("copc", 2.0, 1.0, 1, 3))
    assert cfg.method.tau_advantage == 1.0 and cfg.train.staleness == 1 and cfg.train.seed == 3 and cfg.train.steps == 2


def test_methods_are_an_axis_with_their_own_bands_and_readings():
    space = SweepSpace(
        methods=["copc", {"name": "copc", "anchor": "behavior"}, "sync_ppo", "tis"],
        tau_policy=[2.0, 4.0],
        tau_advantage=[1.0],
        staleness=[0, 4],
        seeds=[0, 1],
    )
    points = space.grid()
    by_method = {m: [p for p in points if p.method == m] for m in ("copc", "copc[behavior]", "sync_ppo", "tis")}
    assert [len(v) for v in by_method.values()] == [2 * 2 * 2, 2 * 2 * 2, 1 * 1 * 2, 1 * 2 * 2]
    assert {p.staleness for p in by_method["sync_ppo"]} == {0}  # on-policy: k = 0 only
    assert all(p.tau_policy is None and p.tau_advantage is None for p in by_method["tis"])
    base = tiny_config()
    behavior = space.run_config(base, by_method["copc[behavior]"][0])
    assert behavior.method.name == "copc" and behavior.method.anchor == "behavior"
    assert space.run_config(base, by_method["copc"][0]).method.anchor is None  # the method's own reading
    tis = space.run_config(base, by_method["tis"][-1])
    assert tis.method.name == "tis" and tis.method.tau_policy is None and tis.train.staleness == 4
    assert SweepSpace.model_validate_json(space.model_dump_json()) == space
    assert dict(space)["methods"] == space.methods  # as Prefect reads a flow's parameter: a model, not a mapping
    with pytest.raises(ValidationError, match="distinct"):
        SweepSpace(methods=["copc", "copc"])
    with pytest.raises(ValidationError, match="no method of the sweep has that band"):
        SweepSpace(methods=["tis"], tau_policy=[2.0])
    with pytest.raises(ValidationError, match="empty"):
        SweepSpace(methods=["sync_ppo"], staleness=[4])


@pytest.mark.parametrize(
    "bad",
    [
        {"tau_policy": [0.5]},
        {"tau_advantage": [math.nan]},
        {"staleness": [-1]},
        {"method": "tis"},
        {"method": "nope"},
        {"seeds": []},
    ],
)
def test_invalid_spaces_are_refused(bad):
    with pytest.raises(ValidationError):
        tiny_space(**bad)


def test_objective():
    s = summary(0.8, peak=0.9, auc=0.7)
    assert objective_value(s, "final", 0.5) == 0.8 and objective_value(s, "auc", 0.5) == 0.7
    assert objective_value(summary(0.8, peak=0.9, collapsed=True), "peak", 0.5) == pytest.approx(0.4)
    assert tiny_space(objective="auc").score(s) == 0.7


def test_failed_trials_are_fail_with_reason_and_interrupted_ones_rerun(tmp_path):
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    space = tiny_space()
    sweep = open_study("s", storage)
    study = sweep.study

    def half_fail(params_list, on_result):
        for i, p in enumerate(params_list):
            on_result(
                i,
                RuntimeError("worker exploded")
                if p.staleness == 1
                else TrialResult(summary(0.5, collapsed=p.tau_advantage == 2.0), objective=0.25),
            )

    run_study(sweep, pending_points(sweep, space), half_fail)
    states = [t.state for t in study.trials]
    assert states.count(optuna.trial.TrialState.COMPLETE) == 2 and states.count(optuna.trial.TrialState.FAIL) == 2
    assert all("worker exploded" in t.user_attrs[FAIL_REASON] for t in study.trials if t.state.name == "FAIL")
    assert all(t.user_attrs[MANAGED] and t.user_attrs["method"] == "copc" for t in study.trials)
    # the run's outcome is on the trial, for optuna-dashboard and load_study users
    done = sorted((t for t in study.trials if t.state.name == "COMPLETE"), key=lambda t: trial_point(t).tau_advantage)
    assert [
        (t.value, t.user_attrs["final_accuracy"], t.user_attrs["collapsed"], t.user_attrs["collapse_step"])
        for t in done
    ] == [(0.25, 0.5, False, None), (0.25, 0.5, True, 2)]
    # a trial left RUNNING by a version without heartbeats: nobody runs it; marked FAIL, its point rerun
    point = SweepPoint("copc", 2.0, 1.0, 1, 0)
    study.enqueue_trial(study_params(point))
    unmanaged = study.ask(study_distributions([point]))
    for band in ("tau_policy", "tau_advantage"):
        unmanaged.set_user_attr(band, str(getattr(point, band)))
    unmanaged.set_user_attr("method", "copc")
    again = open_study("s", storage)
    pending = pending_points(again, space)
    assert sorted(p.tau_advantage for p in pending) == [1.0, 2.0] and all(p.staleness == 1 for p in pending)
    assert any(t.user_attrs.get(FAIL_REASON, "").startswith("interrupted") for t in again.study.trials)


def test_a_sweep_point_is_typed_normalised_and_names_its_run():
    """Two points are one run exactly when their numbers are equal (a band given as int or float, a lag as float or
    int): the study, MLflow's recovery and the heartbeat checks key by the point itself."""
    a, b = SweepPoint("copc", 2, 1, 4, 0), SweepPoint("copc", 2.0, 1.0, 4.0, 0)
    assert a == b and hash(a) == hash(b) and type(a.tau_policy) is float and type(a.staleness) is int
    assert a != SweepPoint("copc", 2.0, 1.0, 4, 1) and a.cell == SweepPoint("copc", 2.0, 1.0, 4, 1).cell
    assert SweepPoint("tis", None, None, 4, 0).tau_policy is None
    assert (
        a.label() == "copc tp=2 ta=1 k=4 s=0"
        and SweepPoint("tis", None, None, 2, 3).label("bounded") == "tis eta=2 s=3"
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.seed = 1


def test_a_live_trial_of_another_sweep_is_left_alone_until_its_heartbeat_stops(tmp_path, monkeypatch):
    import time

    import sweeps.study as study_mod

    monkeypatch.delenv("COPC_HEARTBEAT_S", raising=False)  # the shell's would override the defaults set here
    monkeypatch.delenv("COPC_HEARTBEAT_GRACE_S", raising=False)
    monkeypatch.setattr(study_mod, "HEARTBEAT_S", 1)
    monkeypatch.setattr(study_mod, "GRACE_S", 3)
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    space = tiny_space(tau_advantage=[1.0], staleness=[0])  # one point
    first = open_study("s", storage)
    stopped = []

    def dies_while_running(params_list, on_result):  # heartbeats run while this runs; then the process "dies"
        second = open_study("s", storage)
        assert pending_points(second, space) == [] and running_elsewhere(second, space) == params_list
        stopped.append(True)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_study(first, pending_points(first, space), dies_while_running)
    assert stopped
    second = open_study("s", storage)
    assert pending_points(second, space) == []  # its heartbeat is still fresh: maybe the process is only slow
    time.sleep(study_mod.GRACE_S + 2)
    assert pending_points(second, space) == space.grid()  # stale: the point runs again
    (failed,) = second.study.get_trials(states=(optuna.trial.TrialState.FAIL,))
    assert failed.user_attrs[FAIL_REASON].startswith("interrupted: its sweep process stopped")


def test_two_sweeps_that_found_the_same_points_pending_run_each_once(tmp_path):
    """Two `copc sweep` on a grown space ran both new points each (8 COMPLETE trials for 6 points): both had listed
    the points pending before either asked for them. Here both list them first; the one that asks first keeps them,
    the other gives them up (its trials FAIL, saying why) and runs nothing, whichever order the checks run in."""
    from sweeps.study import TAKEN_REASON

    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    space = tiny_space(tau_advantage=[1.0, 2.0], staleness=[0])  # two points
    first, second = open_study("s", storage), open_study("s", storage)
    pending_first, pending_second = pending_points(first, space), pending_points(second, space)
    assert pending_first == pending_second == space.grid()
    ran: dict[str, list] = {"first": [], "second": []}

    def runs(name):
        def run_points(batch, on_result):
            ran[name] += batch
            if name == "first":  # the second asks while the first's trials run (it listed them pending before)
                run_study(second, pending_second, runs("second"))
            for i in range(len(batch)):
                on_result(i, TrialResult(summary(0.5), objective=0.5))

        return run_points

    outcomes = run_study(first, pending_first, runs("first"))
    assert ran["first"] == space.grid() and ran["second"] == [] and len(outcomes) == 2
    trials = first.study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    taken = [t for t in trials if t.state == optuna.trial.TrialState.FAIL]
    assert len(complete) == 2 and sorted(trial_point(t).tau_advantage for t in complete) == [1.0, 2.0]
    assert len(taken) == 2 and all(t.user_attrs[FAIL_REASON] == TAKEN_REASON for t in taken)
    assert pending_points(open_study("s", storage), space) == []

    # the other order: the later asker checks first (before the earlier one has checked): it still gives way
    storage2 = f"sqlite:///{tmp_path / 'optuna2.db'}"
    a, b = open_study("s", storage2), open_study("s", storage2)
    pa, pb = pending_points(a, space), pending_points(b, space)
    done_b = run_study(
        b,
        pb,
        lambda batch, on_result: [on_result(i, TrialResult(summary(0.5), objective=0.5)) for i in range(len(batch))],
    )
    done_a = run_study(a, pa, lambda batch, on_result: pytest.fail(f"ran {batch}, finished by the other"))
    assert len(done_b) == 2 and done_a == []


def test_sweep_end_to_end_tracks_runs_and_resume_skips_finished_trials(tmp_path, tiny_warm_state, used_stores):
    from flows.sweep_job import run_sweep

    base = tiny_config()
    cache_warm_start(tmp_path / "cache", base, tiny_warm_state)
    space = tiny_space()
    tracking = used_stores.mlflow(tmp_path / "mlflow.db")
    first = run_sweep(space, "t", base, tmp_path, tracking=tracking)
    assert len([o for o in first.outcomes if o.state == "COMPLETE"]) == 4
    client = MlflowClient(tracking)
    exp = client.get_experiment_by_name("copc")
    children = client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{first.parent_run_id}'")
    assert len(children) == 4
    run = children[0]
    assert run.data.params["method.name"] == "copc" and "train.staleness" in run.data.params
    assert run.data.tags["config_hash"] and "summary/final_accuracy" in run.data.metrics
    ess = client.get_metric_history(run.info.run_id, "correction/ess")
    assert [m.step for m in sorted(ess, key=lambda m: m.step)] == [1, 2]
    assert "config.json" in [a.path for a in client.list_artifacts(run.info.run_id)]
    study = optuna.load_study(study_name="t", storage=first.storage)
    assert {t.user_attrs["mlflow_run_id"] for t in study.trials} == {r.info.run_id for r in children}
    second = run_sweep(space, "t", base, tmp_path, tracking=tracking)
    assert second.outcomes == [] and second.parent_run_id == first.parent_run_id
    assert len(optuna.load_study(study_name="t", storage=first.storage).trials) == 4

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
    assert sorted(a.path for a in client.list_artifacts(first.parent_run_id, "report")) == [
        "report/plotly.min.js",
        "report/report.html",
    ]
    assert '<script type="text/javascript" src="plotly.min.js">' in page and (out.parent / "plotly.min.js").is_file()
    # the parent run describes the sweep: a per-cell table on its page and as JSON
    parent = client.get_run(first.parent_run_id)
    assert parent.data.tags["mlflow.note.content"].startswith("| method | tau_policy |")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    assert run.data.tags["machine.cores"].isdigit() and run.data.tags["machine.torch"]
    with pytest.raises(LookupError, match="no sweep named 'nope'.*known: t"):
        read_sweeps(tracking, ["nope"], [])


def test_a_bounded_staleness_sweep_runs_on_the_ray_runtime_and_reads_back_as_such(
    tmp_path, tiny_warm_state, used_stores
):
    """`schedule: bounded`: the staleness axis holds η; each trial runs free-running sampling with actors of its
    own, is tracked with that runtime, and the report frame shows η as the method's staleness level."""
    from flows.sweep_job import grid_table, run_sweep
    from infra.tracking import read_sweeps
    from reports.frames import HISTORY_KEYS, runs_frame

    base = tiny_config()
    cache_warm_start(tmp_path / "cache", base, tiny_warm_state)
    space = tiny_space(schedule="bounded", tau_advantage=[2.0], staleness=[0, 2], steps=3)
    assert space.run_config(base, space.grid()[1]).train.eta == 2
    assert space.run_config(base, space.grid()[1]).train.staleness == 0
    tracking = used_stores.mlflow(tmp_path / "mlflow.db")
    result = run_sweep(space, "b", base, tmp_path, tracking=tracking)
    assert [o.state for o in result.outcomes] == ["COMPLETE", "COMPLETE"]
    for outcome in result.outcomes:
        eta = outcome.point.staleness
        assert outcome.result.runtime == "ray (bounded staleness)"
        assert outcome.result.summary.staleness_max <= eta and outcome.result.summary.steps_completed == 3
    found = read_sweeps(tracking, ["b"], HISTORY_KEYS)
    runs = runs_frame(found["trials"], found["experiment_id"], "http://ui")
    assert set(runs["method"]) == {"copc (bounded η)"} and sorted(runs["staleness"]) == [0, 2]
    assert set(runs["runtime"]) == {"ray (bounded staleness)"}
    assert "η = 2" in grid_table(result.study, space)


def _sweep_files(tmp_path, warm_state, steps: int, prefect_api: str, stores) -> dict[str, str]:
    """base.json, space.json, the cached warm start and a used MLflow store for a `copc sweep` subprocess; its
    environment (a data folder of its own, no MLflow server inherited, the session's Prefect server, heartbeats every
    second judged dead after 6 s instead of 30, so that a rerun after a kill waits 6 s for the dead process's
    trials)."""
    import os

    base = tiny_config(steps=steps)
    cache_warm_start(tmp_path / "cache", base, warm_state)
    stores.mlflow(tmp_path / "mlflow.db")
    (tmp_path / "base.json").write_text(base.model_dump_json())
    (tmp_path / "space.json").write_text(tiny_space(steps=steps).model_dump_json())
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "PREFECT_API_URL")}
    return env | {
        "COPC_DATA_DIR": str(tmp_path),
        "PREFECT_HOME": str(tmp_path / "prefect"),
        "PREFECT_API_URL": prefect_api,
        "COPC_HEARTBEAT_S": "1",
        "COPC_HEARTBEAT_GRACE_S": "6",
    }


def test_a_killed_sweep_resumes_without_rerunning_finished_trials(tmp_path, tiny_warm_state, prefect_api, used_stores):
    import os
    import signal
    import subprocess
    import sys
    import time

    env = _sweep_files(tmp_path, tiny_warm_state, steps=10, prefect_api=prefect_api, stores=used_stores)
    cmd = [
        sys.executable,
        "-m",
        "flows.cli",
        "sweep",
        "--name",
        "kill",
        "--space",
        str(tmp_path / "space.json"),
        "--config",
        str(tmp_path / "base.json"),
        "--max-parallel",
        "2",  # two at a time on any machine: the first to finish lands the kill before the last ends
    ]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"

    def complete():
        try:
            return [
                t for t in optuna.load_study(study_name="kill", storage=storage).trials if t.state.name == "COMPLETE"
            ]
        except Exception:  # study not created yet
            return []

    proc = subprocess.Popen(
        cmd, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.time() + 600
    while not complete() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = {t.number: t.params for t in complete()}
    assert 1 <= len(before) < 4, "the kill must land mid-sweep"
    out = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, why_it_failed(out.stderr)
    # the killed process's trials keep a fresh heartbeat for up to GRACE_S: the rerun waits, then runs them
    assert f"{len(before)} already finished" in out.stderr
    report = pathlib.Path(out.stdout.split("HTML report: ")[1].split()[0])  # the CLI ends with the report's path
    assert report.is_file() and report.parent == tmp_path / "reports" and "plotly-graph-div" in report.read_text()
    study = optuna.load_study(study_name="kill", storage=storage)
    done = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert len(done) == 4 and len({tuple(sorted(t.params.items())) for t in done}) == 4
    assert all(study.trials[n].state.name == "COMPLETE" for n in before)  # the finished ones were kept, not redone
    assert any(t.user_attrs.get(FAIL_REASON, "").startswith("interrupted") for t in study.trials)
    # the MLflow runs the killed process had started will never finish: the rerun marked them KILLED
    runs = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").search_runs(["1"], "tags.copc_kind = 'trial'")
    statuses = sorted(r.info.status for r in runs)
    assert statuses.count("FINISHED") == 4 and "RUNNING" not in statuses, statuses
    assert all(r.data.tags["fail_reason"].startswith("interrupted") for r in runs if r.info.status == "KILLED")


def test_a_trials_mlflow_run_exists_from_its_start_and_its_curves_grow_while_it_trains(
    tmp_path, tiny_warm_state, prefect_api, used_stores
):
    """Child runs were written after each trial ended (durations of 0.6 s for trials of 30-55 s): no curve grew while
    a sweep trained. Now the run is created as the trial starts and the training process streams its step records;
    at the end each metric holds every step once (the streamed part is not logged again)."""
    import time

    steps = 80
    env = _sweep_files(tmp_path, tiny_warm_state, steps=steps, prefect_api=prefect_api, stores=used_stores) | {
        "COPC_MLFLOW_STREAM_S": "0.2"
    }  # sends the test sees
    (tmp_path / "space.json").write_text(tiny_space(tau_advantage=[1.0], staleness=[0], steps=steps).model_dump_json())
    proc = _run_sweep_process(tmp_path, "live", tmp_path / "space.json", tmp_path / "base.json", env)
    db = tmp_path / "mlflow.db"
    seen = []  # (status, reward/mean points) of the trial's run, polled while the sweep runs
    deadline = time.time() + 600
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    while proc.poll() is None and time.time() < deadline:
        time.sleep(0.5)
        try:  # the sweep opens its study after it made its MLflow store: a second client must not make it too
            optuna.load_study(study_name="live", storage=storage)
        except Exception:  # not yet
            continue
        client = MlflowClient(f"sqlite:///{db}")
        runs = client.search_runs(["1"], "tags.copc_kind = 'trial'")
        if runs:
            points = client.get_metric_history(runs[0].info.run_id, "reward/mean")
            seen.append((runs[0].info.status, len(points)))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    growing = [n for status, n in seen if status == "RUNNING"]
    assert growing and growing[0] < steps, seen  # listed while it trained
    assert len({n for n in growing if 0 < n < steps}) >= 2, seen  # part of its curve, and more of it later
    client = MlflowClient(f"sqlite:///{db}")
    (run,) = client.search_runs(["1"], "tags.copc_kind = 'trial'")
    history = client.get_metric_history(run.info.run_id, "reward/mean")
    assert run.info.status == "FINISHED" and sorted(m.step for m in history) == list(range(1, steps + 1))
    evals = client.get_metric_history(run.info.run_id, "eval/accuracy")
    assert len({m.step for m in evals}) == len(evals) and 0 in {m.step for m in evals}  # each eval once, step 0 too


def why_it_failed(stderr: str) -> str:
    """What a failed process said: its exception lines (a rich traceback's box can fill the whole tail, and log lines
    of its flow run can follow it) and the end of its stderr."""
    said = [line for line in stderr.splitlines() if re.search(r"\w(Error|Exception)\b.*:", line)]
    return "\n".join(said[-10:]) + "\n…\n" + stderr[-2000:]


def _run_sweep_process(tmp_path, name, space_file, base_file, env):
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[1]
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "flows.cli",
            "sweep",
            "--name",
            name,
            "--space",
            str(space_file),
            "--config",
            str(base_file),
        ],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_two_sweep_processes_on_one_study_finish_it_once(tmp_path, tiny_warm_state, prefect_api, used_stores):
    """The second joins: it runs what nobody runs and waits for the rest; no trial is failed for being
    live, no result is lost, and MLflow holds one run per point."""
    import time

    env = _sweep_files(tmp_path, tiny_warm_state, steps=12, prefect_api=prefect_api, stores=used_stores)
    first = _run_sweep_process(tmp_path, "both", tmp_path / "space.json", tmp_path / "base.json", env)
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    deadline = time.time() + 600
    while time.time() < deadline and first.poll() is None:  # the second starts while the first runs trials
        try:
            if optuna.load_study(study_name="both", storage=storage).trials:
                break
        except Exception:  # not created yet
            pass
        time.sleep(0.2)
    second = _run_sweep_process(
        tmp_path,
        "both",
        tmp_path / "space.json",
        tmp_path / "base.json",
        dict(env, PREFECT_HOME=str(tmp_path / "prefect2")),
    )
    outs = [p.communicate(timeout=900) for p in (first, second)]
    assert first.returncode == 0 and second.returncode == 0, [why_it_failed(err) for _, err in outs]
    study = optuna.load_study(study_name="both", storage=storage)
    assert sorted(t.state.name for t in study.trials) == ["COMPLETE"] * 4
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("copc")
    runs = client.search_runs([exp.experiment_id], "tags.copc_sweep = 'both' and tags.copc_kind = 'trial'")
    assert len(runs) == 4 and len({r.data.tags["config_hash"] for r in runs}) == 4
    assert {t.user_attrs["mlflow_run_id"] for t in study.trials} == {r.info.run_id for r in runs}


def _one_point_sweep(tmp_path, warm_state):
    """A one-point sweep "w" with its warm start cached, and its MLflow parent run opened (no trial yet)."""
    from infra.tracking import Tracker

    base = tiny_config()
    cache_warm_start(tmp_path / "cache", base, warm_state)
    space = tiny_space(tau_advantage=[1.0], staleness=[0])
    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    tracker = Tracker(tracking, artifact_dir=tmp_path / "mlartifacts")
    parent = tracker.parent_run("w", {"space": space.model_dump(mode="json"), "base": base.model_dump(mode="json")})
    return base, space, tracking, storage, tracker, parent


def test_a_result_logged_to_mlflow_but_not_told_to_optuna_is_recovered_not_retrained(
    tmp_path, tiny_warm_state, monkeypatch
):
    """The window between logging a trial to MLflow and telling Optuna: a sweep that dies there leaves a
    RUNNING trial and a finished MLflow run; the next sweep tells Optuna that run's result and trains nothing."""
    import sweeps.study as study_mod
    from flows.sweep_job import run_sweep
    from infra import sweep_runs
    from sweeps.study import run_study

    monkeypatch.delenv("COPC_HEARTBEAT_S", raising=False)
    monkeypatch.delenv("COPC_HEARTBEAT_GRACE_S", raising=False)
    monkeypatch.setattr(study_mod, "HEARTBEAT_S", 1)
    monkeypatch.setattr(study_mod, "GRACE_S", 2)
    base, space, tracking, storage, tracker, parent = _one_point_sweep(tmp_path, tiny_warm_state)
    logged = TrialResult(summary(0.75, peak=0.8, auc=0.6), objective=0.75)

    def logs_then_dies(params_list, on_result):
        config = space.run_config(base, params_list[0])
        tracker.log_trial(parent, "w", "logged", config, logged)
        raise SystemExit("killed after logging, before telling Optuna")

    with pytest.raises(SystemExit):
        run_study(open_study("w", storage), space.grid(), logs_then_dies)
    trained = []
    monkeypatch.setattr(sweep_runs, "_train_trial", None)  # any training would fail loudly
    monkeypatch.setattr(sweep_runs, "run_trials", lambda *a, **k: trained.append(a))
    result = run_sweep(space, "w", base, tmp_path, storage=storage, tracking=tracking)
    assert not trained
    study = optuna.load_study(study_name="w", storage=storage)
    complete = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert len(complete) == 1 and complete[0].value == pytest.approx(0.75)
    runs = MlflowClient(tracking).search_runs([tracker.experiment_id], "tags.copc_kind = 'trial'")
    assert len(runs) == 1 and complete[0].user_attrs["mlflow_run_id"] == runs[0].info.run_id
    assert result.best.value == pytest.approx(0.75)
    assert complete[0].user_attrs["final_accuracy"] == 0.75 and complete[0].user_attrs["collapsed"] is False


def test_a_study_grows_by_seeds_lags_and_methods_between_sessions(tmp_path):
    """Static distributions: a later session may add seeds, lags or methods to a study (Optuna refuses a
    categorical parameter whose choices change, which froze a study's space at its first session)."""
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"

    def finish(space):
        sweep = open_study("g", storage)
        todo = pending_points(sweep, space)
        run_study(
            sweep,
            todo,
            lambda ps, on_result: [on_result(i, TrialResult(summary(0.5), objective=0.5)) for i in range(len(ps))],
        )
        return todo

    small = tiny_space(tau_advantage=[1.0], staleness=[0])
    assert len(finish(small)) == 1
    grown = SweepSpace(
        methods=[{"name": "copc", "tau_policy": [2.0], "tau_advantage": [1.0]}, "tis"],
        staleness=[0, 4],
        seeds=[0, 1],
        steps=2,
    )
    added = finish(grown)
    assert len(added) == len(grown.grid()) - 1 and small.grid()[0] not in added
    assert pending_points(open_study("g", storage), grown) == []
    tis = [t for t in optuna.load_study(study_name="g", storage=storage).trials if t.user_attrs["method"] == "tis"]
    assert len(tis) == 4 and all(set(t.params) == {"staleness", "seed"} for t in tis)  # no band: no parameter


def test_a_study_of_the_older_categorical_format_is_refused_with_a_clear_error(tmp_path):
    from sweeps.study import StudyFormatError

    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    old = optuna.create_study(study_name="old", storage=storage)
    old.enqueue_trial({"seed": 0})
    old.tell(old.ask({"seed": optuna.distributions.CategoricalDistribution([0])}), 0.5)
    with pytest.raises(StudyFormatError, match="older copc.*new name"):
        open_study("old", storage)


def test_best_per_level_names_every_tied_cell_and_says_when_all_collapsed():
    from flows.sweep_job import best_per_level

    def row(method, tp, ta, k, mean, collapsed=0, seeds=2):
        return {
            "method": method,
            "tau_policy": tp,
            "tau_advantage": ta,
            "staleness": k,
            "seeds": seeds,
            "objective_mean": mean,
            "objective_sd": 0.0,
            "final_mean": mean,
            "final_sd": 0.0,
            "collapsed": collapsed,
        }

    rows = [
        row("copc", 2.0, 1.0, 0, 0.9),
        row("copc", 2.0, 2.0, 0, 0.9),
        row("tis", None, None, 0, 0.8),
        row("copc", 2.0, 1.0, 4, -0.5, 2),
        row("copc", 2.0, 2.0, 4, -0.496, 2),
        row("tis", None, None, 4, -0.5, 2),
        row("copc", 4.0, 1.0, 4, 0.0, seeds=0),
    ]  # a cell with no finished run does not compete
    assert best_per_level(rows) == [
        "k=0: 0.900 (2 cells tie: copc tp=2 ta=1, copc tp=2 ta=2)",
        "k=4: -0.496 copc tp=2 ta=2 — every run collapsed",
    ]


def test_the_regime_presets_are_the_calibrated_candidates():
    """Each regime preset is the candidate docs/REGIME.md chose, as bench/regime.py ran it at k = 0 (the
    presets evaluate greedy at the ends only, which leaves every sampled metric the same)."""
    from bench.regime import run_config
    from copc_core.config import with_overrides
    from sweeps.presets import PRESETS

    for preset, candidate in (
        ("regime-tool-math", "weakwarm-b32-lr1e-4"),
        ("regime-search", "search-midwarm-b32-lr7e-5-clr3"),
    ):
        base = PRESETS[preset][1]
        as_run = with_overrides(base, {"method.name": "sync_ppo", "train.seed": 1, "train.steps": 300})
        calibrated = with_overrides(run_config(candidate, 1, 300), {"train.greedy_eval": "final"})
        assert as_run == calibrated, preset
    assert (
        PRESETS["regime-search"][1].task.name == "search"
        and PRESETS["regime-search"][0] == PRESETS["regime-tool-math"][0]
    )


def test_a_relabelled_run_of_the_same_config_is_not_recovered_as_the_new_point(tmp_path, tiny_warm_state, monkeypatch):
    """A run relabelled because its preset's meaning changed (scripts/relabel_trials.py) keeps its config hash; the
    recovery of logged-but-untold results must not hand it to the point that now bears the old label."""
    from flows.sweep_job import run_sweep
    from infra import sweep_runs

    base, space, tracking, storage, tracker, parent = _one_point_sweep(tmp_path, tiny_warm_state)
    point = space.grid()[0]
    tracker.log_trial(
        parent, "w", "old", space.run_config(base, point), TrialResult(summary(0.75), objective=0.75), label="copc[old]"
    )
    trained = []
    monkeypatch.setattr(sweep_runs, "_train_trial", None)
    monkeypatch.setattr(sweep_runs, "run_trials", lambda configs, *a, **k: trained.append(configs) or [])
    # the faked trials are never told, so the sweep waits out their heartbeat's grace (30 s by default) before it ends
    monkeypatch.setenv("COPC_HEARTBEAT_S", "1")
    monkeypatch.setenv("COPC_HEARTBEAT_GRACE_S", "2")
    run_sweep(space, "w", base, tmp_path, storage=storage, tracking=tracking)
    assert len(trained) == 1 and len(trained[0]) == len(space.grid())  # the point is trained, not recovered


def _dashboard_json(storage: str, name: str) -> str:
    """The study page's data as optuna-dashboard serves it, as strict JSON (what a browser's JSON.parse reads)."""
    from optuna_dashboard._serializer import serialize_study_detail

    study = optuna.load_study(study_name=name, storage=storage)
    trials = study.get_trials(deepcopy=False)
    space = sorted({(k, d) for t in trials for k, d in t.distributions.items()}, key=lambda x: x[0])
    detail = serialize_study_detail(
        study._storage.get_all_studies()[0], study.best_trials, trials, space, space, [], False, {}, []
    )
    return json.dumps(detail, allow_nan=False)  # raises on Infinity / NaN


def test_a_band_of_infinity_reaches_the_dashboard_as_finite_json_and_the_point_round_trips_exactly(tmp_path):
    """The study page of optuna-dashboard stayed blank: a band's FloatDistribution(1, inf) went out as
    `"high": Infinity`, which a browser's JSON.parse refuses (Python's json reads it, so an API test passed)."""
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    space = SweepSpace(
        methods=[{"name": "copc", "tau_policy": [1.5, 4.0, float("inf")], "tau_advantage": [1.0, 1.25]}, "tis"],
        staleness=[0, 32],
        seeds=[0, 7],
        steps=2,
    )
    sweep = open_study("inf", storage)
    run_study(
        sweep,
        pending_points(sweep, space),
        lambda ps, on_result: [on_result(i, TrialResult(summary(0.5), objective=0.5)) for i in range(len(ps))],
    )
    assert pending_points(open_study("inf", storage), space) == []  # every point found again: exact round trip
    trials = sweep.study.get_trials(deepcopy=False)
    assert sorted(map(repr, (trial_point(t) for t in trials))) == sorted(map(repr, space.grid()))
    text = _dashboard_json(storage, "inf")
    copc = [t for t in trials if t.user_attrs["method"] == "copc"]
    # 1/τ: ∞ is 0, 4 is 0.25, 1.5 is 2/3; the distribution spans the sweep's values, not [1, ∞]
    assert sorted({t.params["1/tau_policy"] for t in copc}) == [0.0, 0.25, 1 / 1.5]
    assert {(d.low, d.high) for t in copc for k, d in t.distributions.items() if k == "1/tau_policy"} == {
        (0.0, 1 / 1.5)
    }
    assert {(d.low, d.high) for t in trials for k, d in t.distributions.items() if k == "staleness"} == {(0, 32)}
    assert '"value": "inf"' in text or '"value":"inf"' in text  # the exact band, as text, in the trial's attributes


def _older_study(storage: str, name: str) -> None:
    """A study as copc wrote it before bands were reciprocals: parameters on [1, ∞], bands not in the attributes."""
    old = optuna.create_study(study_name=name, storage=storage, direction="maximize")
    bands = optuna.distributions.FloatDistribution(1.0, float("inf"))
    numbers = {"staleness": optuna.distributions.IntDistribution(0, 1024)}
    numbers["seed"] = optuna.distributions.IntDistribution(0, 2**31 - 1)
    for tp, value in ((float("inf"), 0.75), (2.0, 0.25)):
        old.enqueue_trial({"tau_policy": tp, "tau_advantage": 1.0, "staleness": 4, "seed": 0})
        trial = old.ask({"tau_policy": bands, "tau_advantage": bands, **numbers})
        trial.set_user_attr("method", "copc")
        trial.set_user_attr("final_accuracy", value)
        old.tell(trial, value)
    trial = old.ask(numbers)  # a baseline that failed
    trial.set_user_attr("method", "tis")
    old.tell(trial, state=optuna.trial.TrialState.FAIL)


def test_a_study_with_unbounded_bands_is_refused_then_migrated_in_place_keeping_every_trial(tmp_path):
    from sweeps.study import StudyFormatError, migrate_study

    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    _older_study(storage, "old")
    with pytest.raises(StudyFormatError, match="older copc.*unbounded.*copc migrate-study"):
        open_study("old", storage)
    with pytest.raises(ValueError, match="Infinity|Out of range"):
        _dashboard_json(storage, "old")  # what the browser could not read
    assert migrate_study("old", storage) == 3
    sweep = open_study("old", storage)  # now this version's format
    trials = sweep.study.get_trials(deepcopy=False)
    assert [(t.number, t.state.name, t.value) for t in trials] == [
        (0, "COMPLETE", 0.75),
        (1, "COMPLETE", 0.25),
        (2, "FAIL", None),
    ]
    assert [trial_point(t) for t in trials[:2]] == [
        SweepPoint("copc", float("inf"), 1.0, 4, 0),
        SweepPoint("copc", 2.0, 1.0, 4, 0),
    ]
    assert trials[0].user_attrs["final_accuracy"] == 0.75 and trials[2].user_attrs["method"] == "tis"
    space = SweepSpace(
        methods=[{"name": "copc", "tau_policy": [2.0, float("inf")], "tau_advantage": [1.0]}],
        staleness=[4],
        seeds=[0, 1],
        steps=2,
    )
    assert [(p.tau_policy, p.seed) for p in pending_points(sweep, space)] == [(2.0, 1), (float("inf"), 1)]
    _dashboard_json(storage, "old")  # strict JSON now
    assert migrate_study("old", storage) == 3  # a second migration changes nothing
    assert [s.study_name for s in optuna.get_all_study_summaries(storage)] == ["old"]


def _chosen_per_seed(results: str, heading: str, k: int) -> dict[str, list[tuple[float, float]]]:
    """The 'cell chosen per seed' column of the leave-one-seed-out table under `heading` in docs/journal/:
    reading → the (τ_p, τ_a) chosen for each held-out seed (a band left out of the text is ∞)."""
    import re

    section = results.split(heading, 1)[1].split("\n## ", 1)[0]
    out = {}
    for line in section.splitlines():
        m = re.match(rf"\| copc\[(\w+)\] \| {k} \| [^|]+\| [^|]+\| (0: τ_p [^|]+) \|", line)
        if m:
            cells = [re.match(r"\d: τ_p ([\d.]+)(?: τ_a ([\d.]+|inf))?$", c.strip()) for c in m.group(2).split(";")]
            out[m.group(1)] = [(float(c.group(1)), float(c.group(2) or "inf")) for c in cells]
    return out


LONG_CHOICES = {  # (task, k) → the journal's section whose leave-one-seed-out table the long cells come from
    ("tool-math", 32): "## Tool-math at 64 updates of lag, seeds 0–4 (every reading's 12 cells, every baseline)",
    ("search", 32): "## Search at 64 updates: the behavior and interpolated readings' narrow bands (step 3)",
    (
        "tool-math",
        8,
    ): "## Tool-math at 16 updates of lag (k = 8), seeds 0–4, regenerated here: every reading's 12 cells",
    ("search", 8): "## Search at 16 updates of lag (k = 8), seeds 0–4, regenerated here: every reading's 12 cells",
}
# a mode the plan's tie-break (the higher seed mean) left tied, broken as the journal writes it before the long runs
LONG_TIE_BREAKS = {("search", 8, "recomputed"): (4.0, float("inf"))}  # the higher seed-mean AUC: 2026-12-07-3


def test_the_long_study_runs_each_reading_at_the_cell_the_300_step_study_chose_most_often():
    """The long presets' cells are fixed from the 300-step record before any long run at that lag: per task, lag and
    reading, the cell leave-one-seed-out chose most often over the 12-cell grid (a tie the plan's rule left is named in
    LONG_TIE_BREAKS, as its journal breaks it);
    every lag with cells runs every lagged baseline."""
    import collections
    import pathlib

    from sweeps.presets import LONG_CELLS, LONG_SEEDS, PRESETS

    journal = pathlib.Path(__file__).parent.parent / "docs" / "journal"
    results = "\n".join(f.read_text(encoding="utf-8") for f in sorted(journal.glob("*.md")))
    assert sorted(LONG_CHOICES) == sorted((task, k) for task, lags in LONG_CELLS.items() for k in lags)
    for (task, k), heading in LONG_CHOICES.items():
        chosen = _chosen_per_seed(results, heading, k)
        assert sorted(chosen) == ["behavior", "interpolated", "recomputed"], (task, k, chosen)
        for reading, picks in chosen.items():
            counts = collections.Counter(picks)
            modes = [cell for cell, n in counts.items() if n == max(counts.values())]
            assert len(picks) == 5, (task, k, reading, picks)
            if len(modes) > 1:  # a tie: the cell the journal's tie-break chose, one of the modes
                assert LONG_CELLS[task][k][reading] == LONG_TIE_BREAKS[(task, k, reading)] and (
                    LONG_CELLS[task][k][reading] in modes
                ), (task, k, reading, modes)
            else:
                assert LONG_CELLS[task][k][reading] == modes[0], (task, k, reading)
    assert all(LONG_CELLS[task][k][reading] == cell for (task, k, reading), cell in LONG_TIE_BREAKS.items())
    for task, lags in LONG_CELLS.items():
        space, base = PRESETS[f"regime-{task}-long"]
        assert base == PRESETS[f"regime-{task}"][1] and space.steps == 1000 and space.staleness == sorted(lags)
        assert not set(LONG_SEEDS) & set(range(10)) and space.seeds == LONG_SEEDS  # seeds the study never ran
        for k, cells in lags.items():
            at = [p for p in space.grid() if p.staleness == k]
            copc = {p.method: (p.tau_policy, p.tau_advantage) for p in at if p.method.startswith("copc")}
            assert copc == {f"copc[{r}]": cell for r, cell in cells.items()}
            baselines = {p.method for p in at} - set(copc)
            assert "cispo" in baselines and "tis" in baselines and "sync_ppo" not in baselines and len(baselines) == 13


def test_naming_methods_of_a_preset_keeps_their_cells_and_a_new_method_gets_its_defaults():
    from sweeps.presets import PRESETS
    from sweeps.space import with_axes

    space = with_axes(PRESETS["regime-search-long"][0], methods="copc[behavior],tis,copc")
    assert [(m.key, m.tau_policy, m.tau_advantage, m.staleness) for m in space.methods] == [
        ("copc[behavior]", [4.0], [1.1], [8]),  # the reading's cell at each lag
        ("copc[behavior]", [4.0], [1.5], [32]),
        ("tis", None, None, None),
        ("copc", None, None, None),  # not in the preset: the registry's defaults
    ]
    assert space.staleness == [8, 32] and len(space.grid()) == 3 * 2 * 5 and space.steps == 1000


def test_a_method_named_otherwise_than_the_presets_entries_of_it_is_said():
    """`copc` where the preset has `copc[recomputed]`, `copc[behavior]`, `copc[interpolated]` sweeps the registry's
    defaults, not the preset's cells: said. A method the preset spells so, or one it has no entry of, is not; a method
    of the sweep with no point at its lags (on-policy `sync_ppo` at k = 8) is said not to run; one named twice is
    refused."""
    from sweeps.presets import PRESETS
    from sweeps.space import methods_notice, with_axes

    def notice(space, methods, **axes):
        return methods_notice(space, with_axes(space, methods, **axes), methods)

    regime = PRESETS["regime-tool-math"][0]
    said = notice(regime, "copc,copc[behavior],tis,copc_policy_only")
    assert said == (
        "--methods: copc is not an entry of this sweep (it has copc[recomputed], copc[behavior], copc[interpolated]): "
        "it runs as a new entry, a band not given taking the registry's default, not those entries' cells"
    )
    assert notice(regime, "copc[behavior],tis") is None and methods_notice(regime, regime, None) is None
    default = PRESETS["embedded-default"][0]
    assert methods_notice(default, with_axes(default, "copc[behavior]"), "copc[behavior]", "methods").startswith(
        "methods: copc[behavior] is not an entry of this sweep (it has copc)"
    )
    assert notice(default, "copc,tis") is None  # tis: no entry of it to mistake
    idle = "sync_ppo has no point at staleness [8] (an on-policy method runs at 0 only): it does not run"
    assert notice(regime, "sync_ppo,tis", staleness=[8]) == idle
    assert notice(regime, None, staleness=[8]) == idle  # the preset's own sync_ppo: not named, still said
    assert notice(regime, "copc,sync_ppo", staleness=[8]).split("\n") == [said, idle]
    assert notice(regime, "sync_ppo,tis", staleness=[0, 8]) is None
    with pytest.raises(ValueError, match="methods: copc\\[behavior\\], tis named twice"):
        with_axes(regime, "tis,copc[behavior],tis,copc[behavior]")


def _finished_study(space: SweepSpace, attrs_of) -> optuna.Study:
    """An in-memory study with a finished trial of every point of `space` recorded as `run_study` records one (its
    parameters, method and exact bands), objective 0.5 + seed / 10, and `attrs_of(point)` among its attributes."""
    study = optuna.create_study()
    distributions = study_distributions(space.grid())
    for p in space.grid():
        numbers = study_params(p)
        attrs = {METHOD: p.method, **{b: str(getattr(p, b)) for b in BANDS}, **attrs_of(p)}
        study.add_trial(
            optuna.trial.create_trial(
                params=numbers,
                distributions={k: distributions[k] for k in numbers},
                value=0.5 + p.seed / 10,
                user_attrs=attrs,
            )
        )
    return study


def test_one_method_has_other_bands_at_other_lags_as_entries_each_at_its_own_lags():
    """The long study runs each reading at the cell chosen at that lag: entries of one key, each with its `staleness`,
    give the points of each entry at its lags only (through JSON too); entries of one key whose lags meet in the sweep,
    or that name two methods, are refused; `--methods` naming the key keeps every entry of it, `--staleness` cuts
    them, and a key left with no point is said; the sweep's console table has one block per key and lag."""
    from flows.sweep_job import grid_table
    from sweeps.space import methods_notice, with_axes

    at = {8: (4.0, 1.25), 32: (1.5, float("inf"))}
    entries = [
        {"name": "copc", "anchor": "behavior", "tau_policy": [tp], "tau_advantage": [ta], "staleness": [k]}
        for k, (tp, ta) in at.items()
    ]
    space = SweepSpace(methods=[*entries, "tis"], staleness=[8, 32], seeds=[0, 1])
    got = {(p.method, p.tau_policy, p.tau_advantage, p.staleness) for p in space.grid()}
    assert got == {("copc[behavior]", *at[k], k) for k in at} | {("tis", None, None, k) for k in at}
    assert len(space.grid()) == 4 * 2 and space.method_keys() == ["copc[behavior]", "tis"]
    assert SweepSpace.model_validate_json(space.model_dump_json()) == space
    assert with_axes(space, methods="copc[behavior]").grid() == [p for p in space.grid() if p.method != "tis"]
    assert {p.tau_policy for p in with_axes(space, staleness=[8]).grid() if p.method == "copc[behavior]"} == {4.0}
    cut = with_axes(space, staleness=[16])
    assert methods_notice(space, cut, None) == (
        "copc[behavior] has no point at staleness [16] (its entries run at k = 8, 32 only): it does not run"
    )
    with pytest.raises(ValueError, match="the grid is empty .* an entry with lags of its own at those only"):
        with_axes(space, methods="copc[behavior]", staleness=[16])
    with pytest.raises(ValueError, match="copc\\[behavior\\] twice"):
        SweepSpace(methods=[entries[0], {**entries[1], "staleness": [8, 32]}], staleness=[8, 32])
    assert len(SweepSpace(methods=[entries[0], {**entries[1], "staleness": [32, 64]}], staleness=[8, 32]).grid()) == 2
    with pytest.raises(ValueError, match="x twice"):
        SweepSpace(
            methods=[
                {"name": "tis", "label": "x", "staleness": [8]},
                {"name": "cispo", "label": "x", "staleness": [32]},
            ],
            staleness=[8, 32],
        )
    table = grid_table(_finished_study(space, lambda p: {"final_accuracy": 0.5 + p.seed / 10}), space)
    assert table.count("copc[behavior]") == 2 and table.count("tis") == 2, table  # one block per key and lag
    k8, k32 = table.split("k = 8")[1].split("k = 32")
    assert "τ_p = 4 " in k8 and "1.25" in k8 and "inf" not in k8, table
    assert "τ_p = 1.5 " in k32 and "inf" in k32 and "1.25" not in k32, table


def test_the_sweep_table_reads_a_trial_that_lacks_its_final_accuracy():
    """A finished trial without a `final_accuracy` attribute (an older study's) gave NaN, and statistics.stdev raised
    AttributeError on it at the end of the sweep: its cell's final sd is NaN now, the objective's still computed."""
    from flows.sweep_job import sweep_rows

    space = SweepSpace(methods=["tis"], staleness=[1], seeds=[0, 1], steps=2)
    study = _finished_study(space, lambda p: {"final_accuracy": 0.5} if p.seed == 0 else {})
    (row,) = sweep_rows(study, space)
    assert row["seeds"] == 2 and math.isnan(row["final_sd"]) and row["objective_sd"] == pytest.approx(0.1 / 2**0.5)


def test_a_study_whose_trials_ran_another_definition_of_their_method_is_not_grown(tmp_path, monkeypatch):
    """A point's config hash covers its RunConfig, not the registry row its method names: after a row's default
    changed, a grown study reused results of the old definition. Each trial now records the method as resolved; a
    study holding another definition's results is refused, naming the method, and MLflow's logged results of it are
    not recovered as today's."""
    from copc_core.config import MethodConfig
    from copc_core.rl import methods
    from sweeps.study import METHOD_SPEC, StudyFormatError, changed_definitions

    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    space = SweepSpace(methods=["tis"], staleness=[1], seeds=[0, 1], steps=2)
    base = tiny_config()

    def spec_of(p):
        return space.run_config(base, p).method.spec_hash()

    sweep = open_study("s", storage)
    run_study(
        sweep,
        pending_points(sweep, space),
        lambda ps, on_result: [on_result(i, TrialResult(summary(0.5), objective=0.5)) for i in range(len(ps))],
        lambda p: {METHOD_SPEC: spec_of(p)},
    )
    before = spec_of(space.grid()[0])
    assert {t.user_attrs[METHOD_SPEC] for t in sweep.study.trials} == {before}
    changed_definitions(sweep, space, spec_of)  # today's definition: it grows
    # the registry row's meaning changes: TIS truncates at 3 instead of 2 (no field of a config names the cap)
    row = methods.METHODS["tis"]
    cap3 = row._replace(build=lambda tp, ta: (methods.PolicySide(kind="truncate", cap=3.0), methods._GAE))
    monkeypatch.setitem(methods.METHODS, "tis", cap3)
    assert MethodConfig(name="tis").spec_hash() != before and space.run_config(base, space.grid()[0]).config_hash() == (
        space.run_config(base, space.grid()[0]).config_hash()
    )
    with pytest.raises(StudyFormatError, match=r"another definition of tis \(2 trials\).*new --name"):
        changed_definitions(open_study("s", storage), space, spec_of)


@pytest.mark.parametrize(
    "env,needle",
    [
        ({"COPC_HEARTBEAT_S": "0"}, "COPC_HEARTBEAT_S must be a whole number of seconds ≥ 1, got '0'"),
        ({"COPC_HEARTBEAT_GRACE_S": "2.5"}, "COPC_HEARTBEAT_GRACE_S must be a whole number of seconds ≥ 1"),
        ({"COPC_HEARTBEAT_S": "5", "COPC_HEARTBEAT_GRACE_S": "9"}, "(9) must be at least twice COPC_HEARTBEAT_S (5)"),
        ({"COPC_HEARTBEAT_S": "²"}, "COPC_HEARTBEAT_S must be a whole number of seconds ≥ 1, got '²'"),
    ],
)
def test_heartbeat_settings_come_from_the_environment_checked_before_anything_runs(tmp_path, monkeypatch, env, needle):
    from tests.test_cli import copc_here

    out = copc_here("sweep", "--steps", "1", "--seeds", "0", data_dir=tmp_path, **env)
    assert out.returncode == 2 and needle in out.stderr, out.stderr
    assert not (tmp_path / "optuna.db").exists() and not (tmp_path / "mlflow.db").exists()
    monkeypatch.setenv("COPC_HEARTBEAT_S", "2")
    monkeypatch.setenv("COPC_HEARTBEAT_GRACE_S", "7")
    sweep = open_study("beats", f"sqlite:///{tmp_path / 'beats.db'}")
    assert (sweep.storage.heartbeat_interval, sweep.storage.grace_period) == (2, 7)


def test_a_seed_may_pick_its_warm_start_and_a_study_keeps_the_choice_it_started_with(tmp_path):
    """`warm_start_per_seed`: a point's run config takes warm_start.seed = its seed (one cached warm start per seed;
    the held-out set stays as it was), off by default. A study records the choice with its first sweep; a sweep asking
    for the other is refused, since the point (method, bands, lag, seed) would count as done under either."""
    from copc_core.train.warmstart import warm_start_key
    from flows.prefect_flows import LOCAL_CALLER, SweepParams
    from sweeps.study import StudyFormatError, same_seed_scope

    base = tiny_config()
    one, per_seed = tiny_space(seeds=[0, 1]), tiny_space(seeds=[0, 1], warm_start_per_seed=True)
    configs = [per_seed.run_config(base, p) for p in per_seed.grid()]
    assert {(c.train.seed, c.warm_start.seed) for c in configs} == {(0, 0), (1, 1)}
    assert {c.task for c in configs} == {base.task}  # the held-out set is the task's: unchanged
    assert len({warm_start_key(c) for c in configs}) == 2
    assert len({warm_start_key(one.run_config(base, p)) for p in one.grid()}) == 1
    assert {one.run_config(base, p).warm_start.seed for p in one.grid()} == {base.warm_start.seed}

    storage = f"sqlite:///{tmp_path / 'scope.db'}"
    same_seed_scope(open_study("per-seed", storage), per_seed)
    same_seed_scope(open_study("per-seed", storage), per_seed)  # the same choice again: fine
    with pytest.raises(StudyFormatError, match="ran each seed its own warm start; .* Resume it with --warm-start-per"):
        same_seed_scope(open_study("per-seed", storage), one)
    older = open_study("older", storage)  # trials from before the choice was recorded: one warm start for all
    older.study.add_trial(optuna.trial.create_trial(value=0.5))
    with pytest.raises(StudyFormatError, match="ran one warm start for every seed; .* Resume it with --one-warm-start"):
        same_seed_scope(older, per_seed)
    assert older.study.user_attrs["warm_start_per_seed"] is False
    params = SweepParams.model_validate({"warm_start_per_seed": True, "seeds": [0, 1]}, context=LOCAL_CALLER)
    assert params.resolved()[1].warm_start_per_seed and not SweepParams().resolved()[1].warm_start_per_seed
