"""Benchmark: what the learner's per-step diagnostics and critic warm-up cost, side by side in one process.

    python -m bench.learner_cost [--batches 4 --rounds 5 --rows 0 16 32]

On the embedded default (tiny GPT, tool-math, batch 128, 4 minibatches), learners that differ only in
`train.kl_step_rows` (0 = policy/kl_step off) take steps on the same warm-start batches, interleaved
round by round on one torch thread; the median step seconds of each are printed with the ratio to the
`rows = 0` learner. A separate critic (a second trunk) and a value-only critic warm-up step are timed
the same way, against the default policy step. No target: the figures say what each option costs.
"""

from __future__ import annotations

import argparse
import statistics
import time

from copc_core.config import RunConfig, with_overrides


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rows", type=int, nargs="+", default=[0, 16, 32])
    args = parser.parse_args()

    import torch

    from copc_core.engines.backends import build_model, make_engine
    from copc_core.train.learner import Learner
    from copc_core.train.trainer import ProblemStream, sampling_generator
    from infra.checkpoints import cached_warm_start
    from infra.settings import data_dir

    torch.set_num_threads(1)
    base = RunConfig()
    warm = cached_warm_start(base, data_dir() / "cache")
    sampler = make_engine(base)
    sampler.load_weights(warm, 0)
    problems = ProblemStream(base, 0)
    batches = [
        sampler.sample(problems.batch(i, base.train.batch_size), 0, sampling_generator(0, i))
        for i in range(args.batches)
    ]

    def learner(overrides: dict) -> Learner:
        cfg = with_overrides(base, overrides)
        model = build_model(cfg, 0)
        model.load_state_dict(warm, strict=not cfg.model.separate_critic)
        return Learner(model, cfg, torch.Generator().manual_seed(1))

    contenders = {f"kl_step_rows={n}": (learner({"train.kl_step_rows": n}), "step") for n in args.rows}
    contenders["separate critic (kl rows 8)"] = (learner({"model.separate_critic": True}), "step")
    contenders["critic warm-up step (shared)"] = (learner({}), "warm_up_critic")
    contenders["critic warm-up step (separate)"] = (learner({"model.separate_critic": True}), "warm_up_critic")
    seconds: dict[str, list[float]] = {name: [] for name in contenders}
    for r in range(args.rounds + 1):  # round 0 warms up
        order = list(contenders.items()) if r % 2 else list(contenders.items())[::-1]
        for batch in batches:
            for name, (lrn, method) in order:
                start = time.perf_counter()
                getattr(lrn, method)(batch)
                if r:
                    seconds[name].append(time.perf_counter() - start)
    reference = statistics.median(seconds[f"kl_step_rows={args.rows[0]}"])
    print(
        f"embedded default, batch {base.train.batch_size}, {base.train.minibatches} minibatches, 1 torch thread; "
        f"{args.batches} batches × {args.rounds} rounds, medians"
    )
    print(f"  {'learner':<34s} {'s/step':>8s} {'vs ' + f'kl_step_rows={args.rows[0]}':>22s}")
    for name, values in seconds.items():
        median = statistics.median(values)
        print(f"  {name:<34s} {median:8.4f} {median / reference:21.3f}x")


if __name__ == "__main__":
    main()
