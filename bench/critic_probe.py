"""Probe: how good the critic gets from warm-up alone, per critic layout and setting (no policy update).

    python -m bench.critic_probe [--steps 100 --seeds 2 --workers 2]

For each critic configuration (`CONFIGS`: shared trunk or a trunk of its own, its start, its learning
rate, the λ of its target) the embedded default's trainer runs only its critic warm-up, and the
explained variance of the value predictions on each fresh warm-up batch, measured before that
batch's update (a held-out reading), is printed at a few points. This is the critic-quality
criterion of docs/REGIME.md, measured without looking at any method's learning.
"""

from __future__ import annotations

import argparse
import statistics
from concurrent.futures import ProcessPoolExecutor

from copc_core.config import RunConfig, with_overrides

CONFIGS: dict[str, dict[str, object]] = {
    "shared, lr×1, λ 0.95": {},
    "shared, lr×1, λ 1": {"method.critic_lam": 1.0},
    "separate (own init), lr×1, λ 0.95": {"model.separate_critic": True},
    "separate (own init), lr×1, λ 1": {"model.separate_critic": True, "method.critic_lam": 1.0},
    "separate (own init), lr×3.33, λ 1": {
        "model.separate_critic": True,
        "method.critic_lam": 1.0,
        "train.critic_lr_scale": 10 / 3,
    },
    "separate (policy copy), lr×1, λ 1": {
        "model.separate_critic": True,
        "model.critic_init": "policy",
        "method.critic_lam": 1.0,
    },
    "separate (policy copy), lr×3.33, λ 1": {
        "model.separate_critic": True,
        "model.critic_init": "policy",
        "method.critic_lam": 1.0,
        "train.critic_lr_scale": 10 / 3,
    },
}


def probe(name: str, seed: int, steps: int) -> list[float]:
    import pathlib

    from copc_core.train.trainer import Trainer
    from infra.checkpoints import cached_warm_start
    from infra.settings import configure_torch_threads, data_dir

    configure_torch_threads(1)
    cfg = with_overrides(RunConfig(), {"train.seed": seed, "train.critic_warmup_steps": steps, **CONFIGS[name]})
    trainer = Trainer(cfg, cached_warm_start(cfg, pathlib.Path(data_dir()) / "cache"))
    trainer.warm_up_critic()
    return [r["critic/explained_var"] for r in trainer.warmup]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    from infra.checkpoints import cached_warm_start
    from infra.settings import data_dir

    for overrides in CONFIGS.values():  # warm starts once, before the workers race for them
        cached_warm_start(with_overrides(RunConfig(), overrides), data_dir() / "cache")
    jobs = [(name, seed) for name in CONFIGS for seed in range(args.seeds)]
    with ProcessPoolExecutor(args.workers) as pool:
        curves = list(pool.map(probe, *zip(*jobs), [args.steps] * len(jobs)))
    at = sorted({1, 10, 25, 50, args.steps} & set(range(1, args.steps + 1)))
    print(
        f"critic explained variance on each fresh warm-up batch before its update (mean over {args.seeds} seeds), "
        f"after n value-only steps; embedded default, batch 128"
    )
    print("| critic | " + " | ".join(f"n = {n - 1}" for n in at) + " | mean of the last 10 |")
    print("|---|" + "---|" * (len(at) + 1))
    for name in CONFIGS:
        runs = [c for (n, _), c in zip(jobs, curves) if n == name]
        cells = [f"{statistics.mean(c[n - 1] for c in runs):.2f}" for n in at]
        last = statistics.mean(statistics.mean(c[-10:]) for c in runs)
        print(f"| {name} | " + " | ".join(cells) + f" | {last:.2f} |")


if __name__ == "__main__":
    main()
