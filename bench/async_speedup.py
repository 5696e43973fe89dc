"""Benchmark: what overlapping sampling and training buys on Ray, and what COPC's corrections cost.

    python -m bench.async_speedup [--steps 40 --staleness 4 --rounds 5]

On the embedded default (batch 128, one rollout worker and one learner, 1 CPU and 1 torch thread
each) it runs, in one Ray session and `--rounds` times in turn: sync PPO (k = 0), async PPO and COPC
at lag k. Per round and as the median over rounds it prints
  * sync step time / async COPC step time, against the pipeline bound (gen + train) / max(gen, train)
    with gen and train measured in the sync run (goals: ≥ 1.7× and ≥ 90 % of the bound);
  * COPC / async PPO learner step time (`time/train_s`; goal ≤ 1.03).
The first 3 steps of each run are warm-up and left out; medians over the rest. Rounds alternate the
three runs so that a slow spell of a shared machine does not fall on one of them only.
"""

from __future__ import annotations

import argparse
import statistics

from copc_core.config import RunConfig, with_overrides

KEYS = ("time/step_s", "time/rollout_s", "time/train_s", "time/idle_frac")


def ratios(results: dict[str, dict[str, float]], k: int) -> dict[str, float]:
    """speed-up, pipeline bound, share of the bound reached, COPC / async PPO learner time."""
    sync, copc, ppo = results["sync_ppo k=0"], results[f"copc k={k}"], results[f"async_ppo k={k}"]
    gen, train = sync["time/rollout_s"], sync["time/train_s"]
    bound = (gen + train) / max(gen, train)
    speedup = sync["time/step_s"] / copc["time/step_s"]
    return {"speedup": speedup, "bound": bound, "share": speedup / bound,
            "overhead": copc["time/train_s"] / ppo["time/train_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--staleness", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    from infra.checkpoints import cached_warm_start
    from infra.ray_runtime import RayResources, RayTrainer, init_ray
    from infra.settings import data_dir

    init_ray(num_cpus=2)
    resources = RayResources(rollout_workers=1, rollout_cpus=1, learner_cpus=1, torch_threads=1)
    k = args.staleness
    runs = (("sync_ppo k=0", "sync_ppo", 0), (f"async_ppo k={k}", "async_ppo", k), (f"copc k={k}", "copc", k))
    print(f"embedded default, batch 128, {args.steps} steps per run (first 3 dropped, medians), Ray: 1 rollout worker + "
          f"1 learner, {args.rounds} rounds")
    print(f"  {'round':<6s}{'run':<16s} {'step_s':>8s} {'rollout_s':>10s} {'train_s':>8s} {'learner idle':>13s}")
    per_round = []
    for round_index in range(1, args.rounds + 1):
        results = {}
        for label, method, lag in runs:
            cfg = with_overrides(RunConfig(), {"method.name": method, "train.staleness": lag,
                                               "train.steps": args.steps, "train.eval_every": 10_000})
            rt = RayTrainer(cfg, cached_warm_start(cfg, data_dir() / "cache"), resources)
            rt.run()
            rt.shutdown()
            rows = rt.history[3:]
            results[label] = {key: statistics.median(r[key] for r in rows) for key in KEYS}
            r = results[label]
            print(f"  {round_index:<6d}{label:<16s} {r['time/step_s']:8.3f} {r['time/rollout_s']:10.3f} "
                  f"{r['time/train_s']:8.3f} {r['time/idle_frac']:12.0%}")
        per_round.append(ratios(results, k))
        q = per_round[-1]
        print(f"        speed-up {q['speedup']:.2f}x of a {q['bound']:.2f}x bound ({q['share']:.0%}), "
              f"COPC / async PPO learner {q['overhead']:.3f}")
    med = {key: statistics.median(q[key] for q in per_round) for key in per_round[0]}
    print(f"median over {args.rounds} rounds:")
    print(f"  sync / async COPC step time: {med['speedup']:.2f}x   (goal >= 1.7)")
    print(f"  pipeline bound (gen+train)/max(gen,train): {med['bound']:.2f}x; speed-up reaches {med['share']:.0%} of it"
          "   (goal >= 90 %)")
    print(f"  COPC / async PPO learner step time: {med['overhead']:.3f}   (goal <= 1.03)")


if __name__ == "__main__":
    main()
