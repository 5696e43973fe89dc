"""Benchmark: what overlapping sampling and training buys on Ray, and what COPC's corrections cost.

    python -m bench.async_speedup [--steps 40 --staleness 4]

On the embedded default (batch 128, one rollout worker and one learner, 1 CPU and 1 torch thread
each) it runs, in one Ray session: sync PPO (k = 0), async PPO and COPC at lag k. It prints
  * sync step time / async COPC step time, against the pipeline bound (gen + train) / max(gen, train)
    with gen and train measured in the sync run (goals: ≥ 1.7× and ≥ 90 % of the bound);
  * COPC / async PPO learner step time (`time/train_s`; goal ≤ 1.03).
The first 3 steps of each run are warm-up and left out; means over the rest.
"""

from __future__ import annotations

import argparse
import statistics

from copc_core.config import RunConfig, with_overrides


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--staleness", type=int, default=4)
    args = parser.parse_args()
    from infra.checkpoints import cached_warm_start
    from infra.ray_runtime import RayResources, RayTrainer, init_ray
    from infra.settings import data_dir

    init_ray(num_cpus=2)
    resources = RayResources(rollout_workers=1, rollout_cpus=1, learner_cpus=1, torch_threads=1)
    results = {}
    for label, method, k in (("sync_ppo k=0", "sync_ppo", 0), (f"async_ppo k={args.staleness}", "async_ppo", args.staleness),
                             (f"copc k={args.staleness}", "copc", args.staleness)):
        cfg = with_overrides(RunConfig(), {"method.name": method, "train.staleness": k, "train.steps": args.steps,
                                           "train.eval_every": 10_000})
        rt = RayTrainer(cfg, cached_warm_start(cfg, data_dir() / "cache"), resources)
        rt.run()
        rt.shutdown()
        rows = rt.history[3:]
        results[label] = {key: statistics.mean(r[key] for r in rows)
                          for key in ("time/step_s", "time/rollout_s", "time/train_s", "time/idle_frac")}
    print(f"embedded default, batch 128, {args.steps} steps per run (first 3 dropped), Ray: 1 rollout worker + 1 learner")
    print(f"  {'run':<16s} {'step_s':>8s} {'rollout_s':>10s} {'train_s':>8s} {'learner idle':>13s}")
    for label, r in results.items():
        print(f"  {label:<16s} {r['time/step_s']:8.3f} {r['time/rollout_s']:10.3f} {r['time/train_s']:8.3f} "
              f"{r['time/idle_frac']:12.0%}")
    sync, copc = results["sync_ppo k=0"], results[f"copc k={args.staleness}"]
    gen, train = sync["time/rollout_s"], sync["time/train_s"]
    bound = (gen + train) / max(gen, train)
    speedup = sync["time/step_s"] / copc["time/step_s"]
    overhead = copc["time/train_s"] / results[f"async_ppo k={args.staleness}"]["time/train_s"]
    print(f"  sync / async COPC step time: {speedup:.2f}x   (goal >= 1.7)")
    print(f"  pipeline bound (gen+train)/max(gen,train): {bound:.2f}x; speed-up reaches {speedup / bound:.0%} of it"
          "   (goal >= 90 %)")
    print(f"  COPC / async PPO learner step time: {overhead:.3f}   (goal <= 1.03)")


if __name__ == "__main__":
    main()
