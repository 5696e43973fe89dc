"""Benchmark: what overlapping sampling and training buys on Ray, and what COPC's corrections cost.

    python -m bench.async_speedup [--steps 40 --staleness 1 4 --rounds 5]

On the embedded default (batch 128, one rollout worker and one learner, 1 CPU and 1 torch thread
each) it runs, in one Ray session and `--rounds` times in turn: sync PPO (k = 0), then async PPO and
COPC at every lag k given. Per round, per k and as the median over rounds it prints
  * sync step time / async COPC step time, against the pipeline bound (gen + train) / max(gen, train)
    with gen and train measured in the sync run (goals: ≥ 1.7× and ≥ 90 % of the bound);
  * COPC / async PPO learner step time (`time/train_s`; goal ≤ 1.03), in those runs, raw and per
    token position the learner's forward passes read (`learner/positions`).
The first 3 steps of each run are warm-up and left out; medians over the rest. Rounds alternate the
runs, and every other round takes them in reverse order, so that neither a slow spell of a shared
machine nor a run's place in the sequence falls on one of them only.

In the runs each method learns on the batches its own policy samples, and a learner step's cost
depends on the batch (its forward passes stop at the longest episode's last policy token; at k = 4
COPC on this task often collapses and then writes longer answers), so the raw in-run ratio mixes in
the workload. Per position it does less so; and the bench also times the COPC and async PPO learner
steps on the *same* batches, in this process (1 torch thread), interleaved: that ratio is the cost
of COPC's corrections alone.
"""

from __future__ import annotations

import argparse
import statistics
import time

from copc_core.config import RunConfig, with_overrides

KEYS = ("time/step_s", "time/rollout_s", "time/train_s", "time/idle_frac", "learner/positions", "response/length_mean")


def ratios(results: dict[str, dict[str, float]], k: int) -> dict[str, float]:
    """speed-up, pipeline bound, share of the bound reached, COPC / async PPO learner time, and the
    overlap reached in the COPC run itself: max(its rollout, its learner step) / its step time (1 =
    nothing but the slower side on the critical path; the bound assumes the sides run as fast side by
    side as alone, which two processes on two shared cores do not)."""
    sync, copc, ppo = results["sync_ppo k=0"], results[f"copc k={k}"], results[f"async_ppo k={k}"]
    gen, train = sync["time/rollout_s"], sync["time/train_s"]
    bound = (gen + train) / max(gen, train)
    speedup = sync["time/step_s"] / copc["time/step_s"]
    return {
        "speedup": speedup,
        "bound": bound,
        "share": speedup / bound,
        "overhead": copc["time/train_s"] / ppo["time/train_s"],
        "overhead_per_position": copc["train_s_per_position"] / ppo["train_s_per_position"],
        "overlap": max(copc["time/rollout_s"], copc["time/train_s"]) / copc["time/step_s"],
    }


