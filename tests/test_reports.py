"""Reports on synthetic run records: frames, coupling statistics with known answers, figure data, HTML."""

import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from reports import analysis, figures, schema
from reports.frames import curves_frame, runs_frame
from reports.html import ReportData, render
from tests.report_records import INF, curve, grid_records, trial

UI = "http://127.0.0.1:5000"


def frame(records):
    return runs_frame(records, "7", UI)


# ---------------------------------------------------------------- frames


def test_runs_frame_parses_params_metrics_and_failures():
    records = [
        trial("a", INF, 2.0, 4, 1, 0.7, collapsed=True, collapse_step=30),
        trial("b", 1.5, 1.0, 0, 0, None, fail_reason="RuntimeError: boom"),
    ]
    runs = frame(records)
    assert list(runs.columns) == list(schema.RUNS)
    a, b = runs.set_index("run_id").loc["a"], runs.set_index("run_id").loc["b"]
    assert math.isinf(a.tau_policy) and a.tau_advantage == 2.0 and a.staleness == 4 and a.seed == 1
    assert a.scored and a.collapsed and a.collapse_step == 30.0 and a.objective == 0.7 and a.final_accuracy == 1.2
    assert a.url == f"{UI}/#/experiments/7/runs/a?workflowType=machine_learning"  # the training view, not GenAI
    assert (
        not b.scored
        and math.isnan(b.objective)
        and b.fail_reason == "RuntimeError: boom"
        and b.collapse_reason == "not run"
    )
    assert math.isnan(a.critic_explained_var_first) and math.isnan(a.collapse_step_train)  # not logged: not invented
    records[0]["metrics"] |= {
        "summary/critic_explained_var_first": 0.41,
        "summary/critic_warmup_explained_var": 0.5,
        "summary/collapse_step_train": 12.0,
        "summary/kl_step_mean": 2e-3,
        "summary/staleness_updates_mean": 16.0,
    }
    a = frame(records).set_index("run_id").loc["a"]
    assert (
        a.critic_explained_var_first,
        a.critic_warmup_explained_var,
        a.collapse_step_train,
        a.kl_step_mean,
        a.staleness_updates_mean,
    ) == (0.41, 0.5, 12.0, 2e-3, 16.0)


def test_curves_frame_is_long_and_typed():
    records = [
        trial(
            "a",
            2,
            1,
            0,
            0,
            0.5,
            history={"eval/accuracy": curve([0, 10], [0.3, 0.6]), "actor/grad_norm": curve([1], [2.5])},
        )
    ]
    curves = curves_frame(records)
    assert list(curves.columns) == list(schema.CURVES)
    assert sorted(map(tuple, curves[["metric", "step", "value"]].to_numpy().tolist())) == [
        ("actor/grad_norm", 1, 2.5),
        ("eval/accuracy", 0, 0.3),
        ("eval/accuracy", 10, 0.6),
    ]


def test_schema_rejects_missing_extra_and_mistyped_columns():
    runs = frame([trial("a", 2, 1, 0, 0, 0.5)])
    with pytest.raises(schema.SchemaError, match="missing columns \\['url'\\]"):
        schema.validate(runs.drop(columns="url"), schema.RUNS, "runs")
    with pytest.raises(schema.SchemaError, match="undeclared columns \\['x'\\]"):
        schema.validate(runs.assign(x=1), schema.RUNS, "runs")
    with pytest.raises(schema.SchemaError, match="'staleness' should be int"):
        schema.validate(runs.assign(staleness=0.5), schema.RUNS, "runs")


def test_empty_inputs_give_empty_frames_with_the_schema():
    assert list(frame([]).columns) == list(schema.RUNS) and frame([]).empty
    assert analysis.coupling(frame([])).empty and list(analysis.coupling(frame([])).columns) == list(schema.COUPLING)


# ---------------------------------------------------------------- coupling statistics


ALPHA, BETA, GAMMA, C = 0.5, 0.1, 0.05, 0.08


def bilinear(i, a, k):
    return ALPHA + BETA * i + GAMMA * a + C * i * a


def test_interaction_contrast_recovers_a_known_bilinear_interaction():
    """Y = α + β·i + γ·a + c·i·a (+ zero-mean seed noise): every 2×2 contrast is c·(j − i)·(b − a)."""
    runs = frame(grid_records(bilinear))
    out = analysis.coupling(runs)
    assert len(out) == 2 * 3 * 3  # k ∈ {0, 4} × C(3,2) τ_p pairs × C(3,2) τ_a pairs
    levels_p, levels_a = [1.5, 2.0, 4.0], [1.0, 2.0, 4.0]
    for r in out.itertuples():
        di = levels_p.index(r.tau_policy_to) - levels_p.index(r.tau_policy_from)
        da = levels_a.index(r.tau_advantage_b) - levels_a.index(r.tau_advantage_a)
        assert r.contrast == pytest.approx(C * di * da, abs=1e-12)
        assert r.effect_a == pytest.approx(BETA * di + C * di * levels_a.index(r.tau_advantage_a), abs=1e-12)
        assert r.contrast_low <= C * di * da <= r.contrast_high
        assert r.significant_interaction  # noise ±0.01 against contrasts ≥ 0.08
        assert not r.reversal and not r.significant_reversal  # β, c > 0: τ_p always helps


def test_interaction_fraction_matches_the_closed_form():
    """For M_ia = α + β i + γ a + c i a the two-way residual is c (i − ī)(a − ā)."""
    runs = frame(grid_records(bilinear))
    out = analysis.interaction_fraction(runs, n_boot=500)
    i, a = np.meshgrid(np.arange(3.0), np.arange(3.0), indexing="ij")
    table = ALPHA + BETA * i + GAMMA * a + C * i * a
    resid = C * (i - i.mean()) * (a - a.mean())
    expected = np.square(resid).sum() / np.square(table - table.mean()).sum()
    assert out["fraction"].tolist() == pytest.approx([expected, expected], abs=1e-12)
    assert (out["fraction_low"] <= expected).all() and (out["fraction_high"] >= expected).all()


def test_interaction_share_interval_skips_replicates_whose_cells_all_tie():
    """Three cells always 0.5, the fourth 0.5 or 0.7 by seed: a bootstrap replicate draws the fourth's mean as
    0.5 (all cells tie, share 0/0), 0.6 or 0.7. A lone deviation d in one cell of a 2 × 2 table leaves residuals
    ±d/4 (sum of squares d²/4) out of a total of 3d²/4, so every replicate with a share has 1/3."""
    records = [
        trial(f"r{tp}-{ta}-{seed}", tp, ta, 4, seed, 0.7 if (tp, ta, seed) == (4.0, 2.0, 1) else 0.5)
        for tp in (1.5, 4.0)
        for ta in (1.0, 2.0)
        for seed in (0, 1)
    ]
    out = analysis.interaction_fraction(frame(records), n_boot=400).iloc[0]
    assert out["fraction"] == pytest.approx(1 / 3, abs=1e-12)
    assert out["fraction_low"] == pytest.approx(1 / 3, abs=1e-12) and out["fraction_high"] == pytest.approx(
        1 / 3, abs=1e-12
    )


def test_an_additive_null_with_no_draw_that_has_a_share_gives_no_test():
    """A pure interaction with no seed noise: every null table is the flat additive fit (a share of 0/0). The test
    counted those draws as "below the observed share" and printed p = 1/2001; it now has nothing to say."""
    records = [
        trial(f"r{tp}-{ta}-{seed}", tp, ta, 4, seed, 0.6 if (tp == 1.5) == (ta == 1.0) else 0.4)
        for tp in (1.5, 4.0)
        for ta in (1.0, 2.0)
        for seed in (0, 1)
    ]
    assert analysis.interaction_fraction(frame(records))["fraction"].tolist() == pytest.approx([1.0])
    assert analysis.additive_null(frame(records)).empty


def test_an_additive_null_counts_only_the_draws_that_have_a_share():
    """A pure interaction (means 0.6/0.4 on the diagonals, share 1, a flat additive fit) with seed noise in one cell
    only: (0, 0) holds 0.5 and 0.7, the others two equal values. The pooled residuals are ±0.1·√2 and six zeros, so a
    cell's null mean is ±r w.p. 1/64 each, ±r/2 w.p. 12/64 each, 0 w.p. 38/64 (q). A null table has share 1 exactly
    when its diagonals are equal and differ (P1 = (Σq²)² − Σq⁴), and no share when all four are equal (P0 = Σq⁴).
    So p → P1 / (1 − P0) = 0.0601; counting the shareless draws as well gave P1 = 0.0525."""
    values = {(1.5, 1.0): (0.5, 0.7), (4.0, 2.0): (0.6, 0.6), (1.5, 2.0): (0.4, 0.4), (4.0, 1.0): (0.4, 0.4)}
    records = [
        trial(f"r{tp}-{ta}-{seed}", tp, ta, 4, seed, values[tp, ta][seed]) for tp, ta in values for seed in (0, 1)
    ]
    q = np.array([1, 1, 12, 12, 38]) / 64
    p0 = np.sum(q**4)
    expected = (np.sum(q**2) ** 2 - p0) / (1 - p0)
    out = analysis.additive_null(frame(records), n_null=50_000).iloc[0]
    assert out.fraction == pytest.approx(1.0)
    se = math.sqrt(expected * (1 - expected) / (50_000 * (1 - p0)))
    assert abs(out.p_value - expected) < 4 * se  # 4 s.e. ≈ 0.0045; the old count sits 0.0076 below


