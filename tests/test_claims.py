"""The claims: the claims preset's points, and the report's claim tables on constructed runs with known answers."""

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from copc_core.rl.methods import preset
from reports.analysis import additive_null
from reports.claims import claim_tables, has_claims
from sweeps.presets import CLAIMS_BASELINES, CLAIMS_SPACE, PRESETS
from sweeps.space import SweepSpace

NOISE = {0: -0.01, 1: 0.0, 2: 0.01}  # per seed: a tight spread, so intervals are narrow but real


def row(method, tp, ta, k, seed, acc, collapsed=False, collapse_step=None, ess=(), spikes=()):
    band = lambda v: math.inf if v is None else float(v)  # noqa: E731  (a method without the band: ∞ in frames)
    return {
        "method": method,
        "tau_policy": band(tp),
        "tau_advantage": band(ta),
        "has_tau_policy": tp is not None,
        "has_tau_advantage": ta is not None,
        "staleness": k,
        "seed": seed,
        "scored": True,
        "objective": acc + NOISE[seed] - (0.5 if collapsed else 0.0),
        "final_accuracy": acc + NOISE[seed],
        "auc_accuracy": acc + NOISE[seed] - 0.3,
        "peak_accuracy": max(acc + NOISE[seed], 0.6),
        "collapsed": collapsed,
        "collapse_step": math.nan if collapse_step is None else float(collapse_step),
        "first_warning_step": float(min([*ess, *spikes], default=math.nan)),
        "ess_drop_count": float(len(ess)),
        "grad_spike_count": float(len(spikes)),
    }


def test_the_claims_preset_is_one_sweep_of_the_grid_ablations_and_baselines():
    space = SweepSpace(methods=CLAIMS_SPACE.methods, staleness=[0, 4], seeds=[0, 1, 2])
    points = space.grid()
    keys = [(p.method, p.tau_policy, p.tau_advantage, p.staleness, p.seed) for p in points]
    assert len(keys) == len(set(keys))
    # COPC 3×3 cells, 3 + 3 ablation cells, 5 off-policy baselines at 2 lags and sync_ppo at k = 0, 3 seeds each
    assert len(points) == (9 * 2 + 6 * 2 + 5 * 2 + 1) * 3
    assert {p.staleness for p in points if p.method == "sync_ppo"} == {0}
    assert all(p.tau_advantage is None for p in points if p.method == "copc_policy_only")
    assert {p.method for p in points} == {"copc", "copc_policy_only", "copc_advantage_only", *CLAIMS_BASELINES}
    assert all(preset(m).default_tau_policy is None for m in CLAIMS_BASELINES)
    assert PRESETS["claims-tool-math"][0] == PRESETS["claims-search"][0] == CLAIMS_SPACE


def constructed_rows():
    """At k = 4 τ_p's effect reverses with τ_a: +0.6 at τ_a = 1, −0.6 at τ_a = 4 (other cells 0.5);
    tis is the best baseline (0.9 > COPC's 0.8); at k = 64 vtrace collapses after an ESS warning."""
    taus = [1.5, 2.0, 4.0]
    corner = {(1.5, 1.0): 0.2, (4.0, 1.0): 0.8, (1.5, 4.0): 0.8, (4.0, 4.0): 0.2}
    rows = []
    for seed in range(3):
        for tp, ta in itertools.product(taus, [1.0, 2.0, 4.0]):
            rows.append(row("copc", tp, ta, 4, seed, corner.get((tp, ta), 0.5)))
            rows.append(row("copc", tp, ta, 64, seed, 0.5))
        for k in (4, 64):
            rows += [row("copc_policy_only", tp, None, k, seed, 0.4) for tp in taus]
            rows += [row("copc_advantage_only", None, ta, k, seed, 0.45) for ta in [1.0, 2.0, 4.0]]
            for m in ["async_ppo", "decoupled_ppo", "icepop"]:
                rows.append(row(m, None, None, k, seed, 0.3))
            rows.append(row("tis", None, None, k, seed, 0.9 if k == 4 else 0.3))
            rows.append(
                row(
                    "vtrace",
                    None,
                    None,
                    k,
                    seed,
                    0.0 if k == 64 else 0.3,
                    collapsed=k == 64,
                    collapse_step=30 if k == 64 else None,
                    ess=[20] if k == 64 else [],
                )
            )
    return rows


