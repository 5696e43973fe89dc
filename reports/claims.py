"""The paper's claims as a section of the sweep report: pure functions of the runs frame.

Methods take roles by their bands in the sweep, never by name: a *two-channel* method has a grid of
≥ 2 τ_p × ≥ 2 τ_a values (COPC and each reading of it), a *single-channel* one varies one band (the
ablations), a *baseline* has no band. Then:
  (a) coupling: per two-channel method and k, the 2×2 interaction contrasts of its grid with 95 %
      bootstrap intervals over seeds, significant sign reversals, and the interaction share;
  (b) per k, the best cell of every method, and each two-channel method's best vs the best baseline;
  (c) at the largest k, every method's collapse rate and whether its early warnings came first;
  plus the high-performing region: the share of each banded method's cells within 90 % of the best.
A run's score here is its final held-out accuracy; collapse is counted separately.
"""

from __future__ import annotations

import math

import pandas as pd

from reports.analysis import N_BOOT, cell_stats, coupling, interaction_fraction


def _roles(runs: pd.DataFrame) -> tuple[list[str], list[str], list[str]]:
    two, single, baselines = [], [], []
    for m, g in runs.groupby("method", sort=True):
        tps = g["tau_policy"].nunique()
        tas = g["tau_advantage"].nunique()
        finite = g["tau_policy"].map(math.isfinite).any() or g["tau_advantage"].map(math.isfinite).any()
        (two if tps >= 2 and tas >= 2 else single if finite else baselines).append(m)
    return two, single, baselines


def has_claims(runs: pd.DataFrame) -> bool:
    """A sweep the claims apply to: a two-channel method and at least one other method."""
    two, single, baselines = _roles(runs[runs["scored"]])
    return bool(two) and bool(single or baselines)


def _ci(row) -> str:
    if math.isnan(row["ci_low"]):
        return f"{row['mean']:.2f}"
    return f"{row['mean']:.2f} [{row['ci_low']:.2f}, {row['ci_high']:.2f}]"


def _band(v: float) -> str:
    return "—" if math.isinf(v) else f"{v:g}"


def claim_tables(runs: pd.DataFrame, n_boot: int = N_BOOT) -> str:
    """The claims as Markdown tables; a run's score is its final accuracy (no collapse penalty)."""
    runs = runs[runs["scored"]].assign(objective=lambda f: f["final_accuracy"])
    lags = sorted(int(k) for k in runs["staleness"].unique())
    two, single, baselines = _roles(runs)
    cells = cell_stats(runs, n_boot)
    out = []
    for m in two:
        out += _coupling_section(runs[runs["method"] == m], cells, m, lags, n_boot)
    out += _best_sections(runs, cells, lags, two, single, baselines)
    return "\n".join(out)


def _coupling_section(copc: pd.DataFrame, cells: pd.DataFrame, method: str, lags: list[int], n_boot: int) -> list[str]:
    out = []
    pairs = coupling(copc, n_boot)
    share = interaction_fraction(copc, n_boot)
    out.append(f"#### (a) Coupling: does τ_p's effect depend on τ_a? ({method} grid)\n")
    out.append(
        "| k | 2×2 sub-grids | significant interaction | sign reversals | significant reversals | "
        "interaction share [95 % CI] | largest |contrast| [95 % CI] |"
    )
    out.append("|---|---|---|---|---|---|---|")
    for k in lags:
        p = pairs[pairs["staleness"] == k]
        s = share[share["staleness"] == k]
        if p.empty:
            out.append(f"| {k} | 0 | — | — | — | — | — |")
            continue
        top = p.loc[p["contrast"].abs().idxmax()]
        frac = (
            f"{s.iloc[0]['fraction']:.2f} [{s.iloc[0]['fraction_low']:.2f}, {s.iloc[0]['fraction_high']:.2f}]"
            if len(s) and not math.isnan(s.iloc[0]["fraction"])
            else "— (grid flat)"
        )
        out.append(
            f"| {k} | {len(p)} | {int(p['significant_interaction'].sum())} | {int(p['reversal'].sum())} | "
            f"{int(p['significant_reversal'].sum())} | {frac} | {top['contrast']:+.2f} "
            f"[{top['contrast_low']:+.2f}, {top['contrast_high']:+.2f}] (τ_p {top['tau_policy_from']:g}→"
            f"{top['tau_policy_to']:g}, τ_a {top['tau_advantage_a']:g} vs {top['tau_advantage_b']:g}) |"
        )
    out.append(f"\n{method} final accuracy per cell (seed mean [95 % CI]):\n")
    taus_a = sorted(copc["tau_advantage"].unique())
    for k in lags:
        g = cells[(cells["method"] == method) & (cells["staleness"] == k)]
        if g.empty:
            continue
        out.append(f"k = {k}\n\n| τ_p \\ τ_a | " + " | ".join(f"{t:g}" for t in taus_a) + " |")
        out.append("|---|" + "---|" * len(taus_a))
        for tp in sorted(g["tau_policy"].unique()):
            line = [
                _ci(g[(g["tau_policy"] == tp) & (g["tau_advantage"] == ta)].iloc[0])
                if len(g[(g["tau_policy"] == tp) & (g["tau_advantage"] == ta)])
                else "—"
                for ta in taus_a
            ]
            out.append(f"| {tp:g} | " + " | ".join(line) + " |")
        out.append("")
    return out


