"""Coupling and stability analysis over the runs frame (pure functions of frames, no I/O).

Cells are (method, staleness k, τ_p, τ_a); a cell's value is the mean objective over its seeds.
Intervals of a mean over seeds are Student's t (scipy): at the study's 5 seeds a bootstrap's percentile or BCa
interval of the mean covers the truth 83-85 % of the time for a nominal 95 %, the t interval 93-95 % (measured on
synthetic cells shaped like the study's runs: `python -m bench.coverage`, docs/BENCHMARKS.md). Effects and contrasts
of independent cells (runs are independent training processes) are Welch–Satterthwaite t intervals; the
interaction share, not linear in the cells, keeps a percentile bootstrap, each cell resampled by a random stream of
its own (adding a cell moves no other interval). A cell where runs collapse mixes a point mass into its mean: no
interval of that mean covers at 5 seeds (45-67 % in the benchmark); its collapse rate carries an exact
(Clopper–Pearson) interval, which covers. Cells with fewer than two seeds get no interval (NaN).

Coupling. For τ_p levels i < j and τ_a levels a < b, the effect of moving τ_p from i to j is
E_a = Y(j, a) − Y(i, a) at τ_a = a and E_b at τ_a = b; the interaction contrast is E_b − E_a
(zero when the two parameters act additively). A *sign reversal* is E_a · E_b < 0: τ_p's effect
changes direction with τ_a; it is *significant* when both intervals exclude zero on opposite sides.
The interaction fraction of a full grid is ‖R‖² / ‖Y − Ȳ‖² with R the two-way interaction residual
R_ij = Y_ij − Ȳ_i· − Ȳ_·j + Ȳ: the share of the between-cell variation that no additive model explains.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from typing import NamedTuple

import numpy as np
import pandas as pd
from scipy import stats

from reports import schema

N_BOOT = 2000
LEVEL = 0.95
_CELL = ["method", "staleness", "tau_policy", "tau_advantage"]


def _interval(replicates: np.ndarray | None, level: float) -> tuple[float, float]:
    if replicates is None:
        return math.nan, math.nan
    tail = (1.0 - level) / 2.0 * 100.0
    low, high = np.percentile(replicates, [tail, 100.0 - tail])
    return float(low), float(high)


def _replicates(values: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray | None:
    """Bootstrap replicates of the mean, [n_boot]; None with fewer than two values."""
    if len(values) < 2:
        return None
    return values[rng.integers(0, len(values), size=(n_boot, len(values)))].mean(axis=1)


def _groups(runs: pd.DataFrame) -> dict[tuple, np.ndarray]:
    scored = runs[runs["scored"]]
    return {key: g["objective"].to_numpy(float) for key, g in scored.groupby(_CELL, sort=True, dropna=False)}


def _stream(key: tuple, seed: int = 0) -> np.random.Generator:
    """A random stream of a row's own (its key's hash, and `seed`): an interval does not move when rows are added."""
    return np.random.default_rng([seed, *hashlib.sha256(repr(key).encode()).digest()[:8]])


def _all_replicates(groups: dict[tuple, np.ndarray], n_boot: int, seed: int) -> dict[tuple, np.ndarray | None]:
    return {key: _replicates(values, n_boot, _stream(key, seed)) for key, values in sorted(groups.items())}


def mean_interval(
    values: np.ndarray, level: float = LEVEL, bounds: tuple[float, float] = (-math.inf, math.inf)
) -> tuple[float, float, float]:
    """(mean, low, high): the mean of the finite `values` and its Student t interval (scipy); no interval under two
    values, the point itself when every value is equal. `bounds`: the range the mean cannot leave (an accuracy's,
    say); the interval is cut to it, which loses no coverage (a mean inside the range is in the cut interval exactly
    when it is in the whole one) — a t interval over a collapse's point mass otherwise reaches past 1."""
    values = np.asarray(values, float)
    values = values[np.isfinite(values)]
    if len(values) == 0:
        return math.nan, math.nan, math.nan
    mean = float(values.mean())
    if len(values) < 2:
        return mean, math.nan, math.nan
    if np.ptp(values) <= 1e-12 * max(1.0, abs(mean)):  # equal values (up to rounding): the point itself
        return mean, mean, mean
    ci = stats.ttest_1samp(values, 0.0).confidence_interval(level)
    return mean, max(float(ci.low), bounds[0]), min(float(ci.high), bounds[1])