def test_adding_a_cell_moves_no_other_cells_interval():
    """Each cell's bootstrap draws from a stream of its own: the interaction share of one method's grid is the same
    with or without another method's runs in the frame (a shared stream shifted every later interval)."""
    runs = frame(grid_records(bilinear))
    alone = analysis.interaction_fraction(runs)
    other = grid_records(
        lambda i, a, k: 0.3 + 0.05 * i * a, method="aaa"
    )  # sorts first: drew first from a shared stream
    grown = frame(grid_records(bilinear) + [{**r, "run_id": "x" + r["run_id"]} for r in other])
    grown_copc = analysis.interaction_fraction(grown).query("method == 'copc'").reset_index(drop=True)
    pd.testing.assert_frame_equal(alone.reset_index(drop=True), grown_copc)


def test_additive_effects_show_no_interaction():
    runs = frame(grid_records(lambda i, a, k: 0.4 + 0.1 * i - 0.07 * a, noise=(-0.02, 0.0, 0.02)))
    out = analysis.coupling(runs)
    assert np.allclose(out["contrast"], 0.0, atol=1e-12)
    assert not out["significant_interaction"].any() and not out["reversal"].any()
    assert analysis.interaction_fraction(runs)["fraction"].tolist() == pytest.approx([0.0, 0.0], abs=1e-20)


def test_sign_reversal_is_detected_only_where_it_is():
    """τ_p helps (+0.3) at τ_a = 1 and hurts (−0.3) at τ_a = 4 at k = 4; at k = 0 it always helps."""

    def value(i, a, k):
        if k == 0:
            return 0.5 + 0.1 * i
        return 0.5 + 0.15 * i * (1 - a)  # a = 0: +0.15/level, a = 1: 0, a = 2: −0.15/level

    out = analysis.coupling(frame(grid_records(value)))
    k4 = out[out["staleness"] == 4]
    flip = k4[(k4["tau_advantage_a"] == 1.0) & (k4["tau_advantage_b"] == 4.0)]
    assert len(flip) == 3 and flip["significant_reversal"].all()
    assert (flip["effect_a"] > 0).all() and (flip["effect_b"] < 0).all()
    # τ_a = 2 makes τ_p's effect exactly 0: no sign to reverse
    assert not k4[(k4["tau_advantage_b"] == 2.0) | (k4["tau_advantage_a"] == 2.0)]["reversal"].any()
    assert not out[out["staleness"] == 0]["reversal"].any()


def test_one_seed_gives_point_estimates_without_intervals():
    runs = frame(grid_records(bilinear, seeds=(0,), noise=(0.0,)))
    out = analysis.coupling(runs)
    assert out["contrast_low"].isna().all() and not out["significant_interaction"].any()
    assert not out["significant_reversal"].any() and (out["n_min"] == 1).all()
    cells = analysis.cell_stats(runs)
    assert cells["sd"].isna().all() and cells["ci_low"].isna().all() and (cells["n"] == 1).all()


def test_cell_stats_mean_sd_and_interval():
    """The mean's interval is Student's t (mean ± t₀.₉₇₅,₃ · sd / √4); the collapse rate's, Clopper–Pearson: the
    2.5 % quantile of Beta(1, 4) and the 97.5 % quantile of Beta(2, 3) for 1 collapse in 4 runs."""
    from scipy import stats

    values = [0.2, 0.5, 0.8, 0.9]
    runs = frame([trial(f"r{s}", 2, 1, 0, s, v, collapsed=s == 0) for s, v in enumerate(values)])
    cell = analysis.cell_stats(runs).iloc[0]
    mean, sd = np.mean(values), np.std(values, ddof=1)
    assert cell.n == 4 and cell["mean"] == pytest.approx(mean) and cell.sd == pytest.approx(sd)
    half = stats.t.ppf(0.975, 3) * sd / 2
    assert (cell.ci_low, cell.ci_high) == pytest.approx((mean - half, mean + half), abs=1e-12)
    assert cell.collapse_rate == 0.25
    assert (cell.collapse_low, cell.collapse_high) == pytest.approx(
        (stats.beta.ppf(0.025, 1, 4), stats.beta.ppf(0.975, 2, 3)), abs=1e-9
    )


def test_a_two_sample_welch_contrast_is_scipys_and_a_four_cell_one_adds_the_variances():
    from scipy import stats

    rng = np.random.default_rng(3)
    a, b, c, d = (rng.normal(m, s, n) for m, s, n in ((0.6, 0.05, 5), (0.5, 0.1, 4), (0.55, 0.02, 5), (0.4, 0.2, 6)))
    ci = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert analysis.contrast_interval([a, b], [1, -1]) == pytest.approx((ci.low, ci.high), abs=1e-12)
    v = np.array([x.var(ddof=1) / len(x) for x in (a, b, c, d)])
    df = v.sum() ** 2 / sum(vi**2 / (len(x) - 1) for vi, x in zip(v, (a, b, c, d)))
    est, half = a.mean() - b.mean() - c.mean() + d.mean(), stats.t.ppf(0.975, df) * np.sqrt(v.sum())
    assert analysis.contrast_interval([a, b, c, d], [1, -1, -1, 1]) == pytest.approx((est - half, est + half))
    assert math.isnan(analysis.contrast_interval([a, b[:1]], [1, -1])[0])  # one run: no interval


def test_the_reports_intervals_cover_at_five_seeds():
    """The coverage bench/coverage.py prints, on its no-collapse scenarios (seeded, 1,000 cells each: a Monte Carlo
    s.e. of ~0.007 about a true ~0.95), of the report's t interval of a mean and of a paired difference and its Welch
    contrast, each ≥ 0.93; and of a cell where runs collapse read in two parts (its collapse rate's exact interval,
    shown by the report, and the t interval of the others' mean, a reading by hand)."""
    from bench import coverage as cov

    rng = np.random.default_rng(0)
    search, difference = cov.SCENARIOS[0], cov.SCENARIOS[-1]
    for s in (search, difference):
        truth = float(cov.draw(s, (2_000_000,), rng).mean())
        low, high = cov.student_t(cov.draw(s, (1000, 5), rng))
        assert np.mean((low <= truth) & (truth <= high)) >= 0.93, s.name
    assert (
        cov.contrast_coverage(search, 5, 1000, rng, kinds=("Welch t (the report's)",))["Welch t (the report's)"] >= 0.93
    )
    split = cov.split_coverage(cov.SCENARIOS[2], 5, 1000, rng)  # a cell where 10 % of runs collapse, in two parts
    assert split["rate"] >= 0.93 and split["mean"] >= 0.93


def test_the_survival_coverage_bench_reads_what_it_should():
    """bench.coverage's survival figures, by what must hold whatever the draws: with one run a seed and every run
    ending at the same step, the report's interval is the binomial's exact one, which covers at least 95 % (± ~0.01
    over 500 draws); Greenwood's log-log interval reads [1, 1] on the 0.8⁵ = 33 % of draws without a collapse, so it
    covers at most ~67 %."""
    from bench import coverage as cov

    single = cov.survival_coverage(cov.SURVIVAL[0], 5, 500, np.random.default_rng(1))
    assert single["truth"] == pytest.approx(0.8, abs=1e-9)
    assert single["report"] >= 0.93
    assert single["log-log"] <= 1 - 0.8**5 + 0.07  # ~3 s.e. of the no-collapse share over 500 draws


def test_high_performing_region_counts_cells_within_90_percent():
    means = {(0, 0): 1.0, (0, 1): 0.95, (1, 0): 0.9, (1, 1): 0.85}  # within 90 %: 1.0, 0.95, 0.9
    runs = frame(grid_records(lambda i, a, k: means[i, a], tps=(2, 4), tas=(1, 2), ks=(0,), seeds=(0,), noise=(0.0,)))
    region = analysis.high_performing_region(analysis.cell_stats(runs)).iloc[0]
    assert (region.n_within, region.n_cells, region.fraction) == (3, 4, 0.75)
    assert (region.best, region.best_tau_policy, region.best_tau_advantage) == (1.0, 2.0, 1.0)
    negative = frame(
        grid_records(lambda i, a, k: -1.0 - i - a, tps=(2, 4), tas=(1, 2), ks=(0,), seeds=(0,), noise=(0.0,))
    )
    assert analysis.high_performing_region(analysis.cell_stats(negative)).iloc[0].n_within == 1  # only the best


