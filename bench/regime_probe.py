"""Probe: does a lower learning rate give a regime where learning outlasts the lag? (tool-math)

    python -m bench.regime_probe [--lr 3e-5 --lags 4 16 --seeds 3 --steps 50 --workers 2]

Runs COPC (τ_p = 2 with τ_a = 1 and τ_a = 2), async_ppo and decoupled_ppo on the embedded default
at the given learning rate, lags and seeds, plus one point of the claims bench at the default
learning rate (COPC τ_p = 1.5, τ_a = 1, k = 4, seed 0) as a check that this code reproduces it.
Prints every run and the mean final / peak accuracy and collapse count per (method, k).
"""

from __future__ import annotations

import argparse
import pathlib
from concurrent.futures import ProcessPoolExecutor

from copc_core.config import RunConfig, with_overrides

METHODS = [
    {"method.name": "copc", "method.tau_policy": 2.0, "method.tau_advantage": 1.0},
    {"method.name": "copc", "method.tau_policy": 2.0, "method.tau_advantage": 2.0},
    {"method.name": "async_ppo"},
    {"method.name": "decoupled_ppo"},
]
CHECK = {
    "method.name": "copc",
    "method.tau_policy": 1.5,
    "method.tau_advantage": 1.0,
    "train.staleness": 4,
    "train.seed": 0,
}


def one_run(overrides: dict, steps: int, cache: str) -> tuple[dict, dict]:
    import torch

    from copc_core.train.trainer import Trainer
    from infra.checkpoints import cached_warm_start

    torch.set_num_threads(1)
    cfg = with_overrides(RunConfig(), {"train.steps": steps, **overrides})
    return overrides, Trainer(cfg, cached_warm_start(cfg, pathlib.Path(cache))).run().model_dump()


def label(o: dict) -> str:
    bands = f" τ_p {o['method.tau_policy']:g} τ_a {o['method.tau_advantage']:g}" if "method.tau_policy" in o else ""
    return o["method.name"] + bands


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lr", type=float, default=3e-5)
    parser.add_argument("--lags", nargs="+", type=int, default=[4, 16])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    from infra.checkpoints import cached_warm_start
    from infra.settings import data_dir

    cache = data_dir() / "cache"
    cached_warm_start(RunConfig(), cache)
    grid = [CHECK] + [
        {**m, "train.staleness": k, "train.lr": args.lr, "train.seed": s}
        for k in args.lags
        for m in METHODS
        for s in range(args.seeds)
    ]
    groups: dict[tuple[str, int], list[dict]] = {}
    with ProcessPoolExecutor(args.workers) as pool:
        for o, s in pool.map(one_run, grid, [args.steps] * len(grid), [str(cache)] * len(grid)):
            print(
                f"{label(o):<24s} k={o['train.staleness']:<3d} lr={o.get('train.lr', RunConfig().train.lr):g} "
                f"seed {o['train.seed']}: final {s['final_accuracy']:.3f} peak {s['peak_accuracy']:.3f} "
                f"collapsed {s['collapsed']} (step {s['collapse_step']})",
                flush=True,
            )
            if o is not CHECK:
                groups.setdefault((label(o), o["train.staleness"]), []).append(s)
    print(f"\nlr {args.lr:g}, {args.steps} steps, seeds 0..{args.seeds - 1}: mean final / mean peak / collapsed")
    print("| method | " + " | ".join(f"k={k}" for k in args.lags) + " |")
    print("|---|" + "---|" * len(args.lags))
    for m in METHODS:
        cells = []
        for k in args.lags:
            runs = groups[label(m), k]
            cells.append(
                f"{sum(r['final_accuracy'] for r in runs) / len(runs):.2f} / "
                f"{sum(r['peak_accuracy'] for r in runs) / len(runs):.2f} / "
                f"{sum(r['collapsed'] for r in runs)}/{len(runs)}"
            )
        print(f"| {label(m)} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