def contrast_interval(samples: list[np.ndarray], weights: list[float], level: float = LEVEL) -> tuple[float, float]:
    """Welch–Satterthwaite t interval of Σ w·mean over independent samples (the seeds of distinct cells): variance
    Σ w²s²/n, degrees of freedom (Σ v)² / Σ v²/(n − 1) with v = w²s²/n. Two samples with weights (1, −1) give scipy's
    `ttest_ind(equal_var=False).confidence_interval()` (a test holds them equal). No interval under two finite values
    a sample; the point itself when every sample is constant. Cells of one grid share each seed's warm start and
    problems: a seed effect common to every cell cancels in a contrast (its weights sum to 0), so this interval, which
    treats the cells as independent, is then wider than it need be."""
    samples = [np.asarray(s, float)[np.isfinite(s)] for s in samples]
    if any(len(s) < 2 for s in samples):
        return math.nan, math.nan
    estimate = float(sum(w * s.mean() for w, s in zip(weights, samples)))
    v = np.array([w * w * s.var(ddof=1) / len(s) for w, s in zip(weights, samples)])
    if v.sum() == 0:
        return estimate, estimate
    df = v.sum() ** 2 / sum(vi * vi / (len(s) - 1) for vi, s in zip(v, samples))
    half = float(stats.t.ppf(0.5 + level / 2, df) * math.sqrt(v.sum()))
    return estimate - half, estimate + half


def iqm(values: np.ndarray, axis: int | None = None) -> np.ndarray:
    """The interquartile mean (rliable's `aggregate_iqm`: the mean of the middle half, scipy's 25 % trimmed mean)."""
    return stats.trim_mean(values, 0.25, axis=axis)


def improvement_probability(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    """P(X > Y) + ½ P(X = Y) over every pair of a run of X and a run of Y (rliable's `probability_of_improvement` on
    one task: the Mann–Whitney U of X over Y divided by the pairs)."""
    x, y = np.moveaxis(np.asarray(x, float), axis, -1), np.moveaxis(np.asarray(y, float), axis, -1)
    diff = x[..., :, None] - y[..., None, :]
    return ((diff > 0) + 0.5 * (diff == 0)).mean(axis=(-2, -1))


def _bootstrap(samples: tuple, statistic, key: tuple, level: float) -> tuple[float, float]:
    """A percentile bootstrap interval of `statistic` over independent `samples` (scipy), its stream the row's own;
    none under two values a sample, the point itself when every resample gives one value."""
    if any(len(s) < 2 for s in samples):
        return math.nan, math.nan
    ci = stats.bootstrap(
        samples, statistic, confidence_level=level, n_resamples=N_BOOT, method="percentile", random_state=_stream(key)
    )
    return float(ci.confidence_interval.low), float(ci.confidence_interval.high)


class MethodRuns(NamedTuple):
    finals: np.ndarray  # final held-out accuracy of each run, in seed order
    n_cells: int  # 1, or the cells of the grid its runs were picked from
    run_ids: list[str]  # the runs


def method_label(method: str, n_cells: int) -> str:
    """How the aggregates name a method: `copc[behavior] (tuned over 12 cells)` where its runs were picked."""
    return method if n_cells == 1 else f"{method} (tuned over {n_cells} cells)"


def method_finals(runs: pd.DataFrame) -> dict[tuple[str, int], MethodRuns]:
    """Per (method, k), the runs the aggregates compare methods by. A method at one cell: its runs. A method swept over
    a grid: on each seed, its runs at the cell with the best mean over the other seeds (leave-one-seed-out,
    `selection_free_scores` on final accuracy), so a grid's best-of-N is not favoured by selection over a one-cell
    baseline; a seed needs its cell run on another seed too, so a grid run on one seed has none."""
    scored = runs[runs["scored"] & runs["final_accuracy"].notna()]
    out = {}
    for (method, k), g in scored.groupby(["method", "staleness"], sort=True):
        g = with_cells(g)
        n_cells = g["cell"].nunique()
        if n_cells > 1:
            seed_scores = selection_free_scores(g, {method: [method]}, "final_accuracy")
            g = g.merge(seed_scores.loc[seed_scores["kind"] == "tuned", ["seed", "cell"]], on=["seed", "cell"])
        g = g.sort_values(["seed", "run_id"])
        if not g.empty:
            out[(method, int(k))] = MethodRuns(g["final_accuracy"].to_numpy(float), n_cells, g["run_id"].tolist())
    return out


def aggregates(picks: dict[tuple[str, int], MethodRuns], level: float = LEVEL) -> pd.DataFrame:
    """Per method and k (`method_finals`: a grid by its selection-free picks): the IQM of final held-out accuracy with a
    percentile bootstrap interval (as rliable gives it). Coverage at 5 seeds: `python -m bench.coverage`."""
    rows = []
    for (method, k), (x, n_cells, _) in picks.items():
        low, high = _bootstrap((x,), lambda s, axis=-1: iqm(s, axis=axis), ("iqm", method, k), level)
        rows.append(
            {
                "method": method,
                "staleness": k,
                "n_cells": n_cells,
                "n": len(x),
                "iqm": float(iqm(x)),
                "low": low,
                "high": high,
            }
        )
    return pd.DataFrame(rows, columns=["method", "staleness", "n_cells", "n", "iqm", "low", "high"])


def improvement_table(
    picks: dict[tuple[str, int], MethodRuns], readings: list[str], baselines: list[str], level: float = LEVEL
) -> pd.DataFrame:
    """Per k, each reading against each baseline (`method_finals`): P(a run of the reading ends above a run of the
    baseline) with its percentile bootstrap interval (both samples resampled)."""
    rows = []
    for (method, k), (x, _, _) in picks.items():
        if method not in readings:
            continue
        for base in [b for b in baselines if (b, k) in picks]:
            y = picks[(base, k)].finals
            low, high = _bootstrap((x, y), improvement_probability, ("improve", method, base, k), level)
            p = float(improvement_probability(x, y))
            rows.append({"method": method, "baseline": base, "staleness": k, "p": p, "low": low, "high": high})
    return pd.DataFrame(rows, columns=["method", "baseline", "staleness", "p", "low", "high"])


def improvement_matrices(improve: pd.DataFrame) -> dict[int, tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]]:
    """Per k, `improvement_table`'s rows as three matrices — P, its interval's low and high ends — a reading a row and a
    baseline a column (the report's figure and tables, and the bench's, read them so)."""
    return {
        int(k): tuple(at.pivot(index="method", columns="baseline", values=v) for v in ("p", "low", "high"))
        for k, at in improve.groupby("staleness", sort=True)
    }


