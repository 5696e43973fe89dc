"""bench/regime_tables: cutting the two-channel grids to a slice of τ_a values."""

import math

import pandas as pd
import pytest

from bench.regime_tables import cut_grids, has_grid, lag_table

INF = math.inf


def _runs() -> pd.DataFrame:
    rows = []
    # a two-channel grid: τ_p {1.5, 4} × τ_a {1, 1.25, inf}
    for tp in (1.5, 4.0):
        for ta in (1.0, 1.25, INF):
            rows.append({"method": "copc", "tau_policy": tp, "tau_advantage": ta})
    # a one-band method run at τ_a 1 and 2 (τ_p not swept): not a grid, kept whole
    rows += [{"method": "copc_advantage_only", "tau_policy": INF, "tau_advantage": ta} for ta in (1.0, 2.0)]
    # a baseline whose logged τ_a is 1: kept
    rows.append({"method": "sync_ppo", "tau_policy": INF, "tau_advantage": 1.0})
    return pd.DataFrame(rows)


def test_cut_grids_keeps_the_slice_of_two_channel_grids_and_every_other_method():
    cut = cut_grids(_runs(), [1.25, INF])
    grid = cut[cut["method"] == "copc"]
    assert sorted(zip(grid["tau_policy"], grid["tau_advantage"])) == [(1.5, 1.25), (1.5, INF), (4.0, 1.25), (4.0, INF)]
    assert sorted(cut[cut["method"] == "copc_advantage_only"]["tau_advantage"]) == [1.0, 2.0]
    assert list(cut[cut["method"] == "sync_ppo"]["tau_advantage"]) == [1.0]
    assert len(cut) == 4 + 2 + 1


def test_has_grid_sees_a_two_channel_grid_alone_and_not_a_one_band_method():
    runs = _runs().assign(scored=True)
    assert has_grid(runs[runs["method"] == "copc"])  # a grid run alone, as a fresh-seed confirmation runs it
    assert not has_grid(runs[runs["method"] != "copc"])  # one band swept, or none
    assert not has_grid(runs.assign(scored=False))  # nothing finished


def test_lag_table_pairs_each_baseline_by_seed_between_consecutive_lags():
    """A baseline at 0.70 + seed/100 at k = 8 and 0.10 + seed/50 at k = 32 (seed 2 collapsed): the differences
    are −0.60, −0.59, −0.58, mean −0.59; sync_ppo (k = 0 only) and COPC's grid take no row."""
    rows = []
    for seed in range(3):
        rows.append({"method": "async_ppo_recompute", "staleness": 8, "seed": seed, "final": 0.70 + seed / 100})
        rows.append({"method": "async_ppo_recompute", "staleness": 32, "seed": seed, "final": 0.10 + seed / 50})
        rows.append({"method": "sync_ppo", "staleness": 0, "seed": seed, "final": 0.7})
        for tp in (1.5, 4.0):
            for ta in (1.0, 2.0):
                rows += [
                    {"method": "copc", "staleness": k, "seed": seed, "final": 0.5, "tp": tp, "ta": ta} for k in (8, 32)
                ]
    runs = pd.DataFrame(rows).rename(columns={"final": "final_accuracy", "tp": "tau_policy", "ta": "tau_advantage"})
    runs = runs.fillna({"tau_policy": INF, "tau_advantage": INF}).assign(
        scored=True,
        collapsed=lambda f: (f["method"] == "async_ppo_recompute") & (f["staleness"] == 32) & (f["seed"] == 2),
    )
    text = lag_table(runs)
    body = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| method")]
    assert len(body) == 1 and body[0].startswith("| async_ppo_recompute | 0.71 ± 0.01 | 0.12 ± 0.02 | -0.59 [")
    assert body[0].endswith("(3) | 0/3 / 1/3 |")
    low, high = (float(x) for x in body[0].split("[")[1].split("]")[0].split(", "))
    half = 4.302652729911275 * 0.01 / 3**0.5  # the t interval of the mean difference: t₀.₉₇₅ (2 df) · sd / √3
    assert (low, high) == (round(-0.59 - half, 2), round(-0.59 + half, 2))
    assert lag_table(runs[runs["staleness"] != 32]) == ""  # one nonzero lag: nothing to pair


