"""optuna-dashboard as a person sees it: `copc dashboard` served, the study's pages opened in headless Chromium.

The study page stayed blank while an API test passed: the API sent `"high": Infinity` (a band's range), which
Python's json reads and a browser's JSON.parse refuses. These tests read what the browser draws."""

import os
import signal
import subprocess
import sys
import time

import pytest

from copc_core.results import TrialResult
from sweeps.space import SweepSpace, objective_name
from sweeps.study import name_objective, open_study, pending_points, run_study
from tests.browser import page_text, require_chromium, screenshot, severe_errors, wait_for
from tests.stack_helpers import ROOT, free_port, start_dashboard
from tests.test_sweeps import summary

require_chromium()
pytestmark = pytest.mark.slow
OBJECTIVE = "final accuracy − 0.5 if collapsed"  # objective_name of the spaces below


def _tell(storage: str, space: SweepSpace) -> int:
    """Run the space's pending points with made-up results (objective = 0.5 + τ_a / 10 − seed / 100)."""
    sweep = open_study("dash", storage)
    name_objective(sweep, objective_name(space))
    points = pending_points(sweep, space)

    def finish(batch, on_result):
        for i, p in enumerate(batch):
            value = 0.5 + (p.tau_advantage or 0) / 10 - p.seed / 100
            on_result(i, TrialResult(summary(value), objective=value))

    run_study(sweep, points, finish)
    return len(points)


def _history_points(driver) -> int:
    """Markers the History plot draws for completed trials (plotly's drawn points, not the data sent)."""
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('#plot-history .scatterlayer .trace'))"
        "  .filter(g => g.__data__[0].trace.name.startsWith(arguments[0]))"
        "  .reduce((n, g) => n + g.querySelectorAll('.point').length, 0);",
        OBJECTIVE,
    )


def test_the_study_page_draws_history_importance_and_parallel_coordinates_and_grows(browser, tmp_path):
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    space = SweepSpace(
        methods=[{"name": "copc", "tau_policy": [1.5, float("inf")], "tau_advantage": [1.0, 2.0]}, "tis"],
        staleness=[32],
        seeds=[0, 1],
        steps=2,
    )
    told = _tell(storage, space)
    assert told == 10
    port = free_port()
    proc = start_dashboard(tmp_path, port)
    try:
        base = f"http://127.0.0.1:{port}/dashboard"
        wait_for(browser, lambda d: d.get(base) or "dash" in page_text(d), 120, "the study list")
        browser.get(f"{base}/studies/1")
        assert wait_for(browser, _history_points, 90, "History's points") == told
        text = wait_for(browser, lambda d: "Hyperparameter Importance" in page_text(d) and page_text(d), 60)
        assert objective_name(space) == OBJECTIVE and OBJECTIVE in text  # the objective by name, not "Objective 0"
        assert "History" in text and "Objective 0" not in text
        importance = wait_for(
            browser,
            lambda d: d.execute_script(
                "const p = Array.from(document.querySelectorAll('.js-plotly-plot'))"
                ".find(d => d._fullData && d._fullData.some(t => t.type === 'bar'));"
                "return p ? p._fullData[0].y : null;"
            ),
            60,
            "the importance bars",
        )
        assert {"staleness", "seed"} <= set(importance) or {"seed"} <= set(importance), importance
        screenshot(browser, "optuna-dashboard-study.png", tmp_path)
        # the study grows while the page is open: the new trials appear without a reload
        grown = space.model_copy(update={"seeds": [0, 1, 2]})
        added = _tell(storage, SweepSpace.model_validate(grown.model_dump()))
        assert added == 5
        assert wait_for(browser, lambda d: _history_points(d) == told + added, 90, "the grown History")
        # parallel coordinates of the bands, the lag and the seed against the objective
        browser.get(f"{base}/studies/1/smartSelection")
        text = wait_for(browser, lambda d: "Parallel Coordinate" in page_text(d) and page_text(d), 90)
        for axis in ("Param 1/tau_policy", "Param 1/tau_advantage", "Param staleness", "Param seed"):
            assert axis in text, text[:2000]

        def dimensions(d):
            return d.execute_script(
                "const p = document.getElementById('plot-parallel-coordinate');"
                "return p && p._fullData && p._fullData.length"
                "  ? p._fullData[0].dimensions.map(x => [x.label, x.values.length]) : null;"
            )

        n = told + added
        # the axes every trial has are drawn at once; a band (which TIS lacks) is one click away
        assert wait_for(browser, dimensions, 60) == [[OBJECTIVE, n], ["seed", n], ["staleness", n]]
        browser.find_element("xpath", "//*[normalize-space(text())='Param 1/tau_policy']").click()
        dims = wait_for(browser, lambda d: len(dimensions(d)) == 4 and dimensions(d), 30, "the τ_p axis")
        assert ["1/tau_policy", 12] in dims, dims  # the 12 COPC trials (2 × 2 bands × 3 seeds)
        screenshot(browser, "optuna-dashboard-parallel.png", tmp_path)
        assert severe_errors(browser) == []
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def test_an_older_study_is_named_with_the_command_that_migrates_it(tmp_path):
    """A study an older copc wrote (bands up to ∞) stays blank in the browser: `copc dashboard` says which and
    how to migrate it; `copc migrate-study` does, and the dashboard starts without the warning."""
    from tests.test_sweeps import _older_study

    _older_study(f"sqlite:///{tmp_path / 'optuna.db'}", "regime-search")
    env = dict(os.environ, COPC_DATA_DIR=str(tmp_path))

    def dashboard_warnings() -> str:
        port = free_port()
        proc = start_dashboard(tmp_path, port)
        deadline = time.monotonic() + 120
        out = ""
        while "optuna-dashboard of" not in out and time.monotonic() < deadline and proc.poll() is None:
            out += proc.stdout.readline()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert "optuna-dashboard of" in out, err[-2000:]
        return err

    assert "study 'regime-search'" in dashboard_warnings() and "copc migrate-study" in dashboard_warnings()
    migrated = subprocess.run(
        [sys.executable, "-m", "flows.cli", "migrate-study", "regime-search"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert migrated.returncode == 0 and "3 trial(s)" in migrated.stdout, migrated.stderr[-2000:]
    assert "warning" not in dashboard_warnings()