def readings_and_baselines(runs: pd.DataFrame) -> tuple[list[str], list[str]]:
    """The methods the probability of improvement compares: two-channel readings (both bands, at one cell or a grid)
    and baselines (no band); a one-band method is neither."""
    bands = method_bands(runs)
    return [m for m, has in bands.items() if all(has)], [m for m, has in bands.items() if not any(has)]


def collapse_interval(collapsed: int, n: int, level: float = LEVEL) -> tuple[float, float]:
    """The exact (Clopper–Pearson) interval of a collapse rate, `collapsed` of `n` runs (scipy's binomtest)."""
    if n == 0:
        return math.nan, math.nan
    ci = stats.binomtest(collapsed, n).proportion_ci(level, method="exact")
    return float(ci.low), float(ci.high)


def method_bands(runs: pd.DataFrame) -> dict[str, tuple[bool, bool]]:
    """Per method, whether it has a τ_p and a τ_a band (the runs' columns read ∞ for a band a method lacks,
    and for a band of ∞ it runs at: labels tell them apart by this)."""
    return {
        m: (bool(g["has_tau_policy"].any()), bool(g["has_tau_advantage"].any()))
        for m, g in runs.groupby("method", sort=True)
    }


def cell_stats(runs: pd.DataFrame, level: float = LEVEL) -> pd.DataFrame:
    scored = runs[runs["scored"]]
    if scored.empty:
        return schema.empty(schema.CELLS)
    groups = _groups(runs)
    rows = []
    for key, g in scored.groupby(_CELL, sort=True, dropna=False):
        values = groups[key]
        mean, low, high = mean_interval(values, level)
        collapse_low, collapse_high = collapse_interval(int(g["collapsed"].sum()), len(g), level)
        rows.append(
            dict(zip(_CELL, key))
            | {
                "n": len(values),
                "mean": mean,
                "sd": float(values.std(ddof=1)) if len(values) > 1 else math.nan,
                "ci_low": low,
                "ci_high": high,
                "collapse_rate": float(g["collapsed"].mean()),
                "collapse_low": collapse_low,
                "collapse_high": collapse_high,
                "final_mean": float(g["final_accuracy"].mean()),
                "peak_mean": float(g["peak_accuracy"].mean()),
            }
        )
    frame = pd.DataFrame(rows).astype({"staleness": "int64", "n": "int64"})
    return schema.validate(frame, schema.CELLS, "cells")


def _grids(groups: dict[tuple, np.ndarray]):
    """Per (method, k): the sorted τ_p and τ_a levels present."""
    by: dict[tuple, list[tuple[float, float]]] = {}
    for method, k, tp, ta in groups:
        by.setdefault((method, k), []).append((tp, ta))
    for (method, k), cells in sorted(by.items()):
        yield method, k, sorted({c[0] for c in cells}), sorted({c[1] for c in cells})