def test_long_table_reads_survival_losses_and_paired_late_differences():
    from bench.regime_tables import long_table
    from reports.frames import curves_frame
    from tests.report_records import curve, trial
    from tests.test_reports import frame, late_records

    # late_records: copc (two of five collapsed at 300 and 700, one run of 500 steps) and tis (three, none);
    # a COPC reading on tis's seeds whose held-out accuracy is 0.1 lower at every evaluation
    lower = curve(range(0, 1001, 100), [s / 1000 - 0.1 for s in range(0, 1001, 100)])
    records = late_records() + [
        trial(
            f"b{i}", 4.0, 1.5, 32, 100 + i, 0.6, method="copc[behavior]", steps=1000, history={"eval/accuracy": lower}
        )
        for i in range(3)
    ]
    text = long_table(frame(records), curves_frame(records))
    first = text.split("\n\n")[0]
    rows = {line.split(" | ")[0].lstrip("| "): line for line in first.splitlines() if line.startswith("| ")}
    # Kaplan–Meier at 300 / 600 / 1,000: 4/5, 4/5, 4/5 · 2/3 (derived in tests/test_reports.py)
    assert "| 2 (300, 700) | 0.80 / 0.80 / 0.53 |" in rows["copc"]
    assert "| 0 | 1.00 / 1.00 / 1.00 |" in rows["tis"] and "| 0.75 [0.75, 0.75] |" in rows["tis"]
    # the reading minus tis, paired on seeds 100–102: final accuracy 0.6 − 0.7, late-half AUC exactly −0.1
    finals, lates = text.split("final accuracy, paired")[1].split("late-half AUC, paired")
    behavior_final = next(line for line in finals.splitlines() if line.startswith("| copc[behavior] |"))
    behavior_late = next(line for line in lates.splitlines() if line.startswith("| copc[behavior] |"))
    assert behavior_final.endswith("| -0.10 [-0.10, -0.10] (3) |")  # the last column is tis
    assert behavior_late.endswith("| -0.10 [-0.10, -0.10] (3) |")


def test_the_seed_spread_ratio_reads_an_f_interval():
    """Five seeds each: the variance ratio's interval is ratio / F₀.₉₇₅(4, 4) to ratio · F₀.₉₇₅(4, 4) (F(4, 4) is
    its own reciprocal's mirror), F₀.₉₇₅(4, 4) = 9.6045 (tables); as sds, a factor √9.6045 = 3.10 each way."""
    import numpy as np

    from bench.seed_spread import sd_ratio

    one = np.array([0.60, 0.62, 0.64, 0.66, 0.68])
    ratio, low, high = sd_ratio(2 * one, one)  # twice the spread
    assert ratio == pytest.approx(2.0)
    assert (low, high) == pytest.approx((2 / 9.6045**0.5, 2 * 9.6045**0.5), rel=1e-4)


def _falls(k: int, collapses: dict[str, list[int]], runs: int = 5) -> pd.DataFrame:
    """Runs of each method at lag k, the first ones collapsed at the steps given, the rest not."""
    return pd.DataFrame(
        [
            {"method": m, "staleness": k, "scored": True, "collapsed": i < len(steps), "collapse_step": steps[i]}
            if i < len(steps)
            else {"method": m, "staleness": k, "scored": True, "collapsed": False, "collapse_step": math.nan}
            for m, steps in collapses.items()
            for i in range(runs)
        ]
    )


def test_claim_c_is_read_by_the_long_studys_written_criteria():
    """The plan's clauses (docs/journal/2026-12-06-1-long-study-plan.md) on tool-math's 64-update long runs as the
    journal prints their collapse steps (2026-12-06-6): 7 of 13 baselines collapse in 2 or more runs, 5 of them past
    step 300 (V-trace's third at step 300 is not past it), the least-collapsing baselines never: refuted, as RESULTS
    says; then one case per other branch, and a slice not read."""
    from bench.regime_tables import claim_c_table

    journal = {
        "a3po": [915], "async_ppo": [], "async_ppo_recompute": [55, 65, 110, 125, 325], "cispo": [890, 970],
        "copc[behavior]": [], "copc[interpolated]": [730], "copc[recomputed]": [910], "decoupled_ppo": [755, 985],
        "geo_rs": [], "icepop": [940], "m2po": [325, 940], "seq_mis": [530, 850], "seq_tis": [745, 825, 970],
        "tis": [975], "vcpo": [1000], "vtrace": [75, 75, 300],
    }  # fmt: skip
    methods = sorted(journal)
    row = claim_c_table(_falls(32, journal), {32: methods}).splitlines()[2]
    assert row == "| 32 | 16 of 16 | [behavior] 0/5, [interpolated] 1/5, [recomputed] 1/5 | 0 | 7 of 13 (5) | refuted |"
    baselines = [m for m in methods if not m.startswith("copc[")]
    readings = ["copc[behavior]", "copc[interpolated]", "copc[recomputed]"]

    def verdict(collapses: dict[str, list[int]]) -> str:
        return claim_c_table(_falls(8, collapses), {8: methods}).splitlines()[2].split(" | ")[-1].rstrip(" |")

    late, early = [500, 900], [50, 100]
    # a reading at 0 while 7 baselines collapse twice late and the rest once: confirmed
    confirming = {r: [] for r in readings} | {b: late if i < 7 else [800] for i, b in enumerate(baselines)}
    assert verdict(confirming) == "confirmed"
    # the same with 6 late and one early: no branch holds
    assert verdict(confirming | {baselines[6]: early}) == "partly"
    # the same with one baseline never collapsing and the readings once: both branches' clauses hold, both said
    both = confirming | {baselines[12]: [], **{r: [700] for r in readings}}
    assert verdict(both) == "confirmed and refuted"
    # a method short of its five runs: not read
    short = _falls(8, confirming)
    assert "not read: a slice (15 of 16 methods)" in claim_c_table(short.iloc[1:], {8: methods})


