"""infra/tracking: a trial's run streamed while it trains, then finished; nothing logged twice, nothing lost."""

import pytest
from mlflow.tracking import MlflowClient

from copc_core.results import TrialResult
from infra.tracking import MetricStream, Tracker
from tests.conftest import tiny_config
from tests.test_sweeps import summary


def _records(n: int) -> tuple[list[dict], list[dict]]:
    history = [{"step": float(s), "reward/mean": s / 10} for s in range(1, n + 1)]
    evals = [{"step": float(s), "eval/accuracy": s / 20} for s in range(0, n + 1, 2)]
    return history, evals


def test_a_streamed_run_holds_every_step_once_after_it_is_finished(tmp_path, used_stores):
    uri = used_stores.mlflow(tmp_path / "mlflow.db")
    tracker = Tracker(uri)
    run_id = tracker.start_trial(None, None, "streamed", tiny_config())
    history, evals = _records(6)
    stream = MetricStream(uri, run_id, every_s=0.0)
    for n in (2, 4):  # the trainer's lists as they grow
        stream.send(history[:n], [e for e in evals if e["step"] <= n])
        client = MlflowClient(uri)
        assert len(client.get_metric_history(run_id, "reward/mean")) == n  # visible while it trains
        assert client.get_run(run_id).info.status == "RUNNING"
    sent = stream.close(history, evals)
    assert sent == (6, 4) and stream.error is None
    tracker.finish_trial(run_id, TrialResult(summary(0.5), history, evals, objective=0.5, streamed=sent))
    client = MlflowClient(uri)
    steps = sorted(m.step for m in client.get_metric_history(run_id, "reward/mean"))
    assert steps == [1, 2, 3, 4, 5, 6]
    assert sorted(m.step for m in client.get_metric_history(run_id, "eval/accuracy")) == [0, 2, 4, 6]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.metrics["summary/objective"] == 0.5


def test_a_store_that_refuses_the_stream_stops_it_and_the_finished_run_gets_every_record(tmp_path, capsys, used_stores):
    uri = used_stores.mlflow(tmp_path / "mlflow.db")
    tracker = Tracker(uri)
    run_id = tracker.start_trial(None, None, "refused", tiny_config())
    history, evals = _records(4)
    stream = MetricStream(uri, "no-such-run", every_s=0.0)  # the store refuses every batch for this run
    stream.send(history[:2], evals[:1])
    assert stream.error is not None and "no-such-run" in capsys.readouterr().err  # said, not swallowed
    sent = stream.close(history, evals)
    assert sent == (0, 0)  # nothing was sent: the sweep logs it all when the trial ends
    tracker.finish_trial(run_id, TrialResult(summary(0.5), history, evals, objective=0.5, streamed=sent))
    steps = sorted(m.step for m in MlflowClient(uri).get_metric_history(run_id, "reward/mean"))
    assert steps == [1, 2, 3, 4]


def test_the_stream_interval_is_read_from_the_environment_and_a_bad_one_refused(monkeypatch):
    from infra.tracking import stream_every_s

    monkeypatch.delenv("COPC_MLFLOW_STREAM_S", raising=False)
    assert stream_every_s() == 5.0
    monkeypatch.setenv("COPC_MLFLOW_STREAM_S", "0.5")
    assert stream_every_s() == 0.5
    for bad in ("-1", "nan", "inf", "soon"):
        monkeypatch.setenv("COPC_MLFLOW_STREAM_S", bad)
        with pytest.raises(ValueError, match="COPC_MLFLOW_STREAM_S"):
            stream_every_s()


def test_a_logged_result_of_another_method_definition_is_not_recovered_as_todays(tmp_path, used_stores):
    uri = used_stores.mlflow(tmp_path / "mlflow.db")
    tracker = Tracker(uri)
    parent = tracker.parent_run("s", {"space": {}, "base": {}})
    config = tiny_config()
    run_id = tracker.start_trial(parent, "s", "trial", config, "copc")
    tracker.finish_trial(run_id, TrialResult(summary(0.5), objective=0.5))
    key = (config.config_hash(), "copc")
    assert MlflowClient(uri).get_run(run_id).data.tags["method_spec"] == config.method.spec_hash()
    assert list(tracker.logged_trials(parent, {key: config.method.spec_hash()})) == [key]  # today's: recovered
    assert tracker.logged_trials(parent, {key: "another-spec"}) == {}  # the method changed since: runs again


def test_two_processes_closing_one_sweeps_parent_at_once_both_succeed(tmp_path, used_stores):
    """Two sweep processes on one study end together and both write its parent's note: MLflow's `set_tag` reads, then
    inserts, so the later of two at once failed on a UNIQUE constraint (~1 in 10 here); the tracker's tags go through
    `log_batch`, which retries that race. Threads stand in for the processes (one SQLite store, a client each)."""
    import threading

    uri = used_stores.mlflow(tmp_path / "mlflow.db")
    trackers = [Tracker(uri, artifact_dir=tmp_path / "a") for _ in range(2)]
    parents = [trackers[0].parent_run(f"s{i}", {}) for i in range(40)]
    start, errors = threading.Barrier(2), []

    def close_all(tracker: Tracker) -> None:
        for parent in parents:
            start.wait()
            try:
                tracker.finish_parent(parent, {"sweep/trials_complete": 1.0}, [{"method": "copc", "n": 1}])
            except Exception as err:  # noqa: BLE001 - every failure is the finding
                errors.append(str(err)[:300])

    threads = [threading.Thread(target=close_all, args=(t,)) for t in trackers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    client = MlflowClient(uri)
    for parent in parents:
        run = client.get_run(parent)
        assert run.info.status == "FINISHED" and run.data.tags["mlflow.note.content"].startswith("| method |")