def coupling(runs: pd.DataFrame, level: float = LEVEL) -> pd.DataFrame:
    """Every 2×2 sub-grid (τ_p i < j) × (τ_a a < b) with all four cells run: effects, contrast, reversal; Welch t
    intervals (`contrast_interval`)."""
    groups = _groups(runs)
    rows = []
    for method, k, tps, tas in _grids(groups):
        for (i, j), (a, b) in itertools.product(itertools.combinations(tps, 2), itertools.combinations(tas, 2)):
            keys = {(p, q): (method, k, p, q) for p in (i, j) for q in (a, b)}
            if not all(key in groups for key in keys.values()):
                continue
            y = {c: groups[key] for c, key in keys.items()}
            effect_a, effect_b = y[j, a].mean() - y[i, a].mean(), y[j, b].mean() - y[i, b].mean()
            a_low, a_high = contrast_interval([y[j, a], y[i, a]], [1, -1], level)
            b_low, b_high = contrast_interval([y[j, b], y[i, b]], [1, -1], level)
            c_low, c_high = contrast_interval([y[j, b], y[i, b], y[j, a], y[i, a]], [1, -1, -1, 1], level)
            rows.append(
                {
                    "method": method,
                    "staleness": k,
                    "tau_policy_from": i,
                    "tau_policy_to": j,
                    "tau_advantage_a": a,
                    "tau_advantage_b": b,
                    "n_min": min(len(groups[key]) for key in keys.values()),
                    "effect_a": float(effect_a),
                    "effect_a_low": a_low,
                    "effect_a_high": a_high,
                    "effect_b": float(effect_b),
                    "effect_b_low": b_low,
                    "effect_b_high": b_high,
                    "contrast": float(effect_b - effect_a),
                    "contrast_low": c_low,
                    "contrast_high": c_high,
                    "reversal": bool(effect_a * effect_b < 0),
                    "significant_reversal": bool((a_low > 0 and b_high < 0) or (a_high < 0 and b_low > 0)),
                    "significant_interaction": bool(c_low > 0 or c_high < 0),
                }
            )
    if not rows:
        return schema.empty(schema.COUPLING)
    frame = pd.DataFrame(rows).astype({"staleness": "int64", "n_min": "int64"})
    return schema.validate(frame, schema.COUPLING, "coupling")