def test_method_comparison_and_step_times_against_a_baseline():
    records = [
        trial("c0", 2, 1, 0, 0, 0.8, step_s=2.0, train_s=1.05),
        trial("c1", 2, 2, 0, 0, 0.6, collapsed=True),
        trial("c4", 2, 1, 4, 0, 0.7, step_s=1.25, train_s=1.05),
        trial("p0", 2, 1, 0, 0, 0.5, method="async_ppo", train_s=1.0),
        trial("p4", 2, 1, 4, 0, 0.1, method="async_ppo", train_s=1.0, collapsed=True),
    ]
    runs = frame(records)
    cells = analysis.cell_stats(runs)
    table = analysis.method_comparison(runs, cells).set_index(["method", "staleness"])
    copc0 = table.loc[("copc", 0)]
    assert copc0.n_runs == 2 and copc0.collapse_rate == 0.5 and copc0.best_tau_advantage == 1.0
    assert copc0.best_final_mean == pytest.approx(0.8) and copc0.final_mean == pytest.approx((0.8 + 1.1) / 2)
    assert table.loc[("async_ppo", 4)].best_collapse_rate == 1.0
    times = analysis.step_times(runs, "async_ppo").set_index(["method", "staleness"])
    assert times.loc[("copc", 4)].speedup_vs_sync == pytest.approx((2.0 + 1.0) / 2 / 1.25)
    assert times.loc[("copc", 4)].learner_vs_baseline == pytest.approx(1.05)
    assert times.loc[("async_ppo", 0)].learner_vs_baseline == pytest.approx(1.0)
    assert analysis.step_times(runs, "no_such_method")["learner_vs_baseline"].isna().all()


# ---------------------------------------------------------------- figures (trace data, not pixels)


def test_heatmap_cells_hold_the_seed_means_in_grid_order():
    runs = frame(grid_records(bilinear))
    fig = figures.heatmaps(analysis.cell_stats(runs), "copc")
    assert len(fig.data) == 2
    for trace in fig.data:
        assert list(trace.x) == ["1", "2", "4"] and list(trace.y) == ["1.5", "2", "4"]
        expected = [[bilinear(i, a, 0) for a in range(3)] for i in range(3)]
        assert np.allclose(np.asarray(trace.z, float), expected, atol=1e-12)
        assert "± 0.01<br>n=3" in trace.text[0][0]


def test_interaction_lines_one_line_per_tau_a_with_interval_bars():
    runs = frame(grid_records(bilinear))
    fig = figures.interaction_lines(analysis.cell_stats(runs), "copc")
    assert len(fig.data) == 2 * 3
    line = fig.data[0]
    assert line.name == "τ_a = 1" and np.allclose(line.y, [bilinear(i, 0, 0) for i in range(3)])
    assert line.text[0].startswith("τ_a 1, τ_p 1.5: ") and line.text[0].endswith(" seeds")  # the hover says which
    assert all(e > 0 for e in line.error_y.array)


def test_learning_curves_mark_collapse_and_escape_names():
    reward = curve([1, 2, 3, 4, 5], [0.3, 0.5, 0.6, 0.1, 0.0])
    hist = {"eval/accuracy": curve([0, 10, 20, 30], [0.3, 0.6, 0.2, 0.1]), "reward/mean": reward}
    runs = frame(
        [
            trial("a", 2, 1, 4, 0, 0.1, collapsed=True, collapse_step=20, history=hist, run_name="<b>x</b>"),
            trial("b", 2, 2, 4, 0, 0.6, history={"eval/accuracy": curve([0, 30], [0.3, 0.6])}),
        ]
    )
    curves = curves_frame(
        [
            trial("a", 2, 1, 4, 0, 0.1, history=hist),
            trial("b", 2, 2, 4, 0, 0.6, history={"eval/accuracy": curve([0, 30], [0.3, 0.6])}),
        ]
    )
    fig = figures.learning_curves(runs, curves)
    held_out = [t for t in fig.data if t.mode == "lines+markers"]
    training = [t for t in fig.data if t.mode == "lines"]
    markers = [t for t in fig.data if t.mode == "markers"]
    assert len(held_out) == 2 and len(markers) == 1
    assert list(markers[0].x) == [20] and list(markers[0].y) == [0.2]
    # legend entries name cells (one per cell, shown once); the run's own name, escaped, is in the hover text
    assert [t.name for t in held_out] == ["copc τp=2 τa=1", "copc τp=2 τa=2"] and all(t.showlegend for t in held_out)
    assert "&lt;b&gt;x&lt;/b&gt;" in held_out[0].hovertemplate and "<b>x" not in held_out[0].hovertemplate
    # the training reward of every step, dotted, in the run's colour and legend group (run b has none)
    assert len(training) == 1 and list(training[0].x) == [1, 2, 3, 4, 5]
    assert list(training[0].y) == [v for _, v in reward]
    assert training[0].line.dash == "dot" and training[0].line.color == held_out[0].line.color
    assert training[0].legendgroup == held_out[0].legendgroup


def test_learning_curves_give_a_cell_one_colour_and_one_legend_entry_across_staleness_panels():
    hist = {"eval/accuracy": curve([0, 10], [0.3, 0.6])}
    records = [trial(rid, 2, ta, k, 0, 0.6, history=hist) for rid, ta, k in (("a", 1, 0), ("b", 1, 4), ("c", 2, 4))]
    fig = figures.learning_curves(frame(records), curves_frame(records))
    lines = {t.hovertemplate.split("<br>")[0]: t for t in fig.data}
    same = [t for t in fig.data if t.name == "copc τp=2 τa=1"]
    assert len(same) == 2 and same[0].line.color == same[1].line.color and same[0].xaxis != same[1].xaxis
    assert [t.showlegend for t in same] == [True, False]
    other = next(t for t in fig.data if t.name == "copc τp=2 τa=2")
    assert other.line.color != same[0].line.color and len(lines) == 3


def test_diagnostics_figure_has_one_panel_row_per_metric():
    keys = [key for key, _ in figures.DIAGNOSTICS]
    hist = {key: curve([1, 2, 3], [0.9, 0.8, 0.7]) for key in keys}
    records = [trial("a", 2, 1, 0, 0, 0.5, history=hist), trial("b", 2, 1, 4, 0, 0.4, history=hist)]
    fig = figures.diagnostics(frame(records), curves_frame(records))
    assert len(fig.data) == len(keys) * 2
    assert {(t.xaxis, tuple(t.y)) for t in fig.data} == {
        (f"x{n if n > 1 else ''}", (0.9, 0.8, 0.7)) for n in range(1, 2 * len(keys) + 1)
    }


def test_contrast_forest_colours_significant_reversals():
    def value(i, a, k):
        return 0.5 + 0.15 * i * (1 - a)

    coupling = analysis.coupling(frame(grid_records(value, ks=(4,))))
    fig = figures.contrasts(coupling)
    colours = list(fig.data[0].marker.color)
    assert colours.count("#d62728") == int(coupling["significant_reversal"].sum()) == 3
    assert np.allclose(fig.data[0].x, coupling["contrast"])


# ---------------------------------------------------------------- HTML


def sample_report(name="<script>window.__pwned=1</script>") -> ReportData:
    keys = ["eval/accuracy"] + [key for key, _ in figures.DIAGNOSTICS]

    def history(i, a, k, s):
        steps = [0, 10, 20, 30]
        return {
            key: curve(steps, [0.3 + 0.1 * i, 0.5, 0.6 - 0.1 * a * (k > 0), 0.6 - 0.2 * a * (k > 0)]) for key in keys
        }

    records = grid_records(bilinear, history=history)
    records[0] = dict(records[0], run_name=name)
    records.append(trial("failed", 1.5, 1.0, 0, 9, None, fail_reason="RayTaskError: <oops>"))
    return ReportData(
        title="Synthetic <report>",
        runs=frame(records),
        curves=curves_frame(records),
        sources={"MLflow": "sqlite:///x.db"},
        parent_links=[("synthetic", f"{UI}/#/experiments/7/runs?v=1", f"{UI}/#/experiments/7/runs?v=1&c=1")],
        n_boot=300,
    )


