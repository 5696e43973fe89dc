"""bench/regime_tables: cutting the two-channel grids to a slice of τ_a values."""

import math

import pandas as pd

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
    assert -0.60 <= low <= -0.59 <= high <= -0.58
    assert lag_table(runs[runs["staleness"] != 32]) == ""  # one nonzero lag: nothing to pair