def _best_sections(
    runs: pd.DataFrame, cells: pd.DataFrame, lags: list[int], two: list[str], single: list[str], baselines: list[str]
) -> list[str]:
    out = ["#### (b) Best cell per method and k (final accuracy, seed mean [95 % CI]; collapse rate)\n"]
    methods = [*two, *single, *baselines]
    out.append("| method | " + " | ".join(f"k={k}" for k in lags) + " |")
    out.append("|---|" + "---|" * len(lags))
    best: dict[tuple, dict] = {}
    for m in methods:
        line = []
        for k in lags:
            g = cells[(cells["method"] == m) & (cells["staleness"] == k)]
            if g.empty:
                line.append("—")
                continue
            b = g.loc[g["mean"].idxmax()]
            best[m, k] = b
            bands = ", ".join(
                f"{n} {_band(b[c])}"
                for n, c in (("τ_p", "tau_policy"), ("τ_a", "tau_advantage"))
                if not math.isinf(b[c])
            )
            line.append(f"{_ci(b)}; {b['collapse_rate']:.0%}" + (f" ({bands})" if bands else ""))
        out.append(f"| {m} | " + " | ".join(line) + " |")
    out.append("\n| method | k | best cell | best baseline | ≥ baseline (means) | intervals overlap |")
    out.append("|---|---|---|---|---|---|")
    for copc in two:
        for k in lags:
            rivals = [(m, best[m, k]) for m in baselines if (m, k) in best]
            if (copc, k) not in best or not rivals:
                continue
            c = best[copc, k]
            m, r = max(rivals, key=lambda mr: mr[1]["mean"])
            overlap = not (c["ci_low"] > r["ci_high"] or r["ci_low"] > c["ci_high"])
            out.append(
                f"| {copc} | {k} | {_ci(c)} | {m} {_ci(r)} | {'yes' if c['mean'] >= r['mean'] else 'no'} | "
                f"{'yes' if overlap else 'no'} |"
            )
    # (c) stability at the largest k
    k = max(lags)
    out.append(f"\n#### (c) Stability at k = {k}: collapse rate over all runs of each method, and the early warnings\n")
    out.append(
        "| method | runs | collapsed | final accuracy (mean over runs) | peak | runs with an ESS-drop or "
        "grad-spike warning | collapsed runs warned before the collapse |"
    )
    out.append("|---|---|---|---|---|---|---|")
    for m in methods:
        g = runs[(runs["method"] == m) & (runs["staleness"] == k)]
        if len(g):
            warned = g[(g["ess_drop_count"] + g["grad_spike_count"]) > 0]
            collapsed = g[g["collapsed"] & g["collapse_step"].notna()]
            early = collapsed[collapsed["first_warning_step"] < collapsed["collapse_step"]]
            out.append(
                f"| {m} | {len(g)} | {int(g['collapsed'].sum())} ({g['collapsed'].mean():.0%}) | "
                f"{g['final_accuracy'].mean():.2f} | {g['peak_accuracy'].mean():.2f} | {len(warned)} | "
                f"{len(early)}/{len(collapsed)} |"
            )
    # region
    out.append(
        "\n#### High-performing region: share of each banded method's cells within 90 % of the best banded cell "
        "at that k\n"
    )
    banded = [*two, *single]
    out.append("| k | best of these | " + " | ".join(banded) + " |")
    out.append("|---|---|" + "---|" * len(banded))
    for k in lags:
        g = cells[(cells["method"].isin(banded)) & (cells["staleness"] == k)]
        if g.empty:
            continue
        top = float(g["mean"].max())
        line = []
        for m in banded:
            mine = g[g["method"] == m]
            n = int((mine["mean"] >= 0.9 * top - 1e-12).sum())
            line.append(f"{n}/{len(mine)} ({n / len(mine):.0%})" if len(mine) else "—")
        out.append(f"| {k} | {top:.2f} | " + " | ".join(line) + " |")
    return out
