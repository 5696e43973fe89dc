"""A generated report opened from a file in real headless Chromium (Debian `chromium` + `chromium-driver`).

Skipped where no Chromium is installed, except under CI (`CI` set), where `.ci/run` installs it and a
missing browser is a failure.
"""

import os
import pathlib

import pytest

from reports.html import render
from tests.browser import require_chromium
from tests.test_reports import sample_report

require_chromium()
pytestmark = pytest.mark.slow
NAME = "<script>window.__pwned=1</script>"


def test_report_renders_every_figure_without_errors_offline(browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    page = render(sample_report(NAME))
    path = tmp_path / "report.html"
    path.write_text(page, encoding="utf-8")
    browser.get(path.as_uri())
    expected = page.count('class="plotly-graph-div"')
    assert expected >= 7  # heatmap, interaction lines, contrasts, region, curves, diagnostics, step time

    def rendered(driver):
        return driver.execute_script(
            "return Array.from(document.querySelectorAll('.plotly-graph-div'))"
            ".filter(d => d.querySelector('svg.main-svg') && d._fullLayout).length"
        )

    WebDriverWait(browser, 60).until(lambda d: rendered(d) == expected)
    traces = browser.execute_script(
        "return Array.from(document.querySelectorAll('.plotly-graph-div')).map(d => d.data.length)"
    )
    assert len(traces) == expected and all(n > 0 for n in traces)
    # the decoded heatmap (plotly ships typed arrays) holds the 3 × 3 seed means, annotated in the SVG
    z = browser.execute_script(
        "return Array.from(document.getElementById('heatmap-0')._fullData[0].z, r => Array.from(r))"
    )
    assert [[round(v, 6) for v in row] for row in z] == [[0.5, 0.55, 0.6], [0.6, 0.73, 0.86], [0.7, 0.91, 1.12]]
    labels = browser.execute_script(
        "return document.querySelectorAll('#heatmap-0 g.text-annotation, #heatmap-0 .heatmaplayer text').length"
    )
    assert labels >= 9
    # coloured over the report's cells, α = 0.5 to the objective's top 1 (α + 2β + 2γ + 4c = 1.12 lies past it);
    # the second button puts every panel on −1..1
    scale = "return document.getElementById('heatmap-0')._fullData.map(t => [t.zmin, t.zmax])"
    assert browser.execute_script(scale) == [[0.5, 1.0], [0.5, 1.0]]
    whole = browser.find_elements(By.CSS_SELECTOR, "#heatmap-0 g.updatemenu-button")[1]
    assert "whole objective" in whole.text
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", whole)
    whole.click()
    WebDriverWait(browser, 10).until(lambda d: d.execute_script(scale) == [[-1, 1], [-1, 1]])
    # the interaction plot's three τ_a lines stand side by side at each τ_p (dodged), so their bars do not hide each
    # other: the first panel's first three points (τ_p 1.5 of τ_a 1, 2, 4) at three pixel positions, left to right
    xs = browser.execute_script(
        "return Array.from(document.querySelectorAll('#interaction-0 .subplot.xy .trace.scatter'), t =>"
        " parseFloat(t.querySelector('path.point').getAttribute('transform').slice(10)))"
    )
    assert len(xs) == 3 and xs[0] < xs[1] < xs[2], xs
    # the performance profiles are drawn: one line per method and lag (the sample's 3 × 3 grid at k = 0 and 4, by its
    # selection-free picks), a staircase down from every run above τ = 0
    profiles = browser.execute_script(
        "return document.getElementById('profiles')._fullData.map(t => [t.name, Array.from(t.y)])"
    )
    assert len(profiles) == 2 and all(y[0] == 1 and y == sorted(y, reverse=True) for _, y in profiles)
    assert {name for name, _ in profiles} == {"copc (tuned over 9 cells)"}
    assert browser.execute_script("return document.querySelectorAll('#profiles path.js-line').length") >= len(profiles)
    # the per-method learning curves: the grid's picked cell on every seed is its best, τ_p 4 τ_a 4 (i = a = 2 of the
    # sample's history: 0.3 + 0.1·i, 0.5, then 0.6 − 0.1·a and 0.6 − 0.2·a at k > 0), drawn as the mean of its runs
    lines = browser.execute_script(
        "return document.getElementById('method-curves')._fullData.filter(t => t.line.width === 2)"
        ".map(t => [t.xaxis, Array.from(t.y)])"  # the mean lines (the band's edges have width 0)
    )
    assert [(axis, [round(v, 6) for v in y]) for axis, y in lines] == [
        ("x", [0.5, 0.5, 0.6, 0.6]),
        ("x2", [0.5, 0.5, 0.4, 0.2]),
    ]
    spread = "return document.getElementById('method-curves').data.filter(t => t.meta === 'spread').map(t => t.visible)"
    assert browser.execute_script(spread) == [True] * 4  # one method: its band shown; "means" hides it
    means = browser.find_elements(By.CSS_SELECTOR, "#method-curves g.updatemenu-button")[0]
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", means)
    means.click()
    WebDriverWait(browser, 10).until(lambda d: d.execute_script(spread) == [False] * 4)
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == [], errors
    # a run named <script>…</script> is shown as text and never runs
    assert browser.execute_script("return window.__pwned === undefined")
    table_text = browser.find_element(By.ID, "runs").text
    assert NAME in table_text
    shot = pathlib.Path(os.environ.get("COPC_SCREENSHOT_DIR", tmp_path)) / "report.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000


def test_bias_variance_page_renders_its_heatmaps_and_optimum_markers(browser, tmp_path):
    from selenium.webdriver.support.ui import WebDriverWait

    from reports.bias_variance import METRICS
    from reports.bias_variance import render as render_bv
    from tests.test_bias_variance_report import coupled, records

    path = tmp_path / "analysis.html"
    path.write_text(render_bv(records(coupled, staleness=(0.25, 1.0)), {"method": NAME}), encoding="utf-8")
    browser.get(path.as_uri())
    expected = 1 + len(METRICS)
    WebDriverWait(browser, 60).until(
        lambda d: (
            d.execute_script(
                "return Array.from(document.querySelectorAll('.plotly-graph-div'))"
                ".filter(d => d.querySelector('svg.main-svg') && d._fullLayout).length"
            )
            == expected
        )
    )
    marks = browser.execute_script(
        "return document.getElementById('bv-mse').data.filter(t => t.name === 'best τ_p per τ_a').map(t => t.y)"
    )
    assert marks == [["1.25", "2", "3"], ["1.25", "2", "3"]]
    points = browser.execute_script("return document.querySelectorAll('#bv-mse .scatterlayer .point').length")
    assert points == 2 * (3 + 1)  # three ○ and one ★ per staleness panel, drawn
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
    assert browser.execute_script("return window.__pwned === undefined")
    shot = pathlib.Path(os.environ.get("COPC_SCREENSHOT_DIR", tmp_path)) / "analysis.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000


def test_report_beside_one_plotly_copy_outlines_the_best_cells_and_sorts_its_tables(browser, tmp_path):
    """The report as `build_report` writes it (plotly.js a file beside it, not inlined): the best cell of each
    heatmap panel is outlined in the drawn SVG, and a click on a column header sorts the runs table."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from reports.build import write_plotly_beside

    path = tmp_path / "report.html"
    plotly = write_plotly_beside(path)
    path.write_text(render(sample_report(NAME), plotly.name), encoding="utf-8")
    assert path.stat().st_size < 1_000_000
    browser.get(path.as_uri())
    WebDriverWait(browser, 60).until(
        lambda d: d.execute_script(
            "var d = document.getElementById('heatmap-0'); return d !== null && d._fullLayout !== undefined"
        )
    )
    # sample_report's grid is bilinear: the best cell of each k panel is (τ_p 4, τ_a 4), one outline per panel
    shapes = browser.execute_script("return document.querySelectorAll('#heatmap-0 .shapelayer path').length")
    panels = browser.execute_script("return document.getElementById('heatmap-0').data.length")
    assert shapes == panels >= 2
    table = browser.find_element(By.ID, "runs")
    headers = table.find_elements(By.TAG_NAME, "th")
    seed_col = [h.text for h in headers].index("seed")

    def column():
        return browser.execute_script(
            f"return Array.from(document.querySelectorAll('#runs tbody tr')).map(r => r.cells[{seed_col}].innerText)"
        )

    headers[seed_col].click()
    up = column()
    headers[seed_col].click()
    down = column()
    assert up == sorted(up, key=float) and down == sorted(down, key=float, reverse=True) and up != down
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


def _reading_report(tmp_path):
    """A sweep as the issue saw it: COPC at τ_p ∈ {1.5, ∞} × τ_a ∈ {1, 2} with cells 0.004 apart, TIS (no band),
    a critic whose explained variance after warm-up is below 0, long run names; plotly.js beside the page."""
    from reports.build import write_plotly_beside
    from reports.frames import curves_frame
    from reports.html import ReportData
    from tests.report_records import INF, trial
    from tests.test_reports import frame

    records = []
    for s in range(2):
        for i, (tp, ta) in enumerate([(1.5, 1.0), (1.5, 2.0), (INF, 1.0), (INF, 2.0)]):
            name = f"copc tp={tp:g} ta={ta:g} k=32 s={s} (a long run name, as a user may give one)"
            records.append(trial(f"c{i}{s}", tp, ta, 32, s, 0.238 + 0.001 * i + 0.002 * s, run_name=name))
        records.append(trial(f"t{s}", None, None, 32, s, 0.232, method="tis"))
    for r in records:
        r["metrics"] |= {
            "summary/critic_warmup_explained_var": -3.976,
            "summary/critic_explained_var_first": 0.196,
            "summary/kl_step_mean": 0.00097,
            "summary/ratio_in_band_mean": 0.871,
        }
    reason = (  # a Ray error names a log file: a long word a table cannot break
        "RayTaskError(OSError): ray::_train_trial() failed; see "
        "/tmp/ray/session_2026-12-06_05-59-31_123456_11316/logs/worker-0f3e9c2a7b.err"
    )
    records.append(trial("f", 1.5, 1.0, 32, 2, None, fail_reason=reason))
    path = tmp_path / "reading.html"
    plotly = write_plotly_beside(path)
    path.write_text(render(ReportData(title="t", runs=frame(records), curves=curves_frame(records)), plotly.name))
    return path, plotly


def test_the_report_reads_right_at_1400_px_and_says_when_plotly_js_is_missing(browser, tmp_path):
    """Point 5 of the issue, as the browser shows it: no sideways overflow at 1,400 px, τ_p = ∞ named, the
    interaction plot not stretching a 0.004 gap over its height, a sentence under every figure, the critic's
    explained variance explained, no train collapse invented; and a page without its plotly.min.js says so."""
    from tests.browser import page_text, screenshot, severe_errors, wait_for

    path, plotly = _reading_report(tmp_path)
    browser.set_window_size(1400, 1000)
    browser.get(path.as_uri())
    figures = wait_for(
        browser,
        lambda d: d.execute_script(
            "const f = Array.from(document.querySelectorAll('.plotly-graph-div'));"
            "return f.length && f.every(d => d._fullLayout) ? f.length : 0;"
        ),
        60,
        "the figures",
    )
    width, client = browser.execute_script(
        "return [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
    )
    assert width <= client, f"the page is {width} px wide in a {client} px window"
    text = page_text(browser)
    summary = browser.find_element("id", "summary").text
    assert "copc τp=∞ τa=2" in summary and "copc τa=" not in text, summary
    low, high = browser.execute_script("return document.getElementById('interaction-0')._fullLayout.yaxis.range")
    assert high - low >= 0.2, (low, high)  # the cells span 0.238–0.243
    captions = browser.execute_script(
        "return Array.from(document.querySelectorAll('.figure')).map(f => [f.querySelectorAll('.plotly-graph-div')"
        ".length, (f.querySelector('.caption') || {innerText: ''}).innerText])"
    )
    assert len(captions) == figures and all(n == 1 and len(c) > 60 for n, c in captions), captions
    assert "0 no better than predicting the mean return, below 0 (in red) worse than that" in text
    red = browser.execute_script("return Array.from(document.querySelectorAll('#runs span.bad')).map(s => s.innerText)")
    assert red == ["-3.976"] * 10
    runs = browser.find_element("id", "runs")
    heads = [h.text.replace("\n", " ") for h in runs.find_elements("tag name", "th")]
    train = heads.index("train collapse")
    column = browser.execute_script(
        f"return Array.from(document.querySelectorAll('#runs tbody tr')).map(r => r.cells[{train}].innerText)"
    )
    assert column == ["—"] * 11
    assert severe_errors(browser) == []
    screenshot(browser, "report.png", tmp_path)
    # the same page without plotly.min.js beside it: a note at the top and in every figure's place
    plotly.unlink()
    browser.get(path.as_uri())
    note = wait_for(browser, lambda d: d.find_element("id", "plotly-missing").is_displayed(), 30, "the note")
    assert note and "plotly.js" in browser.find_element("id", "plotly-missing").text
    unshown = browser.execute_script(
        "return Array.from(document.querySelectorAll('.plotly-graph-div')).filter(d => "
        "d.innerText.includes('not drawn')).length"
    )
    assert unshown == figures


def test_late_training_section_draws_the_survival_steps_and_the_collapse_table(browser, tmp_path):
    """The long study's panel as a person sees it: each method's survival line drawn through the Kaplan–Meier steps
    (derived by hand in tests/test_reports.py), the collapse steps and intervals in the table beside it."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from reports.frames import curves_frame
    from reports.html import ReportData
    from tests.test_reports import frame, late_records

    records = late_records()
    path = tmp_path / "late.html"
    path.write_text(render(ReportData("Late", frame(records), curves_frame(records), n_boot=200)), encoding="utf-8")
    browser.get_log("browser")  # drained: the module's browser holds the earlier tests' console lines
    browser.get(path.as_uri())
    WebDriverWait(browser, 60).until(
        lambda d: d.execute_script("const s = document.getElementById('survival'); return !!(s && s._fullLayout)")
    )
    lines = browser.execute_script(
        "return document.getElementById('survival')._fullData"
        ".map(t => [t.name, Array.from(t.x), Array.from(t.y).map(v => Math.round(v * 1e6) / 1e6)])"
    )
    assert lines == [["copc", [0, 300, 700, 1000], [1, 0.8, 0.533333, 0.533333]], ["tis", [0, 1000], [1, 1]]]
    drawn = browser.execute_script(
        "return document.querySelectorAll('#survival .scatterlayer .trace path.js-line').length"
    )
    assert drawn == 2
    text = browser.find_element(By.ID, "late").text
    assert "300, 700" in text and "-0.100 [-0.100, -0.100]" in text
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
    browser.execute_script("document.getElementById('survival').scrollIntoView()")
    shot = pathlib.Path(os.environ.get("COPC_SCREENSHOT_DIR", tmp_path)) / "late.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000


def _planned_sweep(tmp_path, monkeypatch, stores, v1: str, v2: str) -> tuple[str, str, list[bool]]:
    """Sweep "planned" (COPC's 2 × 2 grid) run under plan v1 on seed 0, grown by seed 1 under v2, then run again under
    v2; each trial a made-up result (no training, no Ray). Returns the stores and, per run that trained, whether the
    study had no plan yet when its trials were asked."""
    import optuna

    import infra.ray_runtime
    from copc_core.results import TrialResult
    from flows.sweep_job import run_sweep
    from infra import sweep_runs
    from sweeps.space import SweepSpace
    from tests.conftest import tiny_config
    from tests.test_sweeps import summary

    storage, tracking = f"sqlite:///{tmp_path / 'optuna.db'}", stores.mlflow(tmp_path / "mlflow.db")
    asked_before_plan = []

    def fake_trials(configs, cache, done, max_parallel=None, on_start=None):
        study = optuna.load_study(study_name="planned", storage=storage)
        asked_before_plan.append("plans" not in study.user_attrs)
        for i, config in enumerate(configs):
            on_start(i)
            value = 0.5 + config.method.tau_policy / 10 - config.method.tau_advantage / 20 + config.train.seed / 100
            done(i, TrialResult(summary(value), objective=value))

    monkeypatch.setattr(sweep_runs, "run_trials", fake_trials)
    monkeypatch.setattr(infra.ray_runtime, "init_ray", lambda **kw: None)
    monkeypatch.setattr("flows.sweep_job.warm_cache", lambda configs, cache: None)
    space = SweepSpace(methods=[{"name": "copc", "tau_policy": [2.0, 4.0], "tau_advantage": [1.0, 2.0]}], seeds=[0])
    run = dict(base=tiny_config(), data=tmp_path, storage=storage, tracking=tracking)
    run_sweep(space, "planned", plan=v1, **run)
    grown = space.model_copy(update={"seeds": [0, 1]})
    run_sweep(grown, "planned", plan=v2, **run)
    run_sweep(grown, "planned", plan=v2, **run)  # the same plan: no new version, no point left to run
    return storage, tracking, asked_before_plan


def test_a_planned_sweep_round_trips_its_plan_through_optuna_mlflow_and_the_report(
    browser, tmp_path, monkeypatch, used_stores
):
    """`--plan` before the data: v1 is on the study and the MLflow parent before the first trial, each trial carries
    the version it ran under; a changed plan is v2 beside v1; the same plan again adds nothing. The report (read from
    MLflow alone) lists both versions with the runs before and under each, shows the latest text, and marks the
    sections v1 names planned, the one only v2 names "named after 8 runs", the others exploratory — read in Chromium."""
    import hashlib

    import optuna
    from mlflow.tracking import MlflowClient
    from selenium.webdriver.common.by import By

    from reports.build import build_report
    from tests.browser import wait_for

    v1 = "# Plan\nRead `coupling` and `late`; collapse is counted apart.\n"
    v2 = v1 + "Added before seed 1: `methods`.\n"
    storage, tracking, asked_before_plan = _planned_sweep(tmp_path, monkeypatch, used_stores, v1, v2)
    assert asked_before_plan == [False, False]  # the plan was on the study before any trial ran
    study = optuna.load_study(study_name="planned", storage=storage)
    plans = study.user_attrs["plans"]
    assert [(p["version"], p["text"], p["sha256"]) for p in plans] == [
        (1, v1, hashlib.sha256(v1.encode()).hexdigest()),
        (2, v2, hashlib.sha256(v2.encode()).hexdigest()),
    ]
    versions = sorted((t.params["seed"], t.user_attrs["plan_version"]) for t in study.trials)
    assert versions == [(0, "1")] * 8 + [(1, "2")] * 8  # 2 × 2 bands × the default lags 0 and 4, per seed
    client = MlflowClient(tracking)
    (parent,) = client.search_runs(["1"], "tags.copc_kind = 'sweep'")
    assert parent.data.tags["plan_version"] == "2" and parent.data.tags["plan.v1.sha256"] == plans[0]["sha256"]
    for v, text in ((1, v1), (2, v2)):
        path = client.download_artifacts(parent.info.run_id, f"plan/v{v}.md", str(tmp_path))
        assert pathlib.Path(path).read_text() == text
    trial_tags = sorted(r.data.tags["plan_version"] for r in client.search_runs(["1"], "tags.copc_kind = 'trial'"))
    assert trial_tags == ["1"] * 8 + ["2"] * 8

    report = build_report(tracking, ["planned"], tmp_path / "reports" / "planned.html")
    assert '<table id="plans">' in report.read_text()  # in the file; then in the browser, waited for: in one full
    browser.get(report.as_uri())  # run the table read empty there (on a timeout the page's text shows why)
    found = wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#plans tr")[1:], 30, "the plan table")
    rows = [r.text.split() for r in found]
    assert [r[:2] + r[-2:] for r in rows] == [["planned", "v1", "0", "8"], ["planned", "v2", "8", "8"]]
    assert browser.find_element(By.CSS_SELECTOR, "pre.plan").text == v2.strip()
    marks = {
        h.get_attribute("data-analysis"): h.find_element(By.CSS_SELECTOR, "span").text
        for h in browser.find_elements(By.CSS_SELECTOR, "h2[data-analysis]")
    }
    assert marks["coupling"] == marks["late"] == "planned"  # named in v1, before any run finished
    assert marks["methods"] == "named after 8 runs"  # named first in v2, after seed 0's runs: not planned
    assert marks["heatmaps"] == marks["best"] == "exploratory"
    shot = pathlib.Path(os.environ.get("COPC_SCREENSHOT_DIR", tmp_path)) / "report-plan.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000


def test_probability_of_improvement_reads_as_a_reading_by_baseline_matrix_per_lag(browser, tmp_path):
    """The aggregates' P(a run of the reading ends above a run of the baseline), as a reader sees it: a table per k, a
    reading a row, a baseline a column, each with its interval. COPC's finals (0.7, 0.8, 0.75, 0.7, 0.9) against TIS's
    (0.6, 0.1, 0.9, 0.65, 0.7): above in 18 of the 25 pairs, tied in 3, so 19.5 / 25 = 0.780; against CISPO's 0.5 on
    every seed, 1.000; at k = 8 only TIS ran beside COPC at 0.65: above 0.6 and 0.1, tied with 0.65, 0.500."""
    from selenium.webdriver.common.by import By

    from reports.frames import curves_frame
    from reports.html import ReportData
    from tests.report_records import trial
    from tests.test_reports import frame

    copc, tis = [0.7, 0.8, 0.75, 0.7, 0.9], [0.6, 0.1, 0.9, 0.65, 0.7]
    records = [trial(f"c{s}", 2.0, 1.0, 4, s, v) for s, v in enumerate(copc)]
    records += [trial(f"t{s}", None, None, 4, s, v, method="tis") for s, v in enumerate(tis)]
    records += [trial(f"x{s}", None, None, 4, s, 0.5, method="cispo") for s in range(5)]
    records += [trial(f"c8-{s}", 2.0, 1.0, 8, s, 0.65) for s in range(5)]
    records += [trial(f"t8-{s}", None, None, 8, s, v, method="tis") for s, v in enumerate(tis)]
    data = ReportData(title="matrix", runs=frame(records), curves=curves_frame(records), sources={}, n_boot=300)
    path = tmp_path / "report.html"
    path.write_text(render(data), encoding="utf-8")
    browser.get(path.as_uri())

    def rows(table_id):
        table = browser.find_element(By.ID, table_id)
        browser.execute_script("arguments[0].scrollIntoView()", table)
        return [
            [c.text for c in r.find_elements(By.CSS_SELECTOR, "th, td")] for r in table.find_elements(By.TAG_NAME, "tr")
        ]

    def p(xs, ys):  # P(X > Y) + ½ P(X = Y) over every pair, by its definition
        return sum((x > y) + 0.5 * (x == y) for x in xs for y in ys) / (len(xs) * len(ys))

    assert (p(copc, tis), p(copc, [0.5] * 5), p([0.65] * 5, tis)) == (0.78, 1.0, 0.5)  # as counted above
    at4, at8 = rows("improvement-4"), rows("improvement-8")
    assert at4[0] == ["two-channel method", "cispo", "tis"] and [r[0] for r in at4[1:]] == ["copc"]
    assert [cell.split(" [")[0] for cell in at4[1][1:]] == [f"{p(copc, [0.5] * 5):.3f}", f"{p(copc, tis):.3f}"]
    assert at8 == [["two-channel method", "tis"], ["copc", at8[1][1]]]
    assert at8[1][1].split(" [")[0] == f"{p([0.65] * 5, tis):.3f}"
    assert all("[" in cell for row in (at4[1][1:], at8[1][1:]) for cell in row)  # each with its interval
    # the same as a matrix figure, a panel per k, every cell drawn
    drawn = browser.execute_script(
        "return document.getElementById('improvement')._fullData.map(t => [t.name, t.x, t.y, t.z])"
    )
    assert [(name, x, y) for name, x, y, _ in drawn] == [
        ("k = 4", ["cispo", "tis"], ["copc"]),
        ("k = 8", ["tis"], ["copc"]),
    ]
    assert drawn[0][3][0] == pytest.approx([p(copc, [0.5] * 5), p(copc, tis)]) and drawn[1][3][0] == pytest.approx(
        [0.5]
    )
    assert browser.execute_script("return document.querySelectorAll('#improvement .hm image').length") == 2
    text = browser.execute_script("return document.getElementById('improvement')._fullData[0].text")
    # above CISPO in every pair (its interval [1, 1] leaves ½ out: bold); above TIS at 0.78, its interval holding ½
    assert [cell.split("<br>")[0] for cell in text[0]] == [f"<b>{p(copc, [0.5] * 5):.2f}</b>", f"{p(copc, tis):.2f}"]
    low, high = browser.execute_script("return document.getElementById('improvement')._fullLayout.yaxis.range")
    assert low > high  # the axis runs downward: the readings top down, as the tables list them
    assert [r[0] for r in rows("iqm-table")[1:]] == ["copc", "tis", "cispo", "copc", "tis"]  # as the figure: best first
    # the IQM interval plot: scipy's 25 % trimmed mean drops one run from each end of five (COPC at k = 4: 0.7, 0.75,
    # 0.8 kept, 0.75; TIS 0.6, 0.65, 0.7, 0.65; CISPO 0.5), each panel best on top (a tie alphabetical from the top)
    iqm = browser.execute_script("return document.getElementById('iqm')._fullData.map(t => [Array.from(t.x), t.y])")
    assert iqm[0][1] == ["cispo", "tis", "copc"] and iqm[0][0] == pytest.approx([0.5, 0.65, 0.75])
    assert iqm[1][1] == ["tis", "copc"] and iqm[1][0] == pytest.approx([0.65, 0.65])
    assert browser.execute_script("return document.querySelectorAll('#iqm .points path.point').length") == 5


def test_improvement_panels_keep_the_baselines_names_clear_of_the_next_lag(browser, tmp_path):
    """Three readings against the registry's 13 baselines at two lags (the regime reports' shape): the upper panel's
    slanted baseline names end above the lower panel's title, which ends above its cells (at 48 px a reading, the
    tool-math report's k = 8 names ran under the k = 32 title)."""
    from reports.frames import curves_frame
    from reports.html import ReportData
    from tests.report_records import trial
    from tests.test_reports import frame

    baselines = (
        "a3po async_ppo async_ppo_recompute cispo decoupled_ppo geo_rs icepop m2po seq_mis seq_tis tis vcpo vtrace"
    )
    records = [
        trial(f"{m}-{k}-{s}", None, None, k, s, 0.5 + 0.01 * s + 0.001 * i, method=m)
        for i, m in enumerate(baselines.split())
        for k in (8, 32)
        for s in range(3)
    ]
    records += [
        trial(f"{r}-{k}-{s}-{tp}-{ta}", tp, ta, k, s, 0.6 - 0.01 * s, method=f"copc[{r}]")
        for r in ("behavior", "interpolated", "recomputed")
        for k in (8, 32)
        for s in range(3)
        for tp in (1.5, 4.0)
        for ta in (1.0, 2.0)
    ]
    data = ReportData(title="panels", runs=frame(records), curves=curves_frame(records), sources={}, n_boot=50)
    path = tmp_path / "report.html"
    path.write_text(render(data), encoding="utf-8")
    browser.set_window_size(1400, 1000)
    browser.get(path.as_uri())
    boxes = browser.execute_script(
        """const f = document.getElementById('improvement');
        f.scrollIntoView();
        const box = e => e.getBoundingClientRect();
        const title = [...f.querySelectorAll('.annotation-text')].find(a => a.textContent === 'k = 32');
        return {names: [...f.querySelectorAll('.xtick text')].map(t => [t.textContent, box(t).top, box(t).bottom]),
                title: [box(title).top, box(title).bottom],
                cells: [...f.querySelectorAll('.hm image')].map(i => box(i).top)};"""
    )
    first_panel = boxes["names"][:13]  # the k = 8 panel's axis comes first
    assert [name for name, _, _ in first_panel] == baselines.split()
    assert max(bottom for _, _, bottom in first_panel) < boxes["title"][0]
    assert boxes["title"][1] <= sorted(boxes["cells"])[1]  # the k = 32 cells start under their title


def test_a_wide_claims_table_scrolls_in_its_box_not_the_page(browser, tmp_path):
    """The claims section's Markdown tables (a reading against 13 baselines is ~1,400 px wide) scroll inside their
    own box: the page is no wider than the window."""
    from reports.html import markdown_html, page

    wide = "\n".join(
        ["| reading | " + " | ".join(f"baseline_{i}" for i in range(20)) + " |", "|---" * 21 + "|"]
        + ["| copc[interpolated] | " + " | ".join("+0.03 [-0.02, +0.08] (5)" for _ in range(20)) + " |"]
    )
    path = tmp_path / "wide.html"
    path.write_text(page("wide", [markdown_html(wide)]), encoding="utf-8")
    browser.set_window_size(1200, 800)
    browser.get(path.as_uri())
    table, page_width, window = browser.execute_script(
        "return [document.querySelector('table').scrollWidth, document.documentElement.scrollWidth,"
        " document.documentElement.clientWidth]"
    )
    assert table > window >= page_width, (table, page_width, window)
