"""The paper's claims as a section of the sweep report: pure functions of the runs frame.

Methods take roles by their bands in the sweep, never by name: a *two-channel* method has a grid of
≥ 2 τ_p × ≥ 2 τ_a values (COPC and each reading of it), a *single-channel* one varies one band (the
ablations), a *baseline* has no band. Then:
  (a) coupling: per two-channel method and k, the 2×2 interaction contrasts of its grid with 95 %
      Welch t intervals over seeds, significant sign reversals, the interaction share and its test against
      an additive grid plus seed noise, with Holm's correction over all the grids' tests;
  (b) per k, the best cell of every method, and each two-channel method's best vs the best baseline;
  (c) at the largest k, every method's collapse rate and whether its early warnings came first;
  plus the high-performing region: the share of each banded method's cells within 90 % of the best;
  (d) free of selection: each method's tuned score (bands chosen on the other seeds, leave-one-seed-out)
      and untuned one (mean over its cells), and paired differences: each two-channel method against the
      baselines (tuned among themselves the same way) and against each other two-channel method.
A run's score here is its final held-out accuracy (and in (d) its AUC too); collapse is counted separately.
"""

from __future__ import annotations

import math

import pandas as pd

from reports.analysis import (
    N_BOOT,
    additive_null,
    cell_stats,
    coupling,
    improvement_matrices,
    interaction_fraction,
    method_bands,
    paired_difference,
    selection_free_scores,
)
from reports.figures import tau
from reports.plan import holm


def roles(runs: pd.DataFrame) -> tuple[list[str], list[str], list[str]]:
    """The methods of these runs by role: two-channel (a τ_p × τ_a grid), one band, baselines (no band)."""
    two, single, baselines = [], [], []
    for m, g in runs.groupby("method", sort=True):
        tps = g["tau_policy"].nunique()
        tas = g["tau_advantage"].nunique()
        finite = g["tau_policy"].map(math.isfinite).any() or g["tau_advantage"].map(math.isfinite).any()
        (two if tps >= 2 and tas >= 2 else single if finite else baselines).append(m)
    return two, single, baselines


def has_claims(runs: pd.DataFrame) -> bool:
    """A sweep the claims apply to: a two-channel method and at least one other method."""
    two, single, baselines = roles(runs[runs["scored"]])
    return bool(two) and bool(single or baselines)


def _ci(row) -> str:
    if math.isnan(row["ci_low"]):
        return f"{row['mean']:.2f}"
    return f"{row['mean']:.2f} [{row['ci_low']:.2f}, {row['ci_high']:.2f}]"


def claim_tables(runs: pd.DataFrame, n_boot: int = N_BOOT) -> str:
    """The claims as Markdown tables; a run's score is its final accuracy (no collapse penalty)."""
    runs = runs[runs["scored"]].assign(objective=lambda f: f["final_accuracy"])
    lags = sorted(int(k) for k in runs["staleness"].unique())
    two, single, baselines = roles(runs)
    cells = cell_stats(runs)
    out = []
    nulls = []
    for m in two:
        grid = runs[runs["method"] == m]
        null = additive_null(grid, n_boot)
        out += _coupling_section(grid, cells, null, m, lags, n_boot)
        nulls.append(null)
    if nulls:
        out += _multiple_testing(pd.concat(nulls, ignore_index=True))
    out += _best_sections(runs, cells, lags, two, single, baselines)
    out += _selection_free_section(runs, lags, two, single, baselines)
    return "\n".join(out)