def test_html_is_self_contained_and_escapes_user_text():
    from plotly.offline import get_plotlyjs

    page = render(sample_report())
    assert page.count(get_plotlyjs()[:500]) == 1  # plotly.js inlined exactly once
    assert "<script>window.__pwned" not in page and "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in page
    assert "RayTaskError: &lt;oops&gt;" in page and "Synthetic &lt;report&gt;" in page
    own = page.replace(get_plotlyjs(), "")  # the page outside the inlined library loads nothing from outside
    assert "src=" not in own and "cdn.plot.ly" not in own and "<link" not in own
    assert page.index('id="summary"') < page.index('class="figure"')  # summary first
    assert f'href="{UI}/#/experiments/7/runs/copc-0-0-0-0?workflowType=machine_learning"' in page


def test_reports_import_no_torch():
    code = (
        "import sys, reports.build, reports.html; print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'ray', 'prefect', 'optuna')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_parallel_coordinates_put_the_objective_first_on_the_pinned_scale():
    records = [
        trial("a", 1.5, 2.0, 0, 0, 0.8),
        trial("b", 4.0, INF, 4, 1, -0.4, collapsed=True),
        trial("c", INF, INF, 4, 0, 0.6, method="tis"),
        trial("d", 2.0, 2.0, 4, 2, None, fail_reason="boom"),  # not scored: no line
    ]
    fig = figures.parallel_coordinates(frame(records))
    (pc,) = fig.data
    labels = [d.label for d in pc.dimensions]
    assert labels == ["objective", "method", "τ_p", "τ_a", "staleness k", "seed", "final accuracy", "collapsed"]
    by = {d.label: d for d in pc.dimensions}
    assert list(by["objective"].values) == [0.8, -0.4, 0.6] and tuple(by["objective"].range) == (-1.0, 1.0)
    assert (pc.line.cmin, pc.line.cmax) == (-1.0, 1.0)  # the heatmaps' scale: colours mean the same everywhere
    assert list(by["method"].ticktext) == ["copc", "tis"] and list(by["method"].values) == [0, 0, 1]
    # ∞ (no band) at the top of its axis, 1.5 × the largest finite band, labelled ∞
    assert list(by["τ_p"].values) == [1.5, 4.0, 6.0] and list(by["τ_p"].ticktext) == ["1.5", "4", "∞"]
    assert list(by["τ_a"].values) == [2.0, 3.0, 3.0] and list(by["τ_a"].ticktext) == ["2", "∞"]
    assert list(by["collapsed"].values) == [0, 1, 0]
    page = render(ReportData(title="t", runs=frame(records), curves=curves_frame(records), n_boot=20))
    assert "Every run, objective first" in page and 'id="parallel"' in page


def test_heatmap_colours_span_the_reports_healthy_cells_at_least_min_span_and_pin_where_all_collapsed():
    def cells(*means, collapsed=()):
        return pd.DataFrame(
            {"mean": list(means), "collapse_rate": [1.0 if i in collapsed else 0.4 for i in range(len(means))]}
        )

    lo, hi = figures.colour_range(cells(0.64, 0.71, 0.66, float("nan")))  # 0.07 wide: widened to 0.2 about 0.675
    assert (lo, hi) == (pytest.approx(0.575), pytest.approx(0.775))
    assert figures.colour_range(cells(0.2, 0.9)) == (0.2, 0.9)  # wide enough: the cells' own range
    lo, hi = figures.colour_range(cells(0.95, 1.0))  # widened past the objective's top: moved down, 0.2 kept
    assert (lo, hi) == (pytest.approx(0.8), pytest.approx(1.0))
    # a wholly collapsed cell (−0.45) does not stretch the scale: it lies below and takes the lowest colour
    assert figures.colour_range(cells(0.2, 0.9, -0.45, collapsed=(2,))) == (0.2, 0.9)
    # every cell wholly collapsed, whatever the penalty left them at: the pinned range, 0.2 must not look good
    assert figures.colour_range(cells(0.1, 0.2, collapsed=(0, 1))) == (-1.0, 1.0)
    assert figures.colour_range(cells(float("nan"))) == (-1.0, 1.0)
    fig = figures.heatmaps(analysis.cell_stats(frame(grid_records(bilinear))), "copc", (0.5, 0.9))
    assert {(t.zmin, t.zmax) for t in fig.data} == {(0.5, 0.9)}
    (menu,) = fig.layout.updatemenus  # the report's range, or the objective's whole range for every trace
    assert [b.args[0] for b in menu.buttons] == [{"zmin": 0.5, "zmax": 0.9}, {"zmin": -1.0, "zmax": 1.0}]


def test_the_grid_sections_leave_out_methods_with_one_cell():
    """A method with one cell is always within 90 % of its best: no 1/1 bar, a dash in the summary; a report with no
    grid has no grid sections or columns."""
    grid = grid_records(lambda i, a, k: 0.5 + 0.1 * i, ks=(4,))
    base = [trial(f"b{s}", INF, INF, 4, s, 0.6, method="tis") for s in range(3)]
    page = render(ReportData(title="t", runs=frame(grid + base), curves=curves_frame(grid + base), n_boot=50))
    region = analysis.high_performing_region(analysis.cell_stats(frame(grid)))
    assert (region.n_within.item(), region.n_cells.item()) == (3, 9)  # 0.7 best: the τ_p = 4 row, 0.7 ≥ 0.63
    summary = page.split('id="summary"', 1)[1].split("</table>", 1)[0]
    rows = {r.split("</td>", 1)[0].rsplit(">", 1)[-1]: r for r in summary.split("<tr>")[2:]}
    assert "<td>3/9</td>" in rows["copc"] and "/1</td>" not in rows["tis"]
    bars = page.split('id="region"', 1)[1].split("</script>", 1)[0]
    assert '"name":"copc"' in bars and '"name":"tis"' not in bars
    assert "interaction fraction [95 % CI]" in summary and "<h2>Coupling analysis</h2>" in page
    # no grid at all (a long study's fixed cells): one note for the three grid sections, no empty grid columns
    only_one = render(ReportData(title="t", runs=frame(base), curves=curves_frame(base), n_boot=50))
    summary = only_one.split('id="summary"', 1)[1].split("</table>", 1)[0]
    assert "cells within 90 %" not in summary and "interaction fraction" not in summary and "reversals" not in summary
    assert "<th>best cell of the method at k: objective</th>" in summary
    assert 'id="region"' not in only_one and "<h2>Coupling analysis</h2>" not in only_one
    assert "None: no method was swept over more than one (τ_p, τ_a) cell." in only_one
    assert "Interaction fraction:" not in only_one and "Welch t" not in only_one  # the note explains what is shown
    # the long study: each reading at one cell per lag, a different one at each — no grid either
    fixed = [trial(f"c{k}{s}", tp, ta, k, s, 0.6) for k, tp, ta in ((8, 4.0, 1.1), (32, 1.5, 1.0)) for s in range(3)]
    long = render(ReportData(title="t", runs=frame(fixed), curves=curves_frame(fixed), n_boot=50))
    assert "None: no method was swept over more than one (τ_p, τ_a) cell." in long and 'id="heatmap-0"' not in long
    # a sweep with no finished trial yet (a plan recorded, say) still renders
    empty = render(ReportData(title="t", runs=frame([]), curves=curves_frame([]), n_boot=50))
    assert "No trial finished training" in empty


def test_heatmap_ties_are_outlined_and_an_all_collapsed_level_says_so():
    # k = 0: four cells tie at 0.8 (the rest 0.5); k = 4: every run collapsed (objective −0.496 everywhere)
    def value(i, a, k):
        return (0.8 if i < 2 and a < 2 else 0.5) if k == 0 else -0.496

    records = grid_records(value, noise=(0.0, 0.0, 0.0))
    for r in records:
        if r["params"]["train.staleness"] == "4":
            r["metrics"]["summary/collapsed"] = 1.0
            r["tags"]["collapse_reason"] = "accuracy"
    runs = frame(records)
    cells = analysis.cell_stats(runs)
    fig = figures.heatmaps(cells, "copc")
    # the report's scale is k = 0's cells, 0.5 to 0.8: k = 4's −0.496 lies below it (the lowest colour), and on
    # its own, all collapsed, the pinned range
    assert figures.colour_range(cells) == pytest.approx((0.5, 0.8))
    assert (cells.loc[cells["staleness"] == 4, "mean"] < 0.5).all()
    assert figures.colour_range(cells[cells["staleness"] == 4]) == (-1.0, 1.0)
    outlined = [s for s in fig.layout.shapes if s.xref == "x"]
    assert len(outlined) == 4  # the four tied cells of k = 0, each outlined
    assert "k = 4 (all collapsed)" in [a.text for a in fig.layout.annotations]
    page = render(ReportData(title="t", runs=runs, curves=curves_frame(records), n_boot=50))
    assert "0.800 (4 cells tie: copc τp=1.5 τa=1, copc τp=1.5 τa=2, copc τp=2 τa=1, copc τp=2 τa=2)" in page
    assert "every run at this k collapsed" in page and "✕ 3/3 collapsed" in str(fig.data[1].text)


def test_report_links_one_plotly_copy_when_asked_and_tables_sort():
    page = render(sample_report(), "plotly.min.js")
    assert '<script type="text/javascript" src="plotly.min.js"></script>' in page
    assert len(page) < 1_000_000  # the 4.8 MB library is not inside
    assert 'class="sortable"' in page and "table.sortable th" in page


# ---------------------------------------------------------------- claims free of selection


def _seed_rows(method, cells: dict[tuple[float, float], list[float]], k=32):
    return [
        trial(f"{method}-{tp}-{ta}-{s}", tp, ta, k, s, v, method=method)
        for (tp, ta), values in cells.items()
        for s, v in enumerate(values)
    ]


def test_tuned_score_chooses_each_seeds_cell_on_the_other_seeds():
    """Two cells with the same mean over seeds: the best-of-two cell mean is 1/3, the selection-free score 0.

    Seed 0: the other seeds' means are A 0, B 0.5 → B, scored B[0] = 0; seeds 1 and 2: A 0.5, B 0.25 → A, scored
    A[1] = A[2] = 0. Untuned (mean of both cells): 0.5, 0.25, 0.25.
    """
    runs = frame(_seed_rows("copc", {(1.5, 1.0): [1.0, 0.0, 0.0], (4.0, 1.0): [0.0, 0.5, 0.5]}))
    out = analysis.selection_free_scores(runs, {"copc": ["copc"]}).set_index(["kind", "seed"])
    assert list(out.columns[:2]) == ["family", "staleness"]
    tuned = out.loc["tuned"]
    assert tuned["cell"].tolist() == ["copc τ_p 4 τ_a 1", "copc τ_p 1.5 τ_a 1", "copc τ_p 1.5 τ_a 1"]
    assert tuned["score"].tolist() == [0.0, 0.0, 0.0] and (tuned["cells"] == 2).all()
    assert out.loc["untuned"]["score"].tolist() == pytest.approx([0.5, 0.25, 0.25], abs=1e-12)


def test_tuned_score_of_a_family_of_baselines_and_missing_seeds():
    """Baselines chosen among by name; a seed a cell lacks is not scored there, nor averaged untuned."""
    rows = _seed_rows("tis", {(None, None): [0.8, 0.6, 0.7]}) + _seed_rows("vtrace", {(None, None): [0.5, 0.9]})
    out = analysis.selection_free_scores(frame(rows), {"baselines": ["tis", "vtrace"]}).set_index(["kind", "seed"])
    # seed 0: others tis 0.65, vtrace 0.9 → vtrace 0.5; seed 1: tis 0.75, vtrace 0.5 → tis 0.6;
    # seed 2: vtrace has no seed 2 → tis 0.7
    assert out.loc["tuned"]["cell"].tolist() == ["vtrace", "tis", "tis"]
    assert out.loc["tuned"]["score"].tolist() == [0.5, 0.6, 0.7]
    assert out.loc["untuned"]["score"].tolist() == pytest.approx([0.65, 0.75], abs=1e-12)  # seed 2 lacks vtrace


def test_paired_difference_uses_the_common_seeds():
    a = pd.Series([1.0, 2.0, 3.0, 9.0], index=[0, 1, 2, 3])
    b = pd.Series([0.0, 0.0, 1.0], index=[0, 1, 2])
    n, mean, low, high = analysis.paired_difference(a, b)
    assert n == 3 and mean == pytest.approx(5 / 3, abs=1e-12)  # differences 1, 2, 2: sd 1/√3
    half = 4.302652729911275 * (1 / math.sqrt(3)) / math.sqrt(3)  # t₀.₉₇₅ with 2 degrees of freedom
    assert (low, high) == pytest.approx((5 / 3 - half, 5 / 3 + half), abs=1e-9)
    assert analysis.paired_difference(a, pd.Series([0.5], index=[3]))[1:] == (
        8.5,
        *[pytest.approx(math.nan, nan_ok=True)] * 2,
    )


def _bare(table: np.ndarray, k: int = 32) -> pd.DataFrame:
    """A runs frame with only what the coupling statistics read: a [τ_p, τ_a, seed] table of objectives."""
    i, a, s = np.indices(table.shape)
    return pd.DataFrame(
        {
            "method": "copc",
            "staleness": k,
            "tau_policy": (1.0 + i).ravel().astype(float),
            "tau_advantage": (1.0 + a).ravel().astype(float),
            "seed": s.ravel(),
            "objective": table.ravel(),
            "scored": True,
        }
    )


def test_additive_null_is_calibrated_and_sees_a_real_interaction():
    """Additive grids with Gaussian seed noise: p < 0.05 in about 5 % of 200 (Binomial(200, 0.05): mean 10,
    P(≤ 2) and P(≥ 21) each below 0.3 %); a bilinear grid far above the noise gets the smallest p there is."""
    rng = np.random.default_rng(7)
    effect = 0.1 * np.arange(2)[:, None, None] - 0.05 * np.arange(6)[None, :, None]
    ps = [
        analysis.additive_null(_bare(0.6 + effect + rng.normal(0, 0.05, (2, 6, 5))), n_null=400, seed=t)[
            "p_value"
        ].item()
        for t in range(200)
    ]
    assert 3 <= sum(p < 0.05 for p in ps) <= 20
    bilinear = 0.6 + effect + 0.2 * np.arange(2)[:, None, None] * np.arange(6)[None, :, None] / 5
    out = analysis.additive_null(_bare(bilinear + rng.normal(0, 0.01, (2, 6, 5))), n_null=400)
    assert out["p_value"].item() == pytest.approx(1 / 401) and out["fraction"].item() > 20 * out["null_median"].item()


def test_a_band_of_infinity_is_named_and_a_band_the_method_lacks_is_not():
    """A τ_p = ∞ cell read `copc τa=2` (τ_p dropped) in the summary, the best-per-k table and the legend: the
    frames read ∞ both for that band and for a band a method lacks, and the labels dropped every ∞."""
    from reports.html import best_cells

    records = [trial(f"c{s}", INF, 2.0, 32, s, 0.7) for s in range(2)]
    records += [trial(f"d{s}", 1.5, 2.0, 32, s, 0.6) for s in range(2)]
    records += [trial(f"t{s}", None, None, 32, s, 0.5, method="tis") for s in range(2)]
    runs = frame(records)
    bands = analysis.method_bands(runs)
    assert bands == {"copc": (True, True), "tis": (False, False)}
    assert runs["tau_policy"].tolist() == [1.5, 1.5, INF, INF, INF, INF]  # tis's missing band reads ∞ too
    cells = analysis.cell_stats(runs)
    assert best_cells(cells, bands) == "0.700 copc τp=∞ τa=2"
    assert best_cells(cells[cells["method"] == "tis"], bands) == "0.500 tis"
    names = {figures.cell_name(figures.run_cell(r)) for r in runs.itertuples()}
    assert names == {"copc τp=∞ τa=2", "copc τp=1.5 τa=2", "tis"}
    page = render(ReportData(title="t", runs=runs, curves=curves_frame(records), n_boot=50))
    assert "copc τp=∞ τa=2" in page and "copc τa=2" not in page


# ---------------------------------------------------------------- late in training (the long study)


def late_records() -> list[dict]:
    """Two methods at k = 32. `copc`: five 1,000-step runs, two collapsed (steps 300, 700), one of the other three
    ended at step 500 without collapsing. `tis`: three runs, none collapsed. Held-out accuracy every 100 steps."""
    rising = curve(range(0, 1001, 100), [s / 1000 for s in range(0, 1001, 100)])
    out = []
    for i, (collapse, steps) in enumerate([(300, 1000), (700, 1000), (None, 500), (None, 1000), (None, 1000)]):
        out.append(
            trial(
                f"c{i}",
                4.0,
                1.0,
                32,
                100 + i,
                0.0 if collapse else 0.6,
                collapsed=collapse is not None,
                collapse_step=collapse,
                steps=steps,
                history={"eval/accuracy": rising[: steps // 100 + 1]},
            )
        )
    for i in range(3):
        out.append(
            trial(f"t{i}", INF, 2.0, 32, 100 + i, 0.7, method="tis", steps=1000, history={"eval/accuracy": rising})
        )
    return out


def test_survival_is_kaplan_meier_over_runs_censored_where_they_ended():
    surv = analysis.survival(frame(late_records()))
    copc = surv[surv["method"] == "copc"]
    # Kaplan–Meier by hand: 5 at risk at step 300, one collapses → 4/5; the 500-step run leaves the risk set without
    # an event; 3 at risk at step 700, one collapses → 4/5 · 2/3; it stays there to the longest run's end
    assert copc["step"].tolist() == [0, 300, 700, 1000]
    assert copc["surviving"].tolist() == pytest.approx([1.0, 0.8, 0.8 * 2 / 3, 0.8 * 2 / 3], abs=1e-12)
    assert copc["at_risk"].tolist() == [5, 5, 3, 2]
    assert (copc["low"] <= copc["surviving"]).all() and (copc["surviving"] <= copc["high"]).all()
    assert copc["low"].iloc[1] < 0.8 < copc["high"].iloc[1]  # an interval, not a point, once a run collapsed
    tis = surv[surv["method"] == "tis"]
    assert tis["step"].tolist() == [0, 1000] and tis["surviving"].tolist() == [1.0, 1.0]


def test_survival_interval_is_the_binomials_exact_one_for_one_run_a_seed_and_a_seeds_alike_cells_count_once():
    """Runs that all end at step 600, collapses at 120, 300 and 450 of five seeds' runs: with no censoring before a
    step, Greenwood's variance is S (1 − S) / n, so the effective sample size is the five runs and the interval is
    the binomial's exact one (scipy's binomtest) of the runs still standing. A grid whose three cells at a seed ran
    alike (perfectly correlated) has the same curve and the same interval — not that of 15 independent runs."""
    collapses = [(120, True), (300, True), (600, False), (450, True), (600, False)]  # (step, collapsed) a seed

    def records(cells):
        return [
            trial(f"r{s}-{c}", tp, 1.0, 32, s, 0.6, collapsed=hit, collapse_step=step if hit else None, steps=600)
            for s, (step, hit) in enumerate(collapses)
            for c, tp in enumerate([1.5, 2.0, 4.0][:cells])
        ]

    def exact(standing, n):
        ci = stats.binomtest(standing, n).proportion_ci(0.95, method="exact")
        return [ci.low, ci.high]

    one = analysis.survival(frame(records(1))).iloc[1:4]  # past step 0, before the end's repeat
    assert one["step"].tolist() == [120, 300, 450]
    assert one["surviving"].tolist() == pytest.approx([0.8, 0.6, 0.4], abs=1e-12)
    for row, standing in zip(one.itertuples(), [4, 3, 2]):
        assert [row.low, row.high] == pytest.approx(exact(standing, 5), abs=1e-9)
    grid = analysis.survival(frame(records(3))).iloc[1:4]
    assert grid["at_risk"].tolist() == [15, 12, 9]
    for col in ("surviving", "low", "high"):
        assert grid[col].tolist() == pytest.approx(one[col].tolist(), abs=1e-9)
    assert exact(9, 15)[0] > one["low"].iloc[1] + 0.05  # what 15 independent runs would read at step 300


def test_survival_interval_takes_the_seeds_correlation_from_the_runs_between_independent_and_one_run_a_seed():
    """Seed A's two runs collapse at steps 100 and 150, seed B's two end at 200 without. At step 150 (S = 3/4 · 2/3 =
    1/2, Greenwood 1/(4·3) + 1/(3·2) = 1/4) each run's influence on the cumulative hazard, in 144ths: A1 (1 − 1/4)/4 =
    27, A2 −(1/4)/4 + (1 − 1/3)/3 = 23, B1 and B2 −(1/4)/4 − (1/3)/3 = −25 each: independent 27² + 23² + 2·25² = 2,508,
    by seed 50² + 50² = 5,000, so the design effect is 5,000 / 2,508 (below the cap of 2 runs a seed) and the effective
    sample size (1 − S) / (S · 1/4 · 5,000 / 2,508). At step 100 the design effect, 8/256 over 12/256, is floored at 1:
    4 runs, 3 standing, the binomial's exact interval; so where the seeds' runs collapse apart. No collapse: the runs
    at risk over the most a seed has; every run collapsed (S = 0): the step before's, 0 standing."""

    def exact(standing, n):  # Clopper–Pearson with fractional counts
        low = stats.beta.ppf(0.025, standing, n - standing + 1) if standing > 0 else 0.0
        high = stats.beta.ppf(0.975, standing + 1, n - standing) if standing < n else 1.0
        return [low, high]

    def runs(collapses):  # (seed, collapse step or None) a run; a run that does not collapse ends at step 200
        return frame(
            [
                trial(f"r{i}", 4.0, tau_a, 32, seed, 0.6, collapsed=at is not None, collapse_step=at, steps=at or 200)
                for i, ((seed, at), tau_a) in enumerate(zip(collapses, [1.0, 2.0, 1.0, 2.0]))
            ]
        )

    together = analysis.survival(runs([(0, 100), (0, 150), (1, None), (1, None)])).set_index("step")
    n = (1 - 0.5) / (0.5 * 0.25 * 5000 / 2508)
    assert together.loc[150, "surviving"] == pytest.approx(0.5, abs=1e-12)
    assert together.loc[150, ["low", "high"]].tolist() == pytest.approx(exact(0.5 * n, n), abs=1e-9)
    assert together.loc[100, ["low", "high"]].tolist() == pytest.approx(exact(3, 4), abs=1e-9)
    apart = analysis.survival(runs([(0, 100), (0, None), (1, 100), (1, None)])).set_index("step")
    assert apart.loc[100, ["low", "high"]].tolist() == pytest.approx(exact(2, 4), abs=1e-9)
    calm = analysis.survival(runs([(0, None), (0, None), (1, None), (1, None)])).set_index("step")
    assert calm.loc[200, ["surviving", "low", "high"]].tolist() == pytest.approx([1.0, *exact(2, 2)], abs=1e-9)
    assert calm.loc[0, ["low", "high"]].tolist() == [1.0, 1.0]  # nothing has happened at step 0

    # two runs collapse at steps 100 and 200: at 100, S = 1/2, Greenwood 1/(2·1), so 2 effective runs, 1 standing;
    # at 200 none stands and the step before's 2 runs carry: the band narrows at the last collapse
    gone = [trial(f"g{s}", 4.0, 1.0, 32, s, 0.6, collapsed=True, collapse_step=100 * (s + 1)) for s in range(2)]
    steps = analysis.survival(frame(gone)).set_index("step")
    assert steps.loc[100, ["low", "high"]].tolist() == pytest.approx(exact(1, 2), abs=1e-9)
    assert steps.loc[200, ["surviving", "low", "high"]].tolist() == pytest.approx([0.0, *exact(0, 2)], abs=1e-9)
    assert steps.loc[200, "high"] < steps.loc[100, "high"]


def test_late_half_auc_is_the_mean_accuracy_over_the_second_half():
    # accuracy = step / 1000, evaluated every 100 steps: over steps 500..1000 its mean is (0.5 + 1.0) / 2
    rising = pd.DataFrame({"step": range(0, 1001, 100), "value": [s / 1000 for s in range(0, 1001, 100)]})
    assert analysis.late_half_auc(rising, 1000) == pytest.approx(0.75, abs=1e-12)
    assert analysis.late_half_auc(rising[rising["step"] <= 500], 1000) == pytest.approx(0.5)  # one evaluation
    assert math.isnan(analysis.late_half_auc(rising[rising["step"] < 500], 1000))  # none in the second half


def test_late_stage_counts_collapses_and_gives_intervals_per_method():
    runs, curves = frame(late_records()), curves_frame(late_records())
    late = analysis.late_stage(runs, curves).set_index("method")
    assert late.loc["copc", "collapsed"] == 2 and late.loc["copc", "collapse_steps"] == "300, 700"
    assert late.loc["tis", "collapsed"] == 0 and late.loc["tis", "collapse_steps"] == ""
    # the records' peak is final + 0.1 for every run: final − peak is −0.1 everywhere, its interval a point
    assert late.loc["copc", ["final_minus_peak", "final_minus_peak_low", "final_minus_peak_high"]].tolist() == (
        pytest.approx([-0.1, -0.1, -0.1])
    )
    # late-half AUC per run: 0.75 for the 1,000-step runs; the 500-step run's second half is steps 300..500: 0.4
    assert late.loc["copc", "late_auc"] == pytest.approx((4 * 0.75 + 0.4) / 5)
    assert late.loc["copc", "late_auc_low"] < late.loc["copc", "late_auc"] < late.loc["copc", "late_auc_high"]
    assert late.loc["tis", "late_auc"] == pytest.approx(0.75)
    again = analysis.late_stage(runs, curves)  # the same on every call
    pd.testing.assert_frame_equal(again, analysis.late_stage(runs, curves))
    # adding a method does not move another method's interval
    more = late_records() + [
        trial("v0", INF, INF, 32, 100, 0.1, method="vtrace", steps=1000),
        trial("v1", INF, INF, 32, 101, 0.3, method="vtrace", steps=1000),
    ]
    grown = analysis.late_stage(frame(more), curves_frame(more)).set_index("method")
    assert grown.loc["copc", "late_auc_low"] == late.loc["copc", "late_auc_low"]


def test_late_stage_averages_a_grids_cells_per_seed_before_its_interval():
    """Two cells × three seeds, a run's held-out accuracy flat at v (its late-half AUC is v): the seed means are
    0.6, 0.7, 0.8, and the interval is t over those three, not over six runs as if independent (±0.148 there)."""
    values = {(1.5, 0): 0.5, (1.5, 1): 0.6, (1.5, 2): 0.7, (4.0, 0): 0.7, (4.0, 1): 0.8, (4.0, 2): 0.9}
    records = [
        trial(f"r{tp}-{s}", tp, 2.0, 8, s, v, steps=1000, history={"eval/accuracy": curve([0, 500, 1000], [v] * 3)})
        for (tp, s), v in values.items()
    ]
    (row,) = analysis.late_stage(frame(records), curves_frame(records)).itertuples()
    half = stats.t.ppf(0.975, 2) * 0.1 / math.sqrt(3)  # the seed means' sd is 0.1
    assert (row.n_runs, row.n_seeds) == (6, 3)
    assert (row.late_auc, row.late_auc_low, row.late_auc_high) == pytest.approx((0.7, 0.7 - half, 0.7 + half))


def test_late_stage_reads_a_seed_missing_from_a_cell_by_the_cells_it_has():
    """Cell A (τ_p 1.5, level 0.4) on seeds 0–2, cell B (τ_p 4, level 0.8) on seeds 0–3 (a failed trial: A lacks
    seed 3); seed effects (−0.1, 0, 0.1, 0.2); a run's held-out accuracy flat at level + effect, so its late-half
    AUC is that, and its final − peak the records' −0.1. By hand: runs A 0.3, 0.4, 0.5 (mean 0.4), B 0.7, 0.8, 0.9,
    1.0 (mean 0.85); deviations from their cell's mean A −0.1, 0, 0.1, B −0.15, −0.05, 0.05, 0.15; per seed −0.125,
    −0.025, 0.075, 0.15; centred on the mean of the cells' means, 0.625. Pooled over runs, the mean would be 4.6 / 7
    ≈ 0.657 (seed 3's lone run, in the higher cell, pulling it up) and its interval counted 7 runs."""
    effect = {0: -0.1, 1: 0.0, 2: 0.1, 3: 0.2}
    cells = {1.5: (0.4, (0, 1, 2)), 4.0: (0.8, (0, 1, 2, 3))}
    records = [
        trial(
            f"r{tp}-{s}",
            tp,
            2.0,
            8,
            s,
            v + effect[s],
            steps=1000,
            history={"eval/accuracy": curve([0, 500, 1000], [v + effect[s]] * 3)},
        )
        for tp, (v, seeds) in cells.items()
        for s in seeds
    ]
    (row,) = analysis.late_stage(frame(records), curves_frame(records)).itertuples()
    per_seed = np.array([-0.125, -0.025, 0.075, 0.15])
    values = 0.625 + per_seed - per_seed.mean()
    half = stats.t.ppf(0.975, 3) * values.std(ddof=1) / 2  # √4 seeds
    assert (row.n_runs, row.n_seeds) == (7, 4)
    assert (row.late_auc, row.late_auc_low, row.late_auc_high) == pytest.approx((0.625, 0.625 - half, 0.625 + half))
    assert (row.final_minus_peak, row.final_minus_peak_low) == pytest.approx((-0.1, -0.1))


def test_late_stage_intervals_stay_inside_what_an_accuracy_can_be():
    """Four runs near 1 and one collapsed to 0 (tool-math's long runs): the t interval of the late-half AUC's mean
    reaches past 1 and is cut there, as final − peak's is cut at 0; the lower ends are scipy's own."""
    values = np.array([0.99, 0.98, 1.0, 0.97, 0.0])
    mean, low, high = analysis.mean_interval(values)
    t = stats.t.ppf(0.975, 4) * values.std(ddof=1) / math.sqrt(5)
    assert (low, high) == pytest.approx((mean - t, mean + t)) and high > 1.0  # uncut, by its formula
    assert analysis.mean_interval(values, bounds=(0.0, 1.0)) == pytest.approx((mean, mean - t, 1.0))
    assert analysis.mean_interval(values - 1.0, bounds=(-1.0, 0.0)) == pytest.approx((mean - 1, mean - 1 - t, 0.0))
    runs, curves = frame(late_records()), curves_frame(late_records())
    late = analysis.late_stage(runs, curves)
    assert (late["late_auc_low"] >= 0).all() and (late["late_auc_high"] <= 1).all()
    assert (late["final_minus_peak_low"] >= -1).all() and (late["final_minus_peak_high"] <= 0).all()


def test_rliables_aggregates_by_their_definitions_on_hand_values():
    """IQM of (0.1, 0.6, 0.65, 0.7, 0.9): the middle three (scipy trims one run from each end at 25 %), 0.65.
    P(X > Y) + ½ P(X = Y) for X = (0.6, 0.7), Y = (0.6, 0.5): pairs 0.6–0.6 tie (½), 0.6–0.5, 0.7–0.6, 0.7–0.5 above:
    3.5 / 4. The performance profile at τ = 0.62 of the first: 3 of 5 runs above."""
    x = np.array([0.6, 0.1, 0.9, 0.65, 0.7])
    assert analysis.iqm(x) == pytest.approx(0.65)
    assert analysis.improvement_probability(np.array([0.6, 0.7]), np.array([0.6, 0.5])) == pytest.approx(3.5 / 4)
    records = [trial(f"a{s}", None, None, 4, s, v, method="tis") for s, v in enumerate(x)]  # no band
    records += [trial(f"c{s}", 2.0, 1.0, 4, s, v, method="copc") for s, v in enumerate([0.7, 0.8, 0.75, 0.7, 0.9])]
    runs = frame(records)
    agg = analysis.aggregates(analysis.method_finals(runs)).set_index("method")
    assert agg.loc["tis", "iqm"] == pytest.approx(0.65) and agg.loc["tis", "low"] <= 0.65 <= agg.loc["tis", "high"]
    improve = analysis.improvement_table(analysis.method_finals(runs), ["copc"], ["tis"]).iloc[0]
    assert (improve.method, improve.baseline) == ("copc", "tis")
    pairs = [(a, b) for a in [0.7, 0.8, 0.75, 0.7, 0.9] for b in x]
    assert improve.p == pytest.approx(sum((a > b) + 0.5 * (a == b) for a, b in pairs) / 25)
    fig = figures.performance_profiles(analysis.method_finals(runs))
    tis = next(tr for tr in fig.data if tr.name == "tis")
    at = list(np.round(tis.x, 3)).index(0.62)
    assert tis.y[at] == pytest.approx(3 / 5) and tis.customdata[at] == 3  # the hover counts runs: "3 of 5"
    # the interval plot: COPC's IQM (0.7, 0.75, 0.8 in the middle: 0.75) on top, its bars reaching the interval's ends
    (points,) = figures.iqm_intervals(agg.reset_index(), ["copc"]).data
    assert list(points.y) == ["tis", "copc"] and list(points.x) == pytest.approx([0.65, 0.75])
    assert list(points.marker.color) == ["#1f77b4", "#ff7f0e"]  # a baseline blue, the reading orange
    ends = np.array(points.x) + np.array(points.error_x.array), np.array(points.x) - np.array(points.error_x.arrayminus)
    assert ends[0] == pytest.approx(agg.loc[["tis", "copc"], "high"]) and ends[1] == pytest.approx(
        agg.loc[["tis", "copc"], "low"]
    )
    # each lag's panel its own order: B (0.95) above A (0.90) at k = 0 although B's mean over both lags is lower
    two = pd.DataFrame(
        [("a", 0, 0.90), ("b", 0, 0.95), ("b", 32, 0.10), ("c", 32, 0.50)], columns=["method", "staleness", "iqm"]
    ).assign(n_cells=1, n=5, low=0.0, high=1.0)
    assert [list(t.y) for t in figures.iqm_intervals(two, []).data] == [["a", "b"], ["b", "c"]]
    one = analysis.aggregates({("vtrace", 4): analysis.MethodRuns(np.array([0.4]), 1, ["v0"])})  # one run: no interval
    (alone,) = figures.iqm_intervals(one, []).data
    assert alone.text == ("vtrace<br>IQM 0.400 (no interval), 1 run",) and list(alone.error_x.array) == [0]
    (matrix,) = figures.improvement_heatmaps(improve.to_frame().T).data
    assert np.array(matrix.z, float).ravel() == pytest.approx([improve.p]) and (matrix.x, matrix.y) == (
        ("tis",),
        ("copc",),
    )
    assert matrix.text[0][0] == f"{improve.p:.2f}<br>[{improve.low:.2f}, {improve.high:.2f}]"  # ½ inside: plain
    clear = pd.DataFrame([{"method": "copc", "baseline": "tis", "staleness": 4, "p": 0.9, "low": 0.6, "high": 1.0}])
    (bold,) = figures.improvement_heatmaps(clear).data
    assert [list(r) for r in bold.text] == [["<b>0.90</b><br>[0.60, 1.00]"]]  # ½ outside the interval: bold
    assert [list(r) for r in bold.customdata] == [["0.90 [0.60, 1.00]"]]


def test_a_grid_enters_the_aggregates_by_its_selection_free_picks_not_its_best_cell():
    """A method swept over a grid is one method in the aggregates: on each seed, the run at the cell with the best mean
    over the other seeds. Cell A (τ_p 2) ends 0.95 on seed 0 and 0.5 on the rest, cell B (τ_p 4) 0.6 on every seed:
    seed 0 held out, A's others average 0.5 < 0.6, so B (0.6); seeds 1–4 held out, A's others average (0.95 + 1.5) / 4
    = 0.6125 > 0.6, so A (0.5). The picks are (0.6, 0.5, 0.5, 0.5, 0.5) — not B, the best cell on all five seeds —
    their IQM 0.5 (scipy trims one run from each end)."""
    a, b = [0.95, 0.5, 0.5, 0.5, 0.5], [0.6] * 5
    tis = [0.6, 0.1, 0.9, 0.65, 0.7]
    records = [trial(f"t{s}", None, None, 4, s, v, method="tis") for s, v in enumerate(tis)]
    records += [trial(f"a{s}", 2.0, 1.0, 4, s, v, method="copc") for s, v in enumerate(a)]
    records += [trial(f"b{s}", 4.0, 1.0, 4, s, v, method="copc") for s, v in enumerate(b)]
    runs = frame(records)
    picks = analysis.method_finals(runs)
    assert list(picks) == [("copc", 4), ("tis", 4)]
    assert picks[("copc", 4)].finals.tolist() == [0.6, 0.5, 0.5, 0.5, 0.5] and picks[("copc", 4)].n_cells == 2
    assert picks[("tis", 4)].finals.tolist() == tis and picks[("tis", 4)].n_cells == 1
    assert picks[("copc", 4)].run_ids == ["b0", "a1", "a2", "a3", "a4"]  # the runs at each seed's picked cell
    agg = analysis.aggregates(picks).set_index("method")
    assert agg.loc["copc", "iqm"] == pytest.approx(0.5) and (agg.loc["copc", "n_cells"], agg.loc["copc", "n"]) == (2, 5)
    improve = analysis.improvement_table(picks, ["copc"], ["tis"])
    assert len(improve) == 1  # one row per reading and baseline, not one per cell
    pairs = [(x, y) for x in [0.6, 0.5, 0.5, 0.5, 0.5] for y in tis]
    assert improve.iloc[0].p == pytest.approx(sum((x > y) + 0.5 * (x == y) for x, y in pairs) / 25)
    names = [tr.name for tr in figures.performance_profiles(picks).data]
    assert names == ["copc (tuned over 2 cells)", "tis"]
    one_seed = frame([r for r in records if r["run_id"] in ("a0", "b0", "t0")])  # a grid on one seed has no picks
    assert list(analysis.method_finals(one_seed)) == [("tis", 4)]


def test_the_picks_keep_every_run_of_a_picked_cell_drop_unscored_finals_and_label_cells_per_lag():
    """Two runs of the picked cell on one seed are two runs (not their mean); a run with no final accuracy is left out;
    a method logged without τ_p at one lag and with it at another is labelled per lag (the report used to fail)."""
    records = [trial(f"a{s}", 2.0, 1.0, 4, s, 0.9, method="copc") for s in (0, 1)]
    records += [trial("a0-again", 2.0, 1.0, 4, 0, 0.7, method="copc")]
    records += [trial(f"b{s}", 4.0, 1.0, 4, s, 0.2, method="copc") for s in (0, 1)]
    records += [trial(f"t{s}", None, None, 4, s, 0.5, method="tis") for s in (0, 1)]
    records += [trial("t2", None, None, 4, 2, None, method="tis")]  # failed: no final accuracy
    records += [trial(f"z{s}-{ta}", None, ta, 0, s, v) for s in (0, 1) for ta, v in ((1.0, 0.3), (2.0, 0.4))]
    picks = analysis.method_finals(frame(records))
    assert picks[("copc", 4)].run_ids == ["a0", "a0-again", "a1"]
    assert picks[("copc", 4)].finals.tolist() == [0.9, 0.7, 0.9]
    assert picks[("tis", 4)].run_ids == ["t0", "t1"]
    assert picks[("copc", 0)].run_ids == ["z0-2.0", "z1-2.0"] and picks[("copc", 0)].n_cells == 2


def test_method_curves_draw_the_mean_of_the_picked_runs_between_the_lowest_and_the_highest():
    """Per method and k, the mean held-out accuracy of the runs `method_finals` picks at each evaluation, shaded from
    the lowest run to the highest: tis's runs (0.2, 0.4) and (0.4, 0.8) at steps 0 and 10 give the mean (0.3, 0.6)
    between (0.2, 0.4) and (0.4, 0.8); copc's grid draws only its picked cell's runs, (0.5, 0.9) and (0.7, 0.8) at τ_p
    2 (each seed's other seed ends better there than at τ_p 4): the mean (0.6, 0.85), the τ_p 4 runs left out."""

    def run(method, tp, seed, final, accuracies):
        history = {"eval/accuracy": curve([0, 10], accuracies)}
        return trial(f"{method}{tp}-{seed}", tp, 1.0 if tp else None, 4, seed, final, method=method, history=history)

    records = [run("tis", None, 0, 0.4, [0.2, 0.4]), run("tis", None, 1, 0.8, [0.4, 0.8])]
    records += [run("copc", 2.0, 0, 0.9, [0.5, 0.9]), run("copc", 2.0, 1, 0.8, [0.7, 0.8])]
    records += [run("copc", 4.0, s, 0.1, [0.0, 0.1]) for s in (0, 1)]
    fig = figures.method_curves(analysis.method_finals(frame(records)), curves_frame(records))
    lines = {tr.name: tr for tr in fig.data if tr.meta != "spread"}
    assert sorted(lines) == ["copc (tuned over 2 cells)", "tis"]
    assert lines["tis"].y == pytest.approx((0.3, 0.6)) and list(lines["tis"].x) == [0, 10]
    assert lines["copc (tuned over 2 cells)"].y == pytest.approx((0.6, 0.85))
    bands = {g: [list(tr.y) for tr in fig.data if tr.legendgroup == g and tr.meta == "spread"] for g in ("tis", "copc")}
    assert bands == {"tis": [[0.4, 0.8], [0.2, 0.4]], "copc": [[0.7, 0.9], [0.5, 0.8]]}  # highest, then lowest
    assert all(tr.visible for tr in fig.data if tr.meta == "spread")  # two methods: the spread shown at first
    records += [run(m, None, 0, 0.5, [0.3, 0.5]) for m in ("cispo", "seq_tis")]  # four methods: hidden at first
    crowded = figures.method_curves(analysis.method_finals(frame(records)), curves_frame(records))
    assert [tr.visible for tr in crowded.data if tr.meta == "spread"] == [False] * 8


def test_the_summary_reads_each_grids_interaction_against_seed_noise_and_says_when_no_baseline_ran():
    """Seed noise alone makes an interaction fraction positive: the summary gives each grid's additive-null p and the
    noise's median beside the fraction, in that grid's row (an additive grid at k = 0, a coupled one at k = 4); a
    report with no baseline says why it has no probability of improvement."""
    records = grid_records(lambda i, a, k: 0.3 + 0.1 * i + 0.05 * a + (0.1 * i * a if k else 0.0))
    runs = frame(records)
    page = render(ReportData(title="t", runs=runs, curves=curves_frame(records), sources={}, n_boot=300))
    null = analysis.additive_null(runs, 300).set_index("staleness")
    assert null.loc[4, "p_value"] < 0.05 < null.loc[0, "p_value"]  # the coupled grid, and the additive one
    summary = page.split('id="summary"', 1)[1].split("</table>", 1)[0]
    assert "p, additive null (noise alone gives)" in summary
    for k in (0, 4):
        row = next(r for r in summary.split("<tr>") if f"<td>{k}</td>" in r)
        cell = f"{null.loc[k, 'p_value']:.3f} ({null.loc[k, 'null_median']:.2f})"
        assert cell in row and summary.count(cell) == 1, (k, cell)
    assert "No probability of improvement: these runs hold no two-channel method beside a baseline" in page