def rows(text: str, heading: str) -> list[list[str]]:
    """The rows of the first Markdown table after `heading`."""
    lines = text[text.index(heading) :].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|---"))
    out = []
    for line in lines[start + 1 :]:
        if not line.startswith("|"):
            break
        out.append([c.strip() for c in line.strip().strip("|").split("|")])
    return out


def table(text: str, heading: str) -> dict[str, list[str]]:
    """The first Markdown table after `heading`: first cell → all cells."""
    return {r[0]: r for r in rows(text, heading)}


def test_claim_tables_find_the_known_reversal_and_the_better_baseline():
    runs = pd.DataFrame(constructed_rows())
    assert has_claims(runs) and not has_claims(runs[runs["method"] == "copc"])
    text = claim_tables(runs)
    coupling = table(text, "#### (a)")
    k4 = coupling["4"]
    assert k4[1] == "9"  # 3 τ_p pairs × 3 τ_a pairs
    assert int(k4[4]) >= 1  # significant reversals
    assert "-1.20" in k4[7] and "τ_p 1.5→4, τ_a 1 vs 4" in k4[7]  # E_b − E_a = −0.6 − 0.6
    assert k4[6].startswith("0.000 ")  # p = 1/2001: no null draw reaches the observed share
    assert "grid flat" in coupling["64"][5] and coupling["64"][6] == "—"
    verdict = {r[1]: r for r in rows(text, "| method | k | best cell") if r[0] == "copc"}
    assert verdict["4"][2].startswith("0.80") and verdict["4"][3].startswith("tis 0.90") and verdict["4"][4] == "no"
    assert verdict["4"][5] == "no"  # [0.79, 0.81] vs [0.89, 0.91]
    stability = table(text, "#### (c)")
    assert stability["vtrace"][2] == "3 (100%)" and stability["vtrace"][5] == "3" and stability["vtrace"][6] == "3/3"
    assert stability["copc"][2] == "0 (0%)"
    region = table(text, "#### High-performing")
    head = text[text.index("| k | best of these") :].splitlines()[0].strip().strip("|").split("|")
    col = {h.strip(): i for i, h in enumerate(head)}
    # best of the three at k = 4 is COPC's 0.8: 2 of its 9 cells reach 0.72, no ablation cell does
    assert region["4"][1] == "0.80" and region["4"][col["copc"]] == "2/9 (22%)"
    assert region["4"][col["copc_policy_only"]].startswith("0/3") and region["4"][
        col["copc_advantage_only"]
    ].startswith("0/3")
    # at k = 64 COPC's flat 0.5 is the best; its 9 cells are within 90 %, advantage-only's 0.45 too,
    # policy-only's 0.40 not
    assert region["64"][col["copc"]] == "9/9 (100%)" and region["64"][col["copc_advantage_only"]].startswith("3/3")
    assert region["64"][col["copc_policy_only"]].startswith("0/3")


