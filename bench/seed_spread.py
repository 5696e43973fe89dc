"""Read-out: how much spread a seed's own warm start adds (docs/journal/2026-12-06-3-warm-start-spread-plan.md).

    python -m bench.seed_spread [--one spread-one --per-seed spread-per-seed]

Reads the two sweeps from the data folder's MLflow store (the same points; one ran every seed from one warm start,
the other each seed from its own) and prints, per method: final held-out accuracy's mean and seed sd in each, the
ratio sd(per seed) / sd(one) with the 95 % interval of a ratio of two sample variances (F with n − 1 and n − 1
degrees of freedom; its square root), collapses; then the first method minus the second paired by seed in each sweep
(t interval).
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import pandas as pd
from scipy import stats

from infra.settings import data_dir
from infra.tracking import read_sweeps, tracking_uri
from reports.analysis import paired_difference
from reports.frames import HISTORY_KEYS, runs_frame


def sd_ratio(per_seed: np.ndarray, one: np.ndarray, level: float = 0.95) -> tuple[float, float, float]:
    """sd(per_seed) / sd(one) and the interval from F(n₁ − 1, n₂ − 1) on the variance ratio."""
    ratio = per_seed.var(ddof=1) / one.var(ddof=1)
    d1, d2 = len(per_seed) - 1, len(one) - 1
    low = ratio / stats.f.ppf(0.5 + level / 2, d1, d2)
    high = ratio / stats.f.ppf(0.5 - level / 2, d1, d2)
    return math.sqrt(ratio), math.sqrt(low), math.sqrt(high)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--one", default="spread-one")
    parser.add_argument("--per-seed", default="spread-per-seed")
    args = parser.parse_args(argv)
    uri = tracking_uri(data_dir(), None)
    frames = []
    for sweep in (
        args.one,
        args.per_seed,
    ):  # one frame per sweep: seed 0's run is the same config in both, kept in each
        found = read_sweeps(uri, [sweep], HISTORY_KEYS)
        frames.append(runs_frame(found["trials"], found["experiment_id"], ""))
    runs = pd.concat(frames, ignore_index=True)
    runs = runs[runs["scored"]]
    methods = sorted(runs["method"].unique())
    print(
        "| method | one warm start: mean ± sd (collapsed) | a warm start per seed: mean ± sd (collapsed) | "
        "sd ratio [95 % CI] |"
    )
    print("|---|---|---|---|")
    by = {}
    for m in methods:
        cells = []
        for sweep in (args.one, args.per_seed):
            g = runs[(runs["method"] == m) & (runs["sweep"] == sweep)]
            by[m, sweep] = g.set_index("seed")["final_accuracy"]
            x = g["final_accuracy"].to_numpy(float)
            cells.append(f"{x.mean():.3f} ± {x.std(ddof=1):.3f} ({int(g['collapsed'].sum())}/{len(g)})")
        r, low, high = sd_ratio(by[m, args.per_seed].to_numpy(float), by[m, args.one].to_numpy(float))
        print(f"| {m} | {cells[0]} | {cells[1]} | {r:.2f} [{low:.2f}, {high:.2f}] |")
    if len(methods) == 2:
        a, b = methods
        print(f"\n{a} − {b}, final accuracy, paired by seed [95 % t CI] (seeds):")
        for sweep in (args.one, args.per_seed):
            n, mean, low, high = paired_difference(by[a, sweep], by[b, sweep])
            print(f"- {sweep}: {mean:+.3f} [{low:+.3f}, {high:+.3f}] ({n})")


if __name__ == "__main__":
    main()
