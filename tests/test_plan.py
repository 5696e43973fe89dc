"""A sweep's plan (sweeps/plan.py) on a real Optuna study and MLflow store, and how the report marks its sections."""

import optuna
import pytest

from infra.tracking import Tracker, read_sweeps
from reports.plan import mark_sections
from sweeps.plan import plan_hash, record_plan, study_plans


def test_a_plan_is_versioned_on_the_study_with_the_runs_finished_before_it(tmp_path):
    study = optuna.create_study(study_name="s", storage=f"sqlite:///{tmp_path / 'o.db'}")
    v1 = record_plan(study, "read `coupling`")
    assert (v1.version, v1.runs_before, v1.sha256) == (1, 0, plan_hash("read `coupling`"))
    assert record_plan(study, "read `coupling`") == v1  # the same text: no new version
    study.add_trial(optuna.trial.create_trial(value=0.5))  # a finished trial
    v2 = record_plan(study, "read `coupling` and `late`")
    assert (v2.version, v2.runs_before) == (2, 1) and study_plans(study) == [v1, v2]
    with pytest.raises(ValueError, match="the plan is empty"):
        record_plan(study, " \n")


def test_mlflow_keeps_every_version_and_refuses_another_text_under_one(tmp_path):
    tracker = Tracker(f"sqlite:///{tmp_path / 'm.db'}", artifact_dir=tmp_path / "art")
    parent = tracker.parent_run("s", {})

    def version(n: int, text: str, runs_before: int) -> dict:
        return {"version": n, "sha256": plan_hash(text), "at": f"2026-12-06T0{n}:00:00+00:00", "text": text,
                "runs_before": runs_before}  # fmt: skip

    tracker.record_plans(parent, [version(1, "a", 0)])
    tracker.record_plans(parent, [version(1, "a", 0), version(2, "b", 4)])  # v1 again: unchanged
    plans = read_sweeps(tracker.uri, ["s"], [])["parents"][0]["plans"]
    assert [(p["version"], p["text"], p["runs_before"]) for p in plans] == [(1, "a", 0), (2, "b", 4)]
    assert tracker.client.get_run(parent).data.tags["plan_version"] == "2"
    with pytest.raises(ValueError, match="belongs to another study of the same name"):
        tracker.record_plans(parent, [version(1, "other", 0)])


def test_sections_are_marked_by_the_earliest_version_naming_them():
    plans = [
        {"sweep": "s", "version": 1, "runs_before": 0, "text": "`coupling`"},
        {"sweep": "s", "version": 2, "runs_before": 8, "text": "`coupling`, `late`"},
    ]
    parts = [
        "<h2>Summary</h2>",
        "<h2>Coupling analysis</h2>",
        "<h2>Late in training: survival</h2>",
        "<h2>Step time</h2>",
    ]
    marked = mark_sections(parts, plans)
    assert marked[0] == "<h2>Summary</h2>"  # not an analysis
    assert marked[1] == '<h2 data-analysis="coupling">Coupling analysis <span class="planned">planned</span></h2>'
    assert 'data-analysis="late"' in marked[2] and ">named after 8 runs</span>" in marked[2]
    assert ">exploratory</span>" in marked[3]
    assert mark_sections(parts, []) == parts  # no plan: nothing marked
