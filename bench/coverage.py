"""Benchmark: do the report's 95 % intervals of a seed mean cover the truth at the study's 5 seeds?

    python -m bench.coverage [--seeds 5 --replications 2000]

Synthetic cells with a known mean, drawn the way the study's runs come out: a seed's held-out accuracy is a
binomial count over the task's evaluation set (80 questions on search, 256 problems on tool-math) around the
seed's own rate (a normal spread between seeds, clipped to [0, 1]); a collapsed run ends near 0 (a point mass
at 2 % accuracy) and scores final − 0.5 (the study's objective). The truth is the mean of 4 million draws. Each
scenario draws `--replications` cells of `--seeds` runs and counts how often each interval kind holds the truth:

- `percentile`: the percentile bootstrap of the mean (what the report's cell table, coupling contrasts and paired
  differences showed before this benchmark);
- `BCa`: scipy.stats.bootstrap's bias-corrected and accelerated interval (what the late-training table showed),
  no interval when every value is equal (counted as a miss);
- `t (the report's)`: Student's t interval of the mean (reports.analysis.mean_interval, scipy), what the report
  shows for a cell, a paired difference and the late-training means since the coverage was measured.

A paired difference between two methods is a mean over seeds of per-seed differences: the same question, on a
distribution of differences; the scenarios with a shift in the seed's rate stand for it. Printed: coverage per
kind and scenario with its Monte Carlo standard error, and the mean width; where runs collapse, the coverage of a
cell read in two parts (collapse rate, mean of the others); and the coverage of a 2 × 2 interaction contrast.
And the survival plot's pointwise interval where the runs end (Kaplan–Meier): Greenwood's log-log interval taking
every run as independent, and the report's (exact on the effective sample size, a seed's runs not taken as
independent), on runs whose collapse steps share their seed's hazard (`--survival-only` prints that table alone).
Nothing tuned: the figures are what a reader of the report should know about its intervals (docs/BENCHMARKS.md
keeps the last run).
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np
from scipy import stats

LEVEL = 0.95
N_BOOT = 2000  # the report's


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    n_eval: int  # evaluation set size: accuracies are multiples of 1 / n_eval
    rate: float  # the seed rate's mean
    seed_sd: float  # spread of the seed's own rate
    collapse: float  # probability a run collapses (ends near 0, objective − 0.5)


SCENARIOS = [
    Scenario("search, no collapse", 80, 0.65, 0.05, 0.0),
    Scenario("tool-math near the ceiling", 256, 0.97, 0.03, 0.0),
    Scenario("search, collapse 10 %", 80, 0.65, 0.05, 0.10),
    Scenario("tool-math, collapse 20 %", 256, 0.95, 0.03, 0.20),
    Scenario("a paired difference (seed shift 0.04)", 80, 0.04, 0.05, 0.0),
]


@dataclasses.dataclass(frozen=True)
class SurvivalScenario:
    name: str
    runs_a_seed: int  # a grid's cells share a seed
    collapse: float  # a typical seed's chance that a run collapses before it ends
    frailty_sd: float  # sd of a seed's log-hazard: how much its runs collapse together (0: independently)


SURVIVAL = [
    SurvivalScenario("one run a seed, 20 % collapse", 1, 0.20, 0.0),
    SurvivalScenario("12 cells a seed, 5 % collapse, runs independent", 12, 0.05, 0.0),
    SurvivalScenario("12 cells a seed, 5 % collapse, seeds differ (log-hazard sd 1.5)", 12, 0.05, 1.5),
]


def draw(s: Scenario, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Objectives of runs: final accuracy (a binomial count over the evaluation set) − 0.5 if collapsed. The
    difference scenario (`rate` below 0.5 with no collapse) draws a − b of two methods sharing the seed's problems."""
    if s.name.startswith("a paired difference"):
        base = np.clip(rng.normal(0.65, s.seed_sd, shape), 0, 1)
        a = rng.binomial(s.n_eval, np.clip(base + s.rate, 0, 1)) / s.n_eval
        b = rng.binomial(s.n_eval, base) / s.n_eval
        return a - b
    rate = np.clip(rng.normal(s.rate, s.seed_sd, shape), 0, 1)
    collapsed = rng.random(shape) < s.collapse
    rate = np.where(collapsed, 0.02, rate)
    return rng.binomial(s.n_eval, rate) / s.n_eval - 0.5 * collapsed


