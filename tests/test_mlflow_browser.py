"""MLflow as a person sees it: the links the platform prints and writes, opened in headless Chromium with a fresh
profile (empty localStorage, as a new visitor) against a real MLflow server.

MLflow 3.17 opened them in its GenAI view (Overview / Traces / "Detect issues"), the sweep's runs collapsed under
their parent behind columns of Created / Dataset / Duration / Source, and its chart view on whatever metric came
first. The links now name the training view and the sweep's shared view (infra/tracking.py)."""

import pytest

from copc_core.results import TrialResult
from infra.tracking import Tracker, run_url, sweep_url
from tests.browser import page_text, require_chromium, screenshot, severe_errors, wait_for
from tests.stack_helpers import mlflow_server
from tests.test_sweeps import summary, tiny_space

require_chromium()
pytestmark = pytest.mark.slow
GENAI = ("Detect issues", "Observability", "Judges")  # the GenAI sidebar's entries


def _logged_sweep(uri: str) -> tuple[Tracker, str, dict[str, str]]:
    """A sweep of four trials logged as `copc sweep` logs them: returns the tracker, the parent run id and the
    run name → objective."""
    space = tiny_space(tau_policy=[2.0, float("inf")], tau_advantage=[1.0, 2.0], staleness=[32])
    tracker = Tracker(uri)
    parent = tracker.parent_run("look", {"space": space.model_dump(mode="json")})
    tracker.sweep_view("look")
    objectives = {}
    base = space.run_config(__import__("copc_core.config", fromlist=["RunConfig"]).RunConfig(), space.grid()[0])
    for i, p in enumerate(space.grid()):
        name = p.label()
        objectives[name] = 0.5 + 0.1 * i
        history = [{"step": float(s), "reward/mean": 0.1 * s} for s in range(1, 6)]
        result = TrialResult(summary(objectives[name]), history, [], objective=objectives[name])
        tracker.log_trial(parent, "look", name, space.run_config(base, p), result, label=p.method)
    table = [{"method": "copc", "tau_policy": "inf", "tau_advantage": 2.0, "objective_mean": 0.8}]  # a cell
    tracker.finish_parent(parent, {"sweep/trials_complete": 4.0}, table)
    return tracker, parent, objectives


def close_assistant(driver) -> None:
    """Close MLflow's assistant panel, which a first visit opens beside the runs (as a person would: its ×)."""
    for button in driver.find_elements("css selector", '[data-component-id="mlflow.assistant.chat_panel.close"]'):
        button.click()


def test_the_sweep_link_opens_its_runs_as_training_runs_with_the_points_columns_best_first(browser, tmp_path):
    with mlflow_server(tmp_path) as uri:
        tracker, parent, objectives = _logged_sweep(uri)
        exp = tracker.experiment_id
        browser.get(sweep_url(uri, exp, "look"))
        rows = wait_for(
            browser,
            lambda d: d.execute_script(
                "const r = Array.from(document.querySelectorAll('.ag-center-cols-container .ag-row, "
                ".ag-pinned-left-cols-container .ag-row'));"
                "return r.length ? document.querySelectorAll('[role=row] a').length : 0;"
            ),
            120,
            "the sweep's runs",
        )
        text = page_text(browser)
        assert not any(g in text for g in GENAI), text[:1500]  # the training view, not GenAI
        heads = browser.execute_script(
            "return Array.from(document.querySelectorAll('[role=columnheader]')).map(e => e.innerText.trim())"
        )
        for column in ("Run Name", "point.method", "point.tau_policy", "point.tau_advantage", "train.staleness"):
            assert column in heads, heads
        assert "summary/objective" in heads, heads
        names = browser.execute_script(
            "return Array.from(document.querySelectorAll('[role=row] a')).map(a => a.innerText.trim())"
            ".filter(t => t.length)"
        )
        trials = [n for n in names if n in objectives]
        assert rows and trials == sorted(objectives, key=objectives.get, reverse=True), names  # best first
        assert "look" not in names  # the parent run is not among its trials
        assert "copc tp=inf ta=2 k=32 s=0" in trials  # the run name carries the point, ∞ included
        cells = browser.execute_script(
            "return Array.from(document.querySelectorAll('[role=row]')).map(r => r.innerText.replace(/\\s+/g, ' '))"
        )
        assert any("copc" in c and "τp=∞" in c and "τa=2" in c for c in cells), cells
        close_assistant(browser)
        screenshot(browser, "mlflow-sweep-runs.png", tmp_path)
        # the chart view opens on the objective against the bands, before MLflow's per-metric charts
        browser.get(sweep_url(uri, exp, "look", charts=True))
        text = wait_for(
            browser,
            lambda d: "Parallel Coordinates" in page_text(d) and "train.staleness" in page_text(d) and page_text(d),
            60,
            "the sweep's parallel coordinates",
        )
        # its section comes first, before MLflow's own per-metric sections ("reward", "summary")
        at = text.index("Sweep: objective against the bands")
        assert at < text.index("\nreward\n") and at < text.index("Parallel Coordinates") < text.index("\nreward\n")
        chart = text[at : text.index("\nreward\n")]
        # every point is drawn (∞ included: the bands are text axes), the objective the last axis
        assert "Showing all runs" in chart and "τp=∞" in chart and "τp=2" in chart, chart
        assert chart.rstrip().endswith("summary/objective") and "point.method" in chart, chart  # full labels
        screenshot(browser, "mlflow-sweep-charts.png", tmp_path)
        # a run link: the run's page in the training view
        browser.get(run_url(uri, exp, parent))
        text = wait_for(browser, lambda d: "Model metrics" in page_text(d) and page_text(d), 60, "the run page")
        assert "look" in text and not any(g in text for g in GENAI), text[:1500]
        # its description is the sweep's per-cell table (the note tag, rendered as a table), and a trial's says its run
        table = "Description\nmethod tau_policy tau_advantage objective_mean\ncopc inf 2 0.8\n"
        wait_for(browser, lambda d: table in page_text(d), 60, "the sweep's table as the run's description")
        trial = tracker.client.search_runs([exp], "tags.copc_kind = 'trial'", max_results=1)[0]
        browser.get(run_url(uri, exp, trial.info.run_id))
        note = f"Description\n{trial.info.run_name}: 2 learner steps, evaluated every"
        wait_for(browser, lambda d: note in page_text(d), 60, "a trial's note as its description")
        assert severe_errors(browser) == [] or all("users/current" in e["message"] for e in severe_errors(browser))