def test_aggregate_tables_print_the_reports_iqm_and_improvement_matrix():
    """COPC's finals (0.7, 0.8, 0.75, 0.7, 0.9) and TIS's (0.6, 0.1, 0.9, 0.65, 0.7) at k = 4: scipy's 25 % trimmed
    mean keeps the middle three of five (IQM 0.750 and 0.650); COPC ends above TIS in 18 of 25 pairs and ties in 3,
    P = 19.5 / 25 = 0.78. A table with no method prints nothing."""
    from bench.regime_tables import aggregate_tables
    from tests.report_records import trial
    from tests.test_reports import frame

    records = [trial(f"c{s}", 2.0, 1.0, 4, s, v) for s, v in enumerate([0.7, 0.8, 0.75, 0.7, 0.9])]
    records += [trial(f"t{s}", None, None, 4, s, v, method="tis") for s, v in enumerate([0.6, 0.1, 0.9, 0.65, 0.7])]
    lines = aggregate_tables(frame(records)).splitlines()
    assert lines[2].startswith("| copc | 4 | 5 | 0.750 [") and lines[3].startswith("| tis | 4 | 5 | 0.650 [")
    assert lines[-3:-1] == ["| reading | tis |", "|---|---|"] and lines[-1].startswith("| copc | 0.780 [")
    assert aggregate_tables(frame(records)[lambda f: f["method"] == "none"]) == ""


def test_at_step_reads_a_long_run_as_if_it_had_ended_there_and_paired_p_is_the_paired_t_tests():
    """Run a collapsed at step 200 and evaluated 0.2, 0.6, 0.0, 0.0 at steps 0, 100, 200, 300 (and 0.0 at 400): at step
    300 its final is 0.0, its AUC the trapezoid mean (40 + 30 + 0) / 300 and it has collapsed. Run b collapsed at 400
    and was evaluated 0.2 at 0 and 0.8 at 300: final 0.8, AUC 0.5, not collapsed by 300. Run c has no evaluation at
    300: not scored. Paired t of (0.1, 0.2, 0.3) against (0, 0, 0.1): differences 0.1, 0.2, 0.2, t = 5 on 2 degrees
    of freedom, whose CDF is ½ + t / (2 √(2 + t²)), so p = 1 − 5 / √27."""
    from bench.regime_tables import at_step
    from reports.analysis import paired_p

    runs = pd.DataFrame(
        {"run_id": ["a", "b", "c"], "collapsed": [True, True, False], "collapse_step": [200.0, 400.0, math.nan]}
    ).assign(scored=True, final_accuracy=0.5, auc_accuracy=0.5)
    evals = {"a": [(0, 0.2), (100, 0.6), (200, 0.0), (300, 0.0), (400, 0.0)], "b": [(0, 0.2), (300, 0.8), (500, 0.0)]}
    evals["c"] = [(0, 0.2), (250, 0.7)]
    curves = pd.DataFrame(
        [
            {"run_id": r, "metric": "eval/accuracy", "step": s, "value": v}
            for r, points in evals.items()
            for s, v in points
        ]
    )
    got = at_step(runs, curves, 300).set_index("run_id")
    assert got.loc["a", "final_accuracy"] == 0.0 and got.loc["a", "auc_accuracy"] == pytest.approx(70 / 300)
    assert got.loc["b", "final_accuracy"] == 0.8 and got.loc["b", "auc_accuracy"] == pytest.approx(0.5)
    assert list(got["collapsed"]) == [True, False, False] and list(got["scored"]) == [True, True, False]
    a, b = pd.Series([0.1, 0.2, 0.3]), pd.Series([0.0, 0.0, 0.1])
    assert paired_p(a, b) == pytest.approx(1 - 5 / 27**0.5) and paired_p(a, a) == 1.0 and math.isnan(paired_p(a[:1], b))