def percentile(x: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    n = x.shape[1]
    idx = rng.integers(0, n, size=(x.shape[0], N_BOOT, n))
    means = np.take_along_axis(x[:, None, :].repeat(N_BOOT, 1), idx, axis=2).mean(axis=2)
    tail = (1 - LEVEL) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail], axis=1)
    return low, high


def bca(x: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    low, high = np.full(len(x), np.nan), np.full(len(x), np.nan)
    spread = np.ptp(x, axis=1) > 0  # scipy gives no interval (NaN, a warning) for a sample of equal values
    if spread.any():
        ci = stats.bootstrap(
            (x[spread],), np.mean, axis=-1, confidence_level=LEVEL, n_resamples=N_BOOT, method="BCa", random_state=rng
        )
        low[spread], high[spread] = ci.confidence_interval.low, ci.confidence_interval.high
    return low, high


def student_t(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The report's interval of a seed mean, row by row: reports.analysis.mean_interval."""
    from reports.analysis import mean_interval

    rows = np.array([mean_interval(row, LEVEL)[1:] for row in x])
    return rows[:, 0], rows[:, 1]


KINDS = {"percentile": percentile, "BCa": bca, "t (the report's)": lambda x, rng: student_t(x)}


def coverage(s: Scenario, seeds: int, replications: int, rng: np.random.Generator, chunk: int = 250) -> dict:
    truth = float(draw(s, (4_000_000,), rng).mean())
    hits = {k: 0 for k in KINDS}
    widths = {k: [] for k in KINDS}
    for start in range(0, replications, chunk):
        x = draw(s, (min(chunk, replications - start), seeds), rng)
        for kind, interval in KINDS.items():
            low, high = interval(x, rng)
            hits[kind] += int(np.sum((low <= truth) & (truth <= high)))
            widths[kind].append(np.nan_to_num(high - low))
    out = {"truth": truth}
    for kind in KINDS:
        p = hits[kind] / replications
        out[kind] = (p, np.sqrt(p * (1 - p) / replications), float(np.concatenate(widths[kind]).mean()))
    return out


def split_coverage(s: Scenario, seeds: int, replications: int, rng: np.random.Generator) -> dict:
    """A cell read in two parts, where runs collapse: the collapse rate with its exact (Clopper–Pearson) interval,
    and the mean of the runs that did not collapse with its t interval (none under two such runs: a miss)."""
    survivors = dataclasses.replace(s, collapse=0.0)
    truth_mean = float(draw(survivors, (4_000_000,), rng).mean())
    x = draw(s, (replications, seeds), rng)
    collapsed = x < -0.25  # a collapsed run scores final − 0.5 ≤ −0.48; any other ≥ −0.5 + … never below −0.25 here
    k = collapsed.sum(axis=1)
    from reports.analysis import collapse_interval, mean_interval

    rate_hits = sum(low <= s.collapse <= high for low, high in (collapse_interval(int(c), seeds, LEVEL) for c in k))
    mean_hits = 0
    for row, bad in zip(x, collapsed):
        _, low, high = mean_interval(row[~bad], LEVEL)
        mean_hits += bool(low <= truth_mean <= high)  # NaN (under two runs left): a miss
    return {"rate": rate_hits / replications, "mean": mean_hits / replications, "truth_mean": truth_mean}


def contrast_coverage(
    s: Scenario, seeds: int, replications: int, rng: np.random.Generator, kinds=("percentile", "Welch t (the report's)")
) -> dict:
    """The interaction contrast of a 2 × 2 grid, Y(j,b) − Y(i,b) − Y(j,a) + Y(i,a), four independent cells of `seeds`
    runs each (their true contrast 0: the same scenario in every cell): the report's Welch interval
    (reports.analysis.contrast_interval) against the percentile bootstrap of the four cells' replicates."""
    from reports.analysis import contrast_interval

    truth = 0.0
    w = np.array([1, -1, -1, 1])
    hits = dict.fromkeys(kinds, 0)
    for _ in range(replications):
        cells = draw(s, (4, seeds), rng)
        if "percentile" in kinds:
            means = np.stack([cells[c][rng.integers(0, seeds, size=(N_BOOT, seeds))].mean(axis=1) for c in range(4)])
            low, high = np.percentile(w @ means, [(1 - LEVEL) / 2 * 100, (1 + LEVEL) / 2 * 100])
            hits["percentile"] += bool(low <= truth <= high)
        if "Welch t (the report's)" in kinds:
            low, high = contrast_interval(list(cells), list(w), LEVEL)
            hits["Welch t (the report's)"] += bool(low <= truth <= high)
    return {k: v / replications for k, v in hits.items()}


def aggregate_coverage(s: Scenario, seeds: int, replications: int, rng: np.random.Generator) -> dict:
    """The report's rliable-style aggregates (reports.analysis): the IQM of a cell's runs and the probability of
    improvement of one method over another whose seed rate is 0.03 lower, each with its percentile bootstrap."""
    from reports.analysis import _bootstrap, improvement_probability, iqm

    worse = dataclasses.replace(s, rate=s.rate - 0.03)
    truth_iqm = float(iqm(draw(s, (4_000_000,), rng)))
    x_big, y_big = draw(s, (4_000_000,), rng), draw(worse, (4_000_000,), rng)
    truth_p = float(np.mean((x_big > y_big) + 0.5 * (x_big == y_big)))
    hits_iqm = hits_p = 0
    for i in range(replications):
        x, y = draw(s, (seeds,), rng), draw(worse, (seeds,), rng)
        low, high = _bootstrap((x,), lambda v, axis=-1: iqm(v, axis=axis), ("bench-iqm", i), LEVEL)
        hits_iqm += bool(low <= truth_iqm <= high)
        low, high = _bootstrap((x, y), improvement_probability, ("bench-p", i), LEVEL)
        hits_p += bool(low <= truth_p <= high)
    return {"iqm": hits_iqm / replications, "p": hits_p / replications, "truth_iqm": truth_iqm, "truth_p": truth_p}


def survival_coverage(
    s: SurvivalScenario, seeds: int, replications: int, rng: np.random.Generator, steps: int = 300
) -> dict:
    """The survival plot's interval where the runs end (step `steps`): Kaplan–Meier over `seeds` × `runs_a_seed`
    runs whose collapse steps are exponential with their seed's own hazard (a log-normal frailty), read with
    Greenwood's log-log interval taking every run as independent (scipy's; [1, 1] without a collapse, what the report
    drew before) and with the report's (reports.analysis._survival_interval: exact on the effective sample size, a
    seed's runs not taken as independent)."""
    from reports.analysis import _survival_interval

    hazard = -np.log1p(-s.collapse) / steps
    truth = float(np.mean(np.exp(-hazard * steps * np.exp(s.frailty_sd * rng.standard_normal(4_000_000)))))
    seed_of = np.repeat(np.arange(seeds), s.runs_a_seed)
    hits = {"log-log": 0, "report": 0}
    for _ in range(replications):
        frailty = np.exp(s.frailty_sd * rng.standard_normal(seeds))
        times = np.ceil(rng.exponential(1 / (hazard * frailty[seed_of])))
        collapsed = times <= steps
        times = np.minimum(times, steps)
        sf = stats.ecdf(stats.CensoredData.right_censored(times, ~collapsed)).sf
        surviving = float(sf.evaluate(steps))
        if collapsed.any():
            with np.errstate(divide="ignore", invalid="ignore"):
                ci = sf.confidence_interval(LEVEL, method="log-log")
            hits["log-log"] += bool(ci.low.evaluate(steps) <= truth <= ci.high.evaluate(steps))  # NaN: a miss
        step = float(times[collapsed].max()) if collapsed.any() else float(steps)
        low, high = _survival_interval(times, ~collapsed, seed_of, step, surviving, LEVEL)
        hits["report"] += bool(low <= truth <= high)
    return {"truth": truth} | {kind: n / replications for kind, n in hits.items()}


def _table(title: str, header: list[str], rows) -> None:
    """A Markdown table, each row printed as soon as it is computed."""
    if title:
        print(f"\n{title}")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--replications", type=int, default=2000)
    parser.add_argument("--rng", type=int, default=0)
    parser.add_argument("--survival-only", action="store_true", help="only the survival plot's interval")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.rng)
    if args.survival_only:
        return _survival_table(args.seeds, args.replications, rng)
    print(
        f"coverage of nominal {LEVEL:.0%} intervals of a seed mean, {args.seeds} seeds a cell, "
        f"{args.replications} cells a scenario ({N_BOOT} bootstrap resamples)"
    )
    start = time.perf_counter()
    n, reps = args.seeds, args.replications
    report = "t (the report's)", "Welch t (the report's)"
    _table(
        "",
        ["scenario", "truth", *(f"{k}: coverage (± s.e.), mean width" for k in KINDS)],
        (
            [s.name, f"{r['truth']:+.4f}", *(f"{r[k][0]:.3f} (± {r[k][1]:.3f}), {r[k][2]:.3f}" for k in KINDS)]
            for s in SCENARIOS
            for r in [coverage(s, n, reps, rng)]
        ),
    )
    _table(
        "where runs collapse, a cell in two parts: its collapse rate (Clopper–Pearson), the others' mean (t)",
        ["scenario", "collapse rate: coverage", "mean of runs not collapsed: truth, coverage"],
        (
            [s.name, f"{r['rate']:.3f}", f"{r['truth_mean']:+.4f}, {r['mean']:.3f}"]
            for s in SCENARIOS
            if s.collapse
            for r in [split_coverage(s, n, reps, rng)]
        ),
    )
    _table(
        "the interaction contrast of four independent cells (truth 0)",
        ["scenario", "percentile: coverage", f"{report[1]}: coverage"],
        (
            [s.name, f"{r['percentile']:.3f}", f"{r[report[1]]:.3f}"]
            for s in SCENARIOS[:2]
            for r in [contrast_coverage(s, n, reps, rng)]
        ),
    )
    _table(
        "rliable's aggregates as the report gives them (percentile bootstrap over runs)",
        ["scenario", "IQM: truth, coverage", "P(improvement) over a method 0.03 lower: truth, coverage"],
        (
            [s.name, f"{r['truth_iqm']:.4f}, {r['iqm']:.3f}", f"{r['truth_p']:.3f}, {r['p']:.3f}"]
            for s in SCENARIOS[:2]
            for r in [aggregate_coverage(s, n, reps, rng)]
        ),
    )
    _survival_table(n, reps, rng)
    print(f"({time.perf_counter() - start:.0f} s)")


def _survival_table(seeds: int, replications: int, rng: np.random.Generator) -> None:
    _table(
        f"the survival plot's interval where the runs end (step 300), {seeds} seeds, {replications} replications: "
        "Kaplan–Meier",
        [
            "scenario",
            "truth",
            "Greenwood log-log, runs independent: coverage",
            "the report's (exact, by seed): coverage",
        ],
        (
            [s.name, f"{r['truth']:.4f}", f"{r['log-log']:.3f}", f"{r['report']:.3f}"]
            for s in SURVIVAL
            for r in [survival_coverage(s, seeds, replications, rng)]
        ),
    )


if __name__ == "__main__":
    main()
