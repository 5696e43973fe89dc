"""bench/claims.py: the job list and the claim tables on constructed results with known answers."""

import itertools

from bench.claims import ABLATIONS, BASELINES, claim_tables, jobs
from sweeps.presets import CLAIMS_SPACE, PRESETS

NOISE = {0: -0.01, 1: 0.0, 2: 0.01}  # per seed: a tight spread, so intervals are narrow but real


def row(method, tp, ta, k, seed, acc, collapsed=False, collapse_step=None, ess=(), spikes=()):
    return {"method": method, "tau_policy": tp, "tau_advantage": ta, "staleness": k, "seed": seed, "steps": 50,
            "final_accuracy": acc + NOISE[seed], "peak_accuracy": max(acc + NOISE[seed], 0.6), "collapsed": collapsed,
            "collapse_step": collapse_step, "ess_drop_steps": list(ess), "grad_norm_spike_steps": list(spikes),
            "warm_start_accuracy": 0.36, "wall_s": 1.0}


def test_jobs_cover_the_grid_ablations_and_baselines_once():
    out = jobs([0, 4], 3, [1.5, 4.0], [1.0, 2.0])
    keys = [(j["method"], j["tau_policy"], j["tau_advantage"], j["staleness"], j["seed"]) for j in out]
    assert len(keys) == len(set(keys))
    # COPC 2×2 cells, 2 + 2 ablation cells, 5 off-policy baselines at 2 lags and sync_ppo at k = 0, 3 seeds each
    assert len(out) == (4 * 2 + 4 * 2 + 5 * 2 + 1) * 3
    assert {j["staleness"] for j in out if j["method"] == "sync_ppo"} == {0}
    assert all(j["tau_advantage"] is None for j in out if j["method"] == "copc_policy_only")
    assert {j["method"] for j in out} == {"copc", *ABLATIONS, *BASELINES}
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
            rows.append(row("vtrace", None, None, k, seed, 0.0 if k == 64 else 0.3, collapsed=k == 64,
                            collapse_step=30 if k == 64 else None, ess=[20] if k == 64 else []))
    return rows


def table(text: str, heading: str) -> dict[str, list[str]]:
    """The first Markdown table after `heading`: first cell → all cells."""
    lines = text[text.index(heading):].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|---"))
    out = {}
    for line in lines[start + 1:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        out[cells[0]] = cells
    return out


def test_claim_tables_find_the_known_reversal_and_the_better_baseline():
    text = claim_tables(constructed_rows(), [4, 64])
    coupling = table(text, "#### (a)")
    k4 = coupling["4"]
    assert k4[1] == "9"  # 3 τ_p pairs × 3 τ_a pairs
    assert int(k4[4]) >= 1  # significant reversals
    assert "-1.20" in k4[6] and "τ_p 1.5→4, τ_a 1 vs 4" in k4[6]  # E_b − E_a = −0.6 − 0.6
    assert "grid flat" in coupling["64"][5]
    verdict = table(text, "| k | COPC best")
    assert verdict["4"][1].startswith("0.80") and verdict["4"][2].startswith("tis 0.90") and verdict["4"][3] == "no"
    assert verdict["4"][4] == "no"  # [0.79, 0.81] vs [0.89, 0.91]
    stability = table(text, "#### (c)")
    assert stability["vtrace"][2] == "3 (100%)" and stability["vtrace"][5] == "3" and stability["vtrace"][6] == "3/3"
    assert stability["copc"][2] == "0 (0%)"
    region = table(text, "#### High-performing")
    # best of the three at k = 4 is COPC's 0.8: 2 of its 9 cells reach 0.72, no ablation cell does
    assert region["4"][1] == "0.80" and region["4"][2] == "2/9 (22%)" and region["4"][3].startswith("0/3")
    # at k = 64 COPC's flat 0.5 is the best; its 9 cells are within 90 %, the ablations (0.40, 0.45) are not
    assert region["64"][2] == "9/9 (100%)" and region["64"][4].startswith("3/3")  # 0.45 ≥ 0.9 · 0.5