def _coupling_section(
    copc: pd.DataFrame, cells: pd.DataFrame, null: pd.DataFrame, method: str, lags: list[int], n_boot: int
) -> list[str]:
    out = []
    pairs = coupling(copc)
    share = interaction_fraction(copc, n_boot)
    out.append(f"#### (a) Coupling: does τ_p's effect depend on τ_a? ({method} grid)\n")
    out.append(
        "| k | 2×2 sub-grids | significant interaction | sign reversals | significant reversals | "
        "interaction share [95 % CI] | p, additive null (seed noise alone) | largest contrast [95 % CI] |"
    )
    out.append("|---|---|---|---|---|---|---|---|")
    for k in lags:
        p = pairs[pairs["staleness"] == k]
        s = share[share["staleness"] == k]
        if p.empty:
            out.append(f"| {k} | 0 | — | — | — | — | — | — |")
            continue
        top = p.loc[p["contrast"].abs().idxmax()]
        frac = (
            f"{s.iloc[0]['fraction']:.2f} [{s.iloc[0]['fraction_low']:.2f}, {s.iloc[0]['fraction_high']:.2f}]"
            if len(s) and not math.isnan(s.iloc[0]["fraction"])
            else "— (grid flat)"
        )
        n = null[null["staleness"] == k]
        p_null = f"{n.iloc[0]['p_value']:.3f} (null median {n.iloc[0]['null_median']:.2f})" if len(n) else "—"
        out.append(
            f"| {k} | {len(p)} | {int(p['significant_interaction'].sum())} | {int(p['reversal'].sum())} | "
            f"{int(p['significant_reversal'].sum())} | {frac} | {p_null} | {top['contrast']:+.2f} "
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


def _multiple_testing(null: pd.DataFrame) -> list[str]:
    """The additive-null tests of every grid are many: at the 5 % level over all of them (Holm's step-down, which
    rejects at least what Bonferroni does), a p below 0.05 alone is a candidate for fresh seeds, not a finding."""
    if null.empty:
        return []
    adjusted = holm(null["p_value"].tolist())
    below = [(r, a) for r, a in zip(null.itertuples(), adjusted) if a <= 0.05]
    found = ", ".join(f"{r.method} at k = {r.staleness} (p {r.p_value:.4f}, Holm {a:.4f})" for r, a in below)
    return [
        f"Multiple testing: the coupling tables above hold {len(null)} additive-null test(s), one per two-channel "
        f"grid and k; at the 5 % level over all of them (Holm: the i-th smallest p times {len(null)} − i + 1, made "
        f"non-decreasing) a grid needs an adjusted p ≤ 0.05. Below it: {found or 'none'}. A p below 0.05 alone is a "
        "candidate for fresh seeds, not a finding.\n"
    ]


def _best_sections(
    runs: pd.DataFrame, cells: pd.DataFrame, lags: list[int], two: list[str], single: list[str], baselines: list[str]
) -> list[str]:
    """(b) the best cell of every method per k, and each two-channel method's against the best baseline's; (c) every
    method's collapses at the largest k; the high-performing region of the banded methods."""
    methods = [*two, *single, *baselines]
    best = {
        (m, k): g.loc[g["mean"].idxmax()]
        for (m, k), g in cells.groupby(["method", "staleness"], sort=False)
        if m in methods and k in lags
    }
    return [
        *_best_cell_table(best, method_bands(runs), lags, methods),
        *_best_vs_best_baseline(best, lags, two, baselines),
        *_stability_table(runs, max(lags), methods),
        *_region_table(cells, lags, [*two, *single]),
    ]


def _best_cell_table(
    best: dict[tuple, pd.Series], has: dict[str, tuple[bool, bool]], lags: list[int], methods: list[str]
) -> list[str]:
    out = ["#### (b) Best cell per method and k (final accuracy, seed mean [95 % CI]; collapse rate)\n"]
    out.append("| method | " + " | ".join(f"k={k}" for k in lags) + " |")
    out.append("|---|" + "---|" * len(lags))
    for m in methods:
        line = []
        for k in lags:
            if (m, k) not in best:
                line.append("—")
                continue
            b = best[m, k]
            bands = ", ".join(
                f"{n} {tau(b[c])}"
                for n, c, h in (("τ_p", "tau_policy", has[m][0]), ("τ_a", "tau_advantage", has[m][1]))
                if h
            )
            line.append(f"{_ci(b)}; {b['collapse_rate']:.0%}" + (f" ({bands})" if bands else ""))
        out.append(f"| {m} | " + " | ".join(line) + " |")
    return out


def _best_vs_best_baseline(
    best: dict[tuple, pd.Series], lags: list[int], two: list[str], baselines: list[str]
) -> list[str]:
    out = [
        "\n| method | k | best cell | best baseline | ≥ baseline (means) | intervals overlap |",
        "|---|---|---|---|---|---|",
    ]
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
    return out


def _stability_table(runs: pd.DataFrame, k: int, methods: list[str]) -> list[str]:
    out = [
        f"\n#### (c) Stability at k = {k}: collapse rate over all runs of each method, and the early warnings\n",
        "| method | runs | collapsed | final accuracy (mean over runs) | peak | runs with an ESS-drop or "
        "grad-spike warning | collapsed runs warned before the collapse |",
        "|---|---|---|---|---|---|---|",
    ]
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
    return out


def _region_table(cells: pd.DataFrame, lags: list[int], banded: list[str]) -> list[str]:
    out = [
        "\n#### High-performing region: share of each banded method's cells within 90 % of the best banded cell "
        "at that k\n",
        "| k | best of these | " + " | ".join(banded) + " |",
        "|---|---|" + "---|" * len(banded),
    ]
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


def interval_text(value: float, low: float, high: float, fmt: str = ".2f") -> str:
    """`0.78 [0.60, 0.92]` in the format `fmt`; `—` where there is no value, the value alone where it has no
    interval (the claims tables, the report's aggregates, the bench's)."""
    if pd.isna(value):
        return "—"
    if pd.isna(low) or pd.isna(high):
        return f"{value:{fmt}}"
    return f"{value:{fmt}} [{low:{fmt}}, {high:{fmt}}]"


def improvement_text(improve: pd.DataFrame, fmt: str = ".3f") -> dict[int, pd.DataFrame]:
    """Per k, the probability of improvement (`improvement_table`'s rows) as a matrix of `interval_text`, a reading a
    row and a baseline a column."""
    return {
        k: pd.DataFrame(
            [[interval_text(p.at[m, b], low.at[m, b], high.at[m, b], fmt) for b in p.columns] for m in p.index],
            index=p.index,
            columns=p.columns,
        )
        for k, (p, low, high) in improvement_matrices(improve).items()
    }


CHOSEN_BASELINE = "baselines (chosen)"


class _SelectionFree:
    """Each family's tuned and untuned scores per seed (final accuracy and AUC: `selection_free_scores`), and the
    text of their means and paired differences with t intervals."""

    def __init__(self, runs: pd.DataFrame, families: dict[str, list[str]]):
        self.scores = {
            name: selection_free_scores(runs, families, column)
            .set_index(["family", "staleness", "kind", "seed"])
            .sort_index()
            for name, column in (("final", "final_accuracy"), ("AUC", "auc_accuracy"))
        }

    def series(self, name: str, family: str, k: int, kind: str) -> pd.Series:
        frame = self.scores[name]
        key = (family, k, kind)
        return frame.loc[key]["score"] if key in frame.index.droplevel("seed") else pd.Series(dtype=float)

    def chosen_cells(self, family: str, k: int) -> pd.Series:
        return self.scores["final"].loc[(family, k, "tuned")]["cell"]

    @staticmethod
    def diff(a: pd.Series, b: pd.Series, signed: bool = True) -> str:
        n, mean, low, high = paired_difference(a, b)
        return f"{interval_text(mean, low, high, '+.2f' if signed else '.2f')} ({n})" if n else "—"

    def mean_ci(self, values: pd.Series) -> str:  # a mean's interval: the paired difference from 0
        return self.diff(values, pd.Series(0.0, index=values.index), signed=False)


def _selection_free_section(
    runs: pd.DataFrame, lags: list[int], two: list[str], single: list[str], baselines: list[str]
) -> list[str]:
    """(d) tuned and untuned scores of every method (and of the baselines chosen among themselves the same way),
    each two-channel method against each baseline, and the two-channel methods against each other."""
    chosen = {CHOSEN_BASELINE: baselines} if len(baselines) > 1 else {}  # the baselines chosen among themselves
    families = {m: [m] for m in [*two, *single, *baselines]} | chosen
    rivals = [*baselines, *chosen]
    sel = _SelectionFree(runs, families)
    return [
        *_tuned_table(sel, families, lags, [*two, *single]),
        *_tuned_vs_baselines(sel, lags, two, rivals),
        *(_against_each_other(sel, lags, two) if len(two) > 1 else []),
    ]


def _tuned_table(sel: _SelectionFree, families: dict, lags: list[int], banded: list[str]) -> list[str]:
    out = [
        "\n#### (d) Free of selection: tuned (bands chosen on the other seeds) and untuned (mean over the cells)\n",
        "Per seed, *tuned* scores the cell with the best mean over the other seeds (leave-one-seed-out), so a "
        "grid's best-of-N is not favoured by selection over a one-cell baseline; *baselines (chosen)* is the "
        "baseline chosen the same way. Seed mean [95 % t CI] (seeds).\n",
        "| method | k | tuned final | tuned AUC | cell chosen per seed (final) | untuned final | untuned AUC |",
        "|---|---|---|---|---|---|---|",
    ]
    for family in families:
        for k in lags:
            tuned = sel.series("final", family, k, "tuned")
            if tuned.empty:
                continue
            chosen = "; ".join(
                f"{s}: {c.removeprefix(family).strip() or '='}" for s, c in sel.chosen_cells(family, k).items()
            )
            has_bands = family in banded
            untuned = [sel.mean_ci(sel.series(n, family, k, "untuned")) if has_bands else "=" for n in ("final", "AUC")]
            out.append(
                f"| {family} | {k} | {sel.mean_ci(tuned)} | "
                f"{sel.mean_ci(sel.series('AUC', family, k, 'tuned'))} | "
                f"{chosen if has_bands or family == CHOSEN_BASELINE else '='} | {untuned[0]} | {untuned[1]} |"
            )
    return out


def _tuned_vs_baselines(sel: _SelectionFree, lags: list[int], two: list[str], rivals: list[str]) -> list[str]:
    out = []
    for name in ("final", "AUC"):
        for k in lags:
            present = [b for b in rivals if not sel.series(name, b, k, "tuned").empty]
            if not present or all(sel.series(name, m, k, "tuned").empty for m in two):
                continue
            out += [
                f"\nTuned {name} of each two-channel method minus each baseline at k = {k}, paired by seed (a seed "
                "shares its warm start and problems across methods): difference [95 % t CI] (seeds).\n",
                "| method | " + " | ".join(present) + " |",
                "|---|" + "---|" * len(present),
            ]
            for m in two:
                mine = sel.series(name, m, k, "tuned")
                diffs = (sel.diff(mine, sel.series(name, b, k, "tuned")) for b in present)
                out.append(f"| {m} | " + " | ".join(diffs) + " |")
    return out


def _against_each_other(sel: _SelectionFree, lags: list[int], two: list[str]) -> list[str]:
    out = [
        "\nTwo-channel methods against each other, paired by seed: difference [95 % t CI] (seeds).\n",
        "| comparison | k | tuned final | tuned AUC | untuned final | untuned AUC |",
        "|---|---|---|---|---|---|",
    ]
    for i, a in enumerate(two):
        for b in two[i + 1 :]:
            for k in lags:
                cols = [
                    sel.diff(sel.series(name, a, k, kind), sel.series(name, b, k, kind))
                    for kind in ("tuned", "untuned")
                    for name in ("final", "AUC")
                ]
                if any(c != "—" for c in cols):
                    out.append(f"| {a} − {b} | {k} | " + " | ".join(cols) + " |")
    return out
