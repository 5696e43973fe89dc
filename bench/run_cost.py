"""Benchmark: where one run of the study's regime spends its time, and what `train.greedy_eval` saves.

    python -m bench.run_cost [--steps 300 --staleness 32 --repeats 1]

Runs of the `regime-tool-math` preset's base config (COPC at τ_p 4, τ_a 1.25, lag k versions) in this
process on one torch thread, one with greedy evaluation at every evaluation (`every`, as the study's first
171 runs had it) and one at step 0 and the last step only (`final`), alternated `--repeats` times. Printed
per mode: seconds in the critic warm-up, in learner steps (sampling + update) and in evaluations, the total,
and the ratio of totals; then whether the two runs' sampled held-out accuracies and losses were identical
(they must be: the sampled evaluation has its own generator, and training never reads an evaluation).
No target: the figures say what a run costs and where.
"""

from __future__ import annotations

import argparse
import statistics
import time


def timed_run(config, warm) -> dict:
    from copc_core.train.trainer import Trainer

    trainer = Trainer(config, warm)
    start = time.perf_counter()
    trainer.warm_up_critic()
    warm_s = time.perf_counter() - start
    eval_s = 0.0
    evaluate = trainer.evaluate

    def timed_evaluate() -> dict[str, float]:
        nonlocal eval_s
        t = time.perf_counter()
        record = evaluate()
        eval_s += time.perf_counter() - t
        return record

    trainer.evaluate = timed_evaluate
    while not trainer.done:
        trainer.run_step()
    total = time.perf_counter() - start
    return {
        "warm-up": warm_s,
        "steps": total - warm_s - eval_s,
        "evaluation": eval_s,
        "total": total,
        "accuracy": [e["eval/accuracy"] for e in trainer.evals],
        "loss": [h["actor/loss"] for h in trainer.history],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--staleness", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()

    import torch

    from copc_core.config import with_overrides
    from copc_core.train.run_presets import REGIME_BASE
    from infra.checkpoints import cached_warm_start
    from infra.settings import data_dir

    torch.set_num_threads(1)
    modes = ("every", "final")
    configs = {
        mode: with_overrides(
            REGIME_BASE,
            {
                "train.steps": args.steps,
                "train.staleness": args.staleness,
                "method.tau_policy": 4.0,
                "method.tau_advantage": 1.25,
                "train.greedy_eval": mode,
            },
        )
        for mode in modes
    }
    warm = cached_warm_start(configs["every"], data_dir() / "cache")
    runs: dict[str, list[dict]] = {mode: [] for mode in modes}
    for _ in range(args.repeats):
        for mode in modes:
            runs[mode].append(timed_run(configs[mode], warm))
    parts = ("warm-up", "steps", "evaluation", "total")
    print(f"one regime run: {args.steps} steps, k = {args.staleness}, one torch thread, median of {args.repeats}")
    print("| greedy_eval | " + " | ".join(f"{p} (s)" for p in parts) + " | total / every |")
    print("|---|" + "---|" * (len(parts) + 1))
    median = {mode: {p: statistics.median(r[p] for r in runs[mode]) for p in parts} for mode in modes}
    for mode in modes:
        shares = " | ".join(
            f"{median[mode][p]:.1f} ({median[mode][p] / median[mode]['total']:.0%})" for p in parts[:-1]
        )
        total = median[mode]["total"]
        print(f"| {mode} | {shares} | {total:.1f} | {total / median['every']['total']:.2f} |")
    same = all(a["accuracy"] == b["accuracy"] and a["loss"] == b["loss"] for a, b in zip(runs["every"], runs["final"]))
    print(f"sampled held-out accuracy and losses identical in both modes: {same}")


if __name__ == "__main__":
    main()