def _fraction(table: np.ndarray) -> np.ndarray:
    """Interaction share of between-cell variation; table [..., n_tp, n_ta] → [...] (NaN if all equal)."""
    grand = table.mean(axis=(-2, -1), keepdims=True)
    resid = table - table.mean(axis=-1, keepdims=True) - table.mean(axis=-2, keepdims=True) + grand
    total = np.square(table - grand).sum(axis=(-2, -1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, np.square(resid).sum(axis=(-2, -1)) / np.where(total > 0, total, 1.0), np.nan)


def interaction_fraction(runs: pd.DataFrame, n_boot: int = N_BOOT, seed: int = 0, level: float = LEVEL) -> pd.DataFrame:
    """Per (method, k) with a complete grid of ≥ 2 × 2 levels."""
    groups = _groups(runs)
    reps = _all_replicates(groups, n_boot, seed)
    rows = []
    for method, k, tps, tas in _grids(groups):
        keys = [[(method, k, tp, ta) for ta in tas] for tp in tps]
        if len(tps) < 2 or len(tas) < 2 or not all(key in groups for row in keys for key in row):
            continue
        table = np.array([[groups[key].mean() for key in row] for row in keys])
        have = all(reps[key] is not None for row in keys for key in row)
        boot = np.stack([np.stack([reps[key] for key in row], -1) for row in keys], -2) if have else None
        # a replicate whose cells all came out equal (accuracies are discrete) has no share (0/0): the interval
        # is over the replicates that have one, and undefined only when none has
        shares = _fraction(boot) if have else np.array([])
        shares = shares[~np.isnan(shares)]
        low, high = _interval(shares if len(shares) else None, level)
        rows.append(
            {
                "method": method,
                "staleness": k,
                "fraction": float(_fraction(table)),
                "fraction_low": low,
                "fraction_high": high,
                "n_min": min(len(groups[key]) for row in keys for key in row),
            }
        )
    if not rows:
        return schema.empty(schema.INTERACTION)
    frame = pd.DataFrame(rows).astype({"staleness": "int64", "n_min": "int64"})
    return schema.validate(frame, schema.INTERACTION, "interaction")


def best_with_ties(scored: list[tuple[str, float]], tol: float = 1e-9) -> str:
    """'0.900 name', or '0.900 (2 cells tie: a, b)': the best of some (name, seed-mean) cells, every tie named."""
    top = max(value for _, value in scored)
    names = [name for name, value in scored if abs(value - top) < tol]
    return f"{top:.3f} " + (names[0] if len(names) == 1 else f"({len(names)} cells tie: {', '.join(names)})")


def high_performing_region(cells: pd.DataFrame, within: float = 0.9) -> pd.DataFrame:
    """Fraction of a method's cells at one k whose mean is within `within` of the best:
    mean ≥ best − (1 − within)·|best| (i.e. ≥ 90 % of a positive best)."""
    rows = []
    for (method, k), g in cells.groupby(["method", "staleness"], sort=True):
        best_row = g.loc[g["mean"].idxmax()]
        best = float(best_row["mean"])
        n_within = int((g["mean"] >= best - (1.0 - within) * abs(best) - 1e-12).sum())
        rows.append(
            {
                "method": method,
                "staleness": k,
                "n_cells": len(g),
                "n_within": n_within,
                "fraction": n_within / len(g),
                "best": best,
                "best_tau_policy": float(best_row["tau_policy"]),
                "best_tau_advantage": float(best_row["tau_advantage"]),
            }
        )
    if not rows:
        return schema.empty(schema.REGION)
    frame = pd.DataFrame(rows).astype({"staleness": "int64", "n_cells": "int64", "n_within": "int64"})
    return schema.validate(frame, schema.REGION, "region")


def method_comparison(runs: pd.DataFrame, cells: pd.DataFrame) -> pd.DataFrame:
    """Per (method, k): all scored runs, and the method's best cell (highest mean objective)."""
    rows = []
    scored = runs[runs["scored"]]
    for (method, k), g in scored.groupby(["method", "staleness"], sort=True):
        mine = cells[(cells["method"] == method) & (cells["staleness"] == k)]
        best = mine.loc[mine["mean"].idxmax()]
        rows.append(
            {
                "method": method,
                "staleness": k,
                "n_runs": len(g),
                "collapse_rate": float(g["collapsed"].mean()),
                "final_mean": float(g["final_accuracy"].mean()),
                "peak_mean": float(g["peak_accuracy"].mean()),
                "best_tau_policy": float(best["tau_policy"]),
                "best_tau_advantage": float(best["tau_advantage"]),
                "best_objective": float(best["mean"]),
                "best_final_mean": float(best["final_mean"]),
                "best_peak_mean": float(best["peak_mean"]),
                "best_collapse_rate": float(best["collapse_rate"]),
            }
        )
    if not rows:
        return schema.empty(schema.METHODS)
    frame = pd.DataFrame(rows).astype({"staleness": "int64", "n_runs": "int64"})
    return schema.validate(frame, schema.METHODS, "methods")


def step_times(runs: pd.DataFrame, baseline: str = "async_ppo") -> pd.DataFrame:
    """Mean step-time breakdown per (method, k, runtime); speed-up = step time at k = 0 / step time
    (same method and runtime); learner time relative to `baseline` at the same k and runtime."""
    scored = runs[runs["scored"]]
    means = (
        scored.groupby(["method", "staleness", "runtime"], sort=True)
        .agg(
            n_runs=("run_id", "size"),
            rollout_s=("mean_rollout_s", "mean"),
            train_s=("mean_train_s", "mean"),
            step_s=("mean_step_s", "mean"),
            rollout_s_sd=("mean_rollout_s", "std"),
            train_s_sd=("mean_train_s", "std"),
            step_s_sd=("mean_step_s", "std"),
        )
        .reset_index()
    )
    if means.empty:
        return schema.empty(schema.STEP_TIMES)
    sync = {(r.method, r.runtime): r.step_s for r in means.itertuples() if r.staleness == 0}
    base = {(r.staleness, r.runtime): r.train_s for r in means.itertuples() if r.method == baseline}
    means["speedup_vs_sync"] = [sync.get((r.method, r.runtime), math.nan) / r.step_s for r in means.itertuples()]
    means["learner_vs_baseline"] = [
        r.train_s / base.get((r.staleness, r.runtime), math.nan) for r in means.itertuples()
    ]
    means = means.astype({"staleness": "int64", "n_runs": "int64"})
    return schema.validate(means, schema.STEP_TIMES, "step_times")


# ---------------------------------------------------------------- late in training


def _time_to_collapse(runs: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per run: the step it collapsed at (the event), or the step it ended at without one (right-censored)."""
    ended = runs["steps"].to_numpy(float)
    step = np.where(runs["collapsed"] & runs["collapse_step"].notna(), runs["collapse_step"], ended)
    return step.astype(float), ~runs["collapsed"].to_numpy(bool)


def survival(runs: pd.DataFrame, level: float = LEVEL) -> pd.DataFrame:
    """Kaplan–Meier estimate, per (method, k), of the share of scored runs not yet collapsed at each learner step
    (scipy.stats.ecdf over right-censored times: a run that did not collapse is censored where it ended), with its
    pointwise exact interval (`_survival_interval`: a seed's runs are not taken as independent). Each curve
    starts at step 0 with every run and ends at its longest run."""
    scored = runs[runs["scored"] & (runs["steps"] > 0)]
    rows = []
    for (method, k), g in scored.groupby(["method", "staleness"], sort=True):
        times, censored = _time_to_collapse(g)
        seeds = g["seed"].to_numpy()
        rows.append(dict(method=method, staleness=k, step=0, surviving=1.0, low=1.0, high=1.0, at_risk=len(g)))
        if (~censored).any():
            sf = stats.ecdf(stats.CensoredData.right_censored(times, censored)).sf
            for step, value in zip(sf.quantiles, sf.probabilities):
                if (times[~censored] == step).any():  # a step where a run collapsed (censoring steps change nothing)
                    low, high = _survival_interval(times, censored, seeds, step, value, level)
                    rows.append(
                        dict(
                            method=method,
                            staleness=k,
                            step=int(step),
                            surviving=float(value),
                            low=low,
                            high=high,
                            at_risk=int((times >= step).sum()),
                        )
                    )
        last = rows[-1]
        end = int(times.max())
        if last["step"] < end:
            rows.append(last | {"step": end, "at_risk": int((times >= end).sum())})
        if censored.all():  # no collapse: the interval at the end is the runs' (at step 0 nothing has happened yet)
            rows[-1]["low"], rows[-1]["high"] = _survival_interval(times, censored, seeds, end, 1.0, level)
    if not rows:
        return schema.empty(schema.SURVIVAL)
    frame = pd.DataFrame(rows).astype({"staleness": "int64", "step": "int64", "at_risk": "int64"})
    return schema.validate(frame, schema.SURVIVAL, "survival")


def _survival_interval(
    times: np.ndarray, censored: np.ndarray, seeds: np.ndarray, step: float, surviving: float, level: float
) -> tuple[float, float]:
    """An exact-style interval of a Kaplan–Meier value S at `step`: Clopper–Pearson on its effective number of runs
    (`_effective_runs`) with S·n of them standing (fractional counts: the beta quantiles). Without censoring and with
    one run a seed, n is the runs and this is the binomial exact interval. Greenwood's effective n serves both limits
    (Dorey & Korn 1987 give it for the upper limit and Peto's for the lower). The asymptotic log-log interval the
    report drew covered 62 % at 5 runs (no collapse read [1, 1]; `python -m bench.coverage --survival-only`)."""
    n = _effective_runs(times, censored, seeds, step, surviving)
    alive, tail = surviving * n, (1.0 - level) / 2
    low = float(stats.beta.ppf(tail, alive, n - alive + 1)) if alive > 0 else 0.0
    high = float(stats.beta.ppf(1.0 - tail, alive + 1, n - alive)) if alive < n else 1.0
    return low, high


def _effective_runs(times: np.ndarray, censored: np.ndarray, seeds: np.ndarray, step: float, surviving: float) -> float:
    """S (1 − S) / Var(S), Var(S) Greenwood's S² Σ d / (n (n − d)) over the collapse steps up to `step` times the
    design effect of a seed's runs (`_design_effect`). Where Var(S) is 0: before any collapse (S = 1) the runs at risk
    over the most runs a seed has (each seed's runs as one); once every run collapsed (S = 0) the n of the step before
    (so the band narrows, never widens, at the last collapse), or, all at one step, as before any collapse."""
    events = np.unique(times[~censored & (times <= step)])
    if surviving <= 0.0 and len(events) > 1:
        before = events[:-1]
        at_risk, died = _risk_sets(times, censored, before)
        return _effective_runs(times, censored, seeds, before[-1], float(np.prod(1.0 - died / at_risk)))
    if not 0.0 < surviving < 1.0:
        return max(float((times >= step).sum()) / int(pd.Series(seeds).value_counts().max()), 1.0)
    at_risk, died = _risk_sets(times, censored, events)
    greenwood = float(np.sum(died / (at_risk * (at_risk - died))))
    return (1.0 - surviving) / (surviving * greenwood * _design_effect(times, censored, seeds, events, at_risk, died))


def _risk_sets(times: np.ndarray, censored: np.ndarray, events: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """At each collapse step: the runs at risk (not ended before it) and the runs that collapsed at it."""
    at_risk = np.array([(times >= t).sum() for t in events], float)
    died = np.array([((times == t) & ~censored).sum() for t in events], float)
    return at_risk, died


def _design_effect(
    times: np.ndarray,
    censored: np.ndarray,
    seeds: np.ndarray,
    events: np.ndarray,
    at_risk: np.ndarray,
    died: np.ndarray,
) -> float:
    """How much a seed's runs moving together widens Greenwood's variance: the seed-clustered (sandwich) variance of
    the cumulative hazard over the independent one — each run's influence Σ_e [collapsed at e − at risk at e · d_e /
    n_e] / n_e summed within its seed, then squared — floored at 1 (never narrower than for independent runs). By
    Cauchy–Schwarz it is at most the most runs a seed has (its runs perfectly correlated: each seed counts as one run);
    one run a seed: 1. No maintained Python library gives a cluster-robust Kaplan–Meier variance (lifelines and
    statsmodels have none). `at_risk` and `died`: `_risk_sets` at `events`."""
    collapsed_at = (times[:, None] == events[None, :]) & ~censored[:, None]  # [runs, events]
    influence = ((collapsed_at - (times[:, None] >= events[None, :]) * died / at_risk) / at_risk).sum(axis=1)
    clustered = pd.Series(influence).groupby(seeds).sum().pow(2).sum()
    return max(clustered / float(np.sum(influence**2)), 1.0)


def late_half_auc(curve: pd.DataFrame, steps: int) -> float:
    """Held-out accuracy's area over the second half of a run (evaluations at steps ≥ steps / 2), per step: the
    trapezoid over those evaluations divided by the steps they span (one evaluation: its value)."""
    late = curve[curve["step"] >= steps / 2].sort_values("step")
    if late.empty:
        return math.nan
    x, y = late["step"].to_numpy(float), late["value"].to_numpy(float)
    return float(y[0]) if len(x) == 1 else float(np.trapezoid(y, x) / (x[-1] - x[0]))


def late_half_aucs(runs: pd.DataFrame, curves: pd.DataFrame) -> pd.Series:
    """`late_half_auc` of every run of `runs` (indexed as `runs`), from its held-out accuracy in `curves`."""
    evals = curves[curves["metric"] == "eval/accuracy"]
    by_run = {run_id: g for run_id, g in evals.groupby("run_id")}
    return pd.Series(
        [late_half_auc(by_run.get(r.run_id, evals.iloc[:0]), r.steps) for r in runs.itertuples()],
        index=runs.index,
        dtype=float,
    )


def seed_values(runs: pd.DataFrame, column: str) -> np.ndarray:
    """One value per seed for a t interval over seeds: the mean of the cells' means, plus that seed's mean deviation
    from its cells' means (centred). On a full grid this is the seed's mean over its cells; where a seed lacks some
    cells (a failed trial) it is read against the cells it has, so the gap between cells is not read as seed noise
    (the cells' means, over unequal seeds, are the reference: not a full two-way fit). One cell: its runs' values."""
    cells = [runs["tau_policy"], runs["tau_advantage"]]
    values = runs[column].astype(float)
    means = values.groupby(cells).transform("mean")
    deviation = (values - means).groupby(runs["seed"]).mean().dropna()
    centre = float(values.groupby(cells).mean().mean())
    return (centre + deviation - deviation.mean()).to_numpy(float)


def late_stage(runs: pd.DataFrame, curves: pd.DataFrame, level: float = LEVEL) -> pd.DataFrame:
    """Per (method, k): collapses and their steps, final − peak held-out accuracy and the late-half AUC
    (`late_half_auc`), seed means with t intervals (`mean_interval`) cut to their ranges, [−1, 0] and [0, 1]. A
    seed's runs (a grid's cells, replicates) share the seed, so the interval is over seeds (`seed_values`), not over
    runs counted as independent."""
    scored = runs[runs["scored"] & (runs["steps"] > 0)]
    scored = scored.assign(
        late_auc=late_half_aucs(scored, curves), lost=scored["final_accuracy"] - scored["peak_accuracy"]
    )
    rows = []
    for (method, k), g in scored.groupby(["method", "staleness"], sort=True):
        loss, loss_low, loss_high = mean_interval(seed_values(g, "lost"), level, bounds=(-1.0, 0.0))
        auc, auc_low, auc_high = mean_interval(seed_values(g, "late_auc"), level, bounds=(0.0, 1.0))
        steps = sorted(int(s) for s in g.loc[g["collapsed"], "collapse_step"].dropna())
        rows.append(
            dict(
                method=method,
                staleness=k,
                n_runs=len(g),
                n_seeds=g["seed"].nunique(),
                collapsed=int(g["collapsed"].sum()),
                collapse_steps=", ".join(map(str, steps)),
                final_minus_peak=loss,
                final_minus_peak_low=loss_low,
                final_minus_peak_high=loss_high,
                late_auc=auc,
                late_auc_low=auc_low,
                late_auc_high=auc_high,
            )
        )
    if not rows:
        return schema.empty(schema.LATE)
    frame = pd.DataFrame(rows).astype(
        {"staleness": "int64", "n_runs": "int64", "n_seeds": "int64", "collapsed": "int64"}
    )
    return schema.validate(frame, schema.LATE, "late")


# ---------------------------------------------------------------- claims free of selection


def cell_label(method: str, tau_policy: float, tau_advantage: float, has: tuple[bool, bool]) -> str:
    """'copc τ_p 1.5 τ_a 2', 'copc τ_p inf τ_a 2'; a band the method lacks (`has`: method_bands) is left out."""
    bands = [f"{name} {v:g}" for name, v, h in (("τ_p", tau_policy, has[0]), ("τ_a", tau_advantage, has[1])) if h]
    return " ".join([method, *bands])


def with_cells(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs with their cell's label (`cell_label`), each method's bands read from these runs (`method_bands`)."""
    has = method_bands(runs)
    cells = [
        cell_label(m, tp, ta, has[m]) for m, tp, ta in zip(runs["method"], runs["tau_policy"], runs["tau_advantage"])
    ]
    return runs.assign(cell=cells)


def selection_free_scores(runs: pd.DataFrame, families: dict[str, list[str]], score: str = "objective") -> pd.DataFrame:
    """Per family (a name → the methods whose cells it holds), k and seed, two scores on that seed:

    - tuned: the cell with the best mean over the *other* seeds, scored on this one (leave-one-seed-out,
      as nested cross-validation does it): choosing the bands played no part in the score, so a best-of-12
      grid is not favoured by selection over a one-cell baseline. A cell needs this seed and another one;
      ties go to the first cell in label order.
    - untuned: the mean over every cell of the family, on seeds that have them all (what the bands give
      without tuning them).
    """
    scored = runs[runs["scored"]]
    rows = []
    for family, methods in families.items():
        mine = scored[scored["method"].isin(methods)]
        for k, g in mine.groupby("staleness", sort=True):
            table = with_cells(g).pivot_table(index="seed", columns="cell", values=score, aggfunc="mean")
            table = table.reindex(sorted(table.columns), axis=1)
            base = {"family": family, "staleness": int(k)}
            for s in table.index:
                here, others = table.loc[s], table.drop(index=s).mean()
                ok = here.notna() & others.notna()
                if ok.any():
                    cell = others[ok].idxmax()
                    rows.append(
                        base
                        | {
                            "kind": "tuned",
                            "seed": int(s),
                            "cell": cell,
                            "score": float(here[cell]),
                            "cells": int(ok.sum()),
                        }
                    )
                if here.notna().all():
                    rows.append(
                        base
                        | {
                            "kind": "untuned",
                            "seed": int(s),
                            "cell": "all",
                            "score": float(here.mean()),
                            "cells": len(here),
                        }
                    )
    if not rows:
        return schema.empty(schema.SEED_SCORES)
    frame = pd.DataFrame(rows).astype({"staleness": "int64", "seed": "int64", "cells": "int64"})
    return schema.validate(frame, schema.SEED_SCORES, "seed scores")


def _paired(a: pd.Series, b: pd.Series) -> np.ndarray:
    """a − b over the seeds both have (Series indexed by seed)."""
    common = a.index.intersection(b.index)
    return (a.loc[common] - b.loc[common]).to_numpy(float)


def paired_difference(a: pd.Series, b: pd.Series, level: float = LEVEL) -> tuple[int, float, float, float]:
    """(seeds, mean, low, high) of a − b over the seeds both have (Series indexed by seed), with the t interval of
    the mean difference (`mean_interval`); the pairing removes what a seed's warm start and problems share."""
    d = _paired(a, b)
    if len(d) == 0:
        return 0, math.nan, math.nan, math.nan
    mean, low, high = mean_interval(d, level)
    return len(d), mean, low, high


def paired_p(a: pd.Series, b: pd.Series) -> float:
    """The two-sided p of the paired t test of a − b over the seeds both have (scipy's one-sample t of the
    differences, `ttest_rel`'s; NaN under two seeds, 1 where every difference is 0)."""
    d = _paired(a, b)
    if len(d) < 2:
        return math.nan
    if not d.any():
        return 1.0
    return float(stats.ttest_1samp(d, 0.0).pvalue)


def additive_null(runs: pd.DataFrame, n_null: int = N_BOOT, seed: int = 0) -> pd.DataFrame:
    """Is a grid's interaction share more than seed noise gives? Per (method, k) with a complete ≥ 2 × 2 grid.

    The null is additive: cell means α_i + β_j (the two-way fit of the observed table) plus seed noise drawn
    with replacement from the pooled within-cell residuals (each scaled by √(n/(n−1)), n its cell's seeds), the
    same number of seeds per cell as observed, drawn by a random stream of the grid's own. p = (1 + #{null share ≥
    observed}) / (1 + #{null draws with a share}); a draw whose cells all came out equal has none (0/0). The
    interaction share's bootstrap interval cannot answer this: seed noise alone makes the share positive.
    """
    groups = _groups(runs)
    rows = []
    for method, k, tps, tas in _grids(groups):
        keys = [[(method, k, tp, ta) for ta in tas] for tp in tps]
        if len(tps) < 2 or len(tas) < 2 or not all(key in groups for row in keys for key in row):
            continue
        rng = _stream(("additive-null", method, k), seed)
        sizes = np.array([[len(groups[key]) for key in row] for row in keys])
        if (sizes < 2).any():
            continue
        table = np.array([[groups[key].mean() for key in row] for row in keys])
        observed = float(_fraction(table))
        if math.isnan(observed):  # a flat grid: no share to test
            continue
        grand = table.mean()
        additive = table.mean(axis=1, keepdims=True) + table.mean(axis=0, keepdims=True) - grand
        pool = np.concatenate(
            [
                (groups[key] - groups[key].mean()) * math.sqrt(len(groups[key]) / (len(groups[key]) - 1))
                for row in keys
                for key in row
            ]
        )
        null_table = np.empty((n_null, *table.shape))
        for i, j in itertools.product(range(len(tps)), range(len(tas))):
            draws = pool[rng.integers(0, len(pool), size=(n_null, sizes[i, j]))]
            null_table[:, i, j] = additive[i, j] + draws.mean(axis=1)
        null = _fraction(null_table)
        null = null[~np.isnan(null)]  # a null table whose cells came out all equal has no share (0/0): no draw
        if len(null) == 0:
            continue
        rows.append(
            {
                "method": method,
                "staleness": k,
                "fraction": observed,
                "null_median": float(np.nanmedian(null)),
                "p_value": float((1 + np.sum(null >= observed - 1e-12)) / (1 + len(null))),
                "n_min": int(sizes.min()),
            }
        )
    if not rows:
        return schema.empty(schema.ADDITIVE_NULL)
    frame = pd.DataFrame(rows).astype({"staleness": "int64", "n_min": "int64"})
    return schema.validate(frame, schema.ADDITIVE_NULL, "additive null")
