"""Benchmark: final/peak accuracy and collapse rate per method and controlled lag k, over seeds.

    python -m bench.staleness [--seeds 3 --steps 100 --workers 2 --methods ... --lags 0 4 16 64]

Every run uses the embedded default RunConfig (tiny GPT, tool-math, SFT warm start shared through
the cache) with only method, staleness and seed changed. sync_ppo is on-policy by definition and
runs at k = 0 only. Runs go to worker processes (one torch thread each); results are written to
data/bench/staleness.json and printed as a table (mean ± sd over seeds).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

from tqdm import tqdm

from copc_core.config import MethodConfig, RunConfig, TrainConfig, with_overrides
from copc_core.methods import preset

DEFAULT_METHODS = ["sync_ppo", "async_ppo", "decoupled_ppo", "tis", "icepop", "vtrace", "copc"]


def one_run(method: str, k: int, seed: int, steps: int, cache_dir: str) -> dict:
    import pathlib

    from copc_core.trainer import Trainer
    from infra.checkpoints import cached_warm_start
    from infra.settings import configure_torch_threads

    cfg = with_overrides(RunConfig(), {"method.name": method, "train.staleness": k, "train.seed": seed,
                                       "train.steps": steps})
    configure_torch_threads(1)
    warm = cached_warm_start(cfg, pathlib.Path(cache_dir))
    start = time.perf_counter()
    summary = Trainer(cfg, warm).run()
    return {"method": method, "k": k, "seed": seed, "wall_s": time.perf_counter() - start, **summary.model_dump()}


def fmt(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f}±{statistics.stdev(values):.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--methods", nargs="+", default=DEFAULT_METHODS)
    parser.add_argument("--lags", nargs="+", type=int, default=[0, 4, 16, 64])
    args = parser.parse_args()
    from infra.checkpoints import cached_warm_start
    from infra.settings import data_dir

    root = data_dir()
    cache = root / "cache"
    cached_warm_start(RunConfig(), cache)  # once, before the workers race for it
    jobs = [(m, k, s) for m in args.methods for k in args.lags for s in range(args.seeds)
            if not (preset(m).on_policy and k > 0)]
    results = []
    with ProcessPoolExecutor(args.workers) as pool:
        futures = [pool.submit(one_run, m, k, s, args.steps, str(cache)) for m, k, s in jobs]
        for f in tqdm(as_completed(futures), total=len(futures), desc="runs", unit="run"):
            results.append(f.result())
    out = root / "bench" / "staleness.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print(f"{len(results)} runs, {args.steps} steps each, seeds 0..{args.seeds - 1}; results in {out}")
    print(f"warm-start accuracy {results[0]['warm_start_accuracy']:.2f} (sampled, held-out)")
    header = "| method | " + " | ".join(f"k={k}: final / peak / collapsed" for k in args.lags) + " |"
    print(header)
    print("|" + "---|" * (len(args.lags) + 1))
    for m in args.methods:
        cells = []
        for k in args.lags:
            rows = [r for r in results if r["method"] == m and r["k"] == k]
            if not rows:
                cells.append("—")
                continue
            collapsed = sum(r["collapsed"] for r in rows)
            cells.append(f"{fmt([r['final_accuracy'] for r in rows])} / {fmt([r['peak_accuracy'] for r in rows])}"
                         f" / {collapsed}/{len(rows)}")
        print(f"| {m} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
