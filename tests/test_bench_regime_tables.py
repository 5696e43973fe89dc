"""bench/regime_tables: cutting the two-channel grids to a slice of τ_a values."""

import math

import pandas as pd

from bench.regime_tables import cut_grids, has_grid

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