def same_batch_learner_ratio(k: int, n_batches: int, rounds: int) -> tuple[float, float]:
    """Median learner step seconds of (COPC, async PPO) at lag k on the same warm-start batches, interleaved."""
    import torch

    from copc_core.engines.backends import build_model, make_engine
    from copc_core.train.learner import Learner
    from copc_core.train.trainer import ProblemStream, sampling_generator
    from infra.checkpoints import cached_warm_start
    from infra.settings import data_dir

    torch.set_num_threads(1)
    configs = [
        with_overrides(RunConfig(), {"method.name": name, "train.staleness": k}) for name in ("copc", "async_ppo")
    ]
    warm = cached_warm_start(configs[0], data_dir() / "cache")
    sampler = make_engine(configs[0])
    sampler.load_weights(warm, 0)
    problems = ProblemStream(configs[0], 0)
    batches = [sampler.sample(problems.batch(i, 128), 0, sampling_generator(0, i)) for i in range(n_batches)]
    learners = []
    for cfg in configs:
        model = build_model(cfg, 0)
        model.load_state_dict(warm)
        learners.append(Learner(model, cfg, torch.Generator().manual_seed(1)))
    seconds: list[list[float]] = [[], []]
    for r in range(rounds + 1):  # round 0 warms up
        for batch in batches:
            for times, learner in zip(seconds, learners):
                start = time.perf_counter()
                learner.step(batch)
                if r:
                    times.append(time.perf_counter() - start)
    return statistics.median(seconds[0]), statistics.median(seconds[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--staleness", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if min(args.staleness) < 1:
        parser.error("--staleness: every lag must be >= 1 (k = 0 is the sync baseline, always run)")
    from infra.checkpoints import cached_warm_start
    from infra.ray_runtime import RayTrainer, init_ray
    from infra.settings import data_dir

    init_ray(num_cpus=2)
    runs = [("sync_ppo k=0", "sync_ppo", 0)]
    for k in args.staleness:
        runs += [(f"async_ppo k={k}", "async_ppo", k), (f"copc k={k}", "copc", k)]
    print(
        f"embedded default, batch 128, {args.steps} steps per run (first 3 dropped, medians), Ray: 1 rollout worker + "
        f"1 learner, {args.rounds} rounds"
    )
    print(
        f"  {'round':<6s}{'run':<16s} {'step_s':>8s} {'rollout_s':>10s} {'train_s':>8s} {'learner idle':>13s}"
        f" {'positions':>10s} {'length':>7s}"
    )
    per_round: dict[int, list[dict[str, float]]] = {k: [] for k in args.staleness}
    for round_index in range(1, args.rounds + 1):
        results = {}
        for label, method, lag in runs if round_index % 2 else runs[::-1]:
            cfg = with_overrides(
                RunConfig(),
                {"method.name": method, "train.staleness": lag, "train.steps": args.steps, "train.eval_every": 10_000},
            )
            rt = RayTrainer(cfg, cached_warm_start(cfg, data_dir() / "cache"))  # 1 worker + 1 learner, 1 CPU each
            rt.run()
            rt.shutdown()
            rows = rt.history[3:]
            r = results[label] = {key: statistics.median(row[key] for row in rows) for key in KEYS}
            r["train_s_per_position"] = statistics.median(
                row["time/train_s"] / row["learner/positions"] for row in rows
            )
            print(
                f"  {round_index:<6d}{label:<16s} {r['time/step_s']:8.3f} {r['time/rollout_s']:10.3f} "
                f"{r['time/train_s']:8.3f} {r['time/idle_frac']:12.0%} {r['learner/positions']:10.0f} "
                f"{r['response/length_mean']:7.1f}"
            )
        for k in args.staleness:
            q = ratios(results, k)
            per_round[k].append(q)
            print(
                f"        k={k}: speed-up {q['speedup']:.2f}x of a {q['bound']:.2f}x bound ({q['share']:.0%}), overlap "
                f"{q['overlap']:.0%}, COPC / async PPO learner {q['overhead']:.3f} ({q['overhead_per_position']:.3f} "
                "per position)"
            )
    print(f"median over {args.rounds} rounds:")
    for k, rounds in per_round.items():
        med = {key: statistics.median(q[key] for q in rounds) for key in rounds[0]}
        print(f" k = {k}:")
        print(f"  sync / async COPC step time: {med['speedup']:.2f}x   (goal >= 1.7)")
        print(
            f"  pipeline bound (gen+train)/max(gen,train): {med['bound']:.2f}x; speed-up reaches {med['share']:.0%} "
            "of it   (goal >= 90 %)"
        )
        print(f"  overlap in the COPC run: max(rollout, learner step) = {med['overlap']:.0%} of its step time")
        print(
            f"  COPC / async PPO learner step time in those runs: {med['overhead']:.3f}, per position read "
            f"{med['overhead_per_position']:.3f}   (goal <= 1.03)"
        )
    # the lag decides which weights sampled a batch, not what a learner step does with it: measured once
    copc_s, ppo_s = same_batch_learner_ratio(args.staleness[0], n_batches=8, rounds=args.rounds)
    print(
        f" COPC / async PPO learner step time on the same 8 batches ({args.rounds} interleaved rounds, this "
        f"process): {copc_s * 1e3:.1f} / {ppo_s * 1e3:.1f} ms = {copc_s / ppo_s:.3f}   (goal <= 1.03)"
    )


if __name__ == "__main__":
    main()