def test_selection_free_section_scores_the_chosen_cell_on_the_held_out_seed():
    """At k = 4 COPC's best cells tie at 0.8 on every other-seed mean; the tie goes to the first label
    (τ_p 1.5, τ_a 4), scored 0.8 + the seed's noise: 0.80. tis (0.9) is the baseline chosen on every seed, so
    COPC − tis = −0.10 on each seed, with no spread. Untuned COPC: (2 × 0.2 + 2 × 0.8 + 5 × 0.5) / 9 = 0.50."""
    from scipy import stats

    text = claim_tables(pd.DataFrame(constructed_rows()))
    scores = {(r[0], r[1]): r for r in rows(text, "#### (d)")}
    copc = scores["copc", "4"]
    half = (
        stats.t.ppf(0.975, 2) * np.std(list(NOISE.values()), ddof=1) / np.sqrt(3)
    )  # the t interval of a mean of 3 seeds

    def cell(mean: float) -> str:
        return f"{mean:.2f} [{mean - half:.2f}, {mean + half:.2f}] (3)"

    assert copc[2] == cell(0.8) and copc[3] == cell(0.5)
    assert copc[4] == "0: τ_p 1.5 τ_a 4; 1: τ_p 1.5 τ_a 4; 2: τ_p 1.5 τ_a 4" and copc[5] == cell(0.5)
    assert scores["baselines (chosen)", "4"][4] == "0: tis; 1: tis; 2: tis"
    assert scores["tis", "4"][2] == cell(0.9) and scores["tis", "4"][5] == "="
    against = table(text, "Tuned final of each two-channel method minus each baseline at k = 4")
    head = text[text.index("Tuned final of each two-channel method minus each baseline at k = 4") :]
    columns = rows(head, "| method |")  # the first table after the heading
    assert columns == [against["copc"]]
    header = head.splitlines()[2].strip().strip("|").split("|")
    col = {h.strip(): i for i, h in enumerate(header)}
    assert against["copc"][col["tis"]] == "-0.10 [-0.10, -0.10] (3)"
    assert against["copc"][col["baselines (chosen)"]] == "-0.10 [-0.10, -0.10] (3)"
    assert against["copc"][col["async_ppo"]] == "+0.50 [+0.50, +0.50] (3)"


def test_every_table_of_the_claims_section_has_as_many_header_cells_as_columns():
    """A bar inside a header cell (it was "largest |contrast|") splits it: the table no longer renders."""
    text = claim_tables(pd.DataFrame(constructed_rows()))
    lines = text.splitlines()
    separators = [i for i, line in enumerate(lines) if line.startswith("|---")]
    assert separators
    for i in separators:
        assert lines[i - 1].count("|") == lines[i].count("|"), lines[i - 1]


def test_the_coupling_tables_end_with_holms_correction_over_every_grids_additive_null_test():
    """Two grids carry a test: COPC's at k = 4 (the reversal: no null draw reaches it, p = 1/2001) and a second
    two-channel method's additive grid at k = 4 (share 0: p = 1). COPC's flat k = 64 grids have no test. So m = 2:
    Holm multiplies the smaller p by 2 (2/2001 = 0.0010) and the larger by 1, and only COPC at k = 4 is below 0.05."""
    base = constructed_rows()
    additive = {
        (tp, ta): 0.3 + 0.1 * i + 0.05 * j
        for i, tp in enumerate([1.5, 2.0, 4.0])
        for j, ta in enumerate([1.0, 2.0, 4.0])
    }
    extra = [
        row("copc[behavior]", tp, ta, 4, seed, additive[tp, ta])
        for seed in range(3)
        for tp, ta in itertools.product([1.5, 2.0, 4.0], [1.0, 2.0, 4.0])
    ]
    runs = pd.DataFrame(base + extra)
    null = additive_null(runs[runs["method"] == "copc[behavior]"])
    assert list(null["staleness"]) == [4] and null["p_value"].iloc[0] == 1.0
    line = next(x for x in claim_tables(runs).splitlines() if x.startswith("Multiple testing"))
    assert "hold 2 additive-null test(s)" in line and "times 2 − i + 1" in line
    assert "Below it: copc at k = 4 (p 0.0005, Holm 0.0010)." in line
    one = next(x for x in claim_tables(pd.DataFrame(base)).splitlines() if x.startswith("Multiple testing"))
    assert "hold 1 additive-null test(s)" in one and "(p 0.0005, Holm 0.0005)" in one


def test_holm_adjusts_step_down_by_hand():
    """p = (0.01, 0.04, 0.03, 0.005), m = 4: sorted 0.005·4 = 0.02, 0.01·3 = 0.03, 0.03·2 = 0.06, 0.04·1 = 0.04 → made
    non-decreasing 0.02, 0.03, 0.06, 0.06; back in the order given."""
    from reports.plan import holm

    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0]) and holm([]) == []  # 0.5·2 = 1, then max(1, 0.9·1)
