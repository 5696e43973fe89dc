"""Benchmark: final/peak accuracy and collapse rate per method, controlled lag k and critic variant, over seeds.

    python -m bench.staleness [--seeds 3 --steps 100 --workers 2 --methods ... --lags 0 4 16 64
                               --variants shared separate shared+warmup separate+warmup]

Every run uses the embedded default RunConfig (tiny GPT, tool-math, SFT warm start shared through
the cache) with only method, staleness, seed and the critic variant changed (`VARIANTS`: the value
head on the policy's trunk or a critic trunk of its own, with or without critic warm-up). sync_ppo
is on-policy by definition and runs at k = 0 only. Runs go to worker processes (one torch thread
each); every finished run is appended to data/bench/staleness.jsonl (rerunning resumes: runs
already there are not run again) and the tables are printed (mean ± sd over seeds), one per variant,
then the critic and per-step diagnostics per variant.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

from tqdm import tqdm

from copc_core.config import RunConfig, with_overrides
from copc_core.rl.methods import preset

DEFAULT_METHODS = [
    "sync_ppo",
    "async_ppo",
    "async_ppo_recompute",
    "decoupled_ppo",
    "tis",
    "icepop",
    "m2po",
    "vtrace",
    "seq_tis",
    "seq_mis",
    "geo_rs",
    "cispo",
    "vcpo",
    "a3po",
    "copc",
]

# critic variants: the overrides each applies to the default RunConfig
VARIANTS: dict[str, dict[str, object]] = {
    "shared": {},
    "separate": {"model.separate_critic": True},
    "shared+warmup": {"train.critic_warmup_steps": 100},
    "separate+warmup": {"model.separate_critic": True, "train.critic_warmup_steps": 100},
}


def run_config(method: str, k: int, seed: int, steps: int, variant: str) -> RunConfig:
    return with_overrides(
        RunConfig(),
        {"method.name": method, "train.staleness": k, "train.seed": seed, "train.steps": steps, **VARIANTS[variant]},
    )


def one_run(method: str, k: int, seed: int, steps: int, variant: str, cache_dir: str) -> dict:
    from copc_core.train.trainer import Trainer
    from infra.checkpoints import cached_warm_start
    from infra.settings import configure_torch_threads

    cfg = run_config(method, k, seed, steps, variant)
    configure_torch_threads(1)
    warm = cached_warm_start(cfg, pathlib.Path(cache_dir))
    start = time.perf_counter()
    trainer = Trainer(cfg, warm)
    summary = trainer.run()
    ev = [h["critic/explained_var"] for h in trainer.history]
    return {
        "method": method,
        "k": k,
        "seed": seed,
        "variant": variant,
        "steps": steps,
        "wall_s": time.perf_counter() - start,
        "critic_explained_var_mean": statistics.mean(ev),
        **summary.model_dump(),
    }


def fmt(values: list[float], digits: int = 2) -> str:
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f}±{statistics.stdev(values):.{digits}f}"


def key(row: dict) -> tuple:
    return row["method"], row["k"], row["seed"], row["variant"], row["steps"]


def tables(results: list[dict], methods: list[str], lags: list[int], variants: list[str]) -> str:
    lines = []
    for variant in variants:
        rows = [r for r in results if r["variant"] == variant]
        if not rows:
            continue
        seeds = sorted({r["seed"] for r in rows})
        lines += [
            "",
            f"### critic variant `{variant}` ({VARIANTS[variant] or 'the default'}); "
            f"{rows[0]['steps']} steps, seeds {seeds[0]}..{seeds[-1]}",
            "",
            "| method | " + " | ".join(f"k={k}: final / peak / collapsed" for k in lags) + " |",
            "|" + "---|" * (len(lags) + 1),
        ]
        for m in methods:
            cells = []
            for k in lags:
                cell = [r for r in rows if r["method"] == m and r["k"] == k]
                if not cell:
                    cells.append("—")
                    continue
                collapsed = sum(r["collapsed"] for r in cell)
                cells.append(
                    f"{fmt([r['final_accuracy'] for r in cell])} / {fmt([r['peak_accuracy'] for r in cell])}"
                    f" / {collapsed}/{len(cell)}"
                )
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Critic and per-step diagnostics (mean over every run of the variant, all methods and lags):",
        "",
        "| variant | runs | critic EV after warm-up | critic EV at step 1 | critic EV, mean over steps | "
        "KL(π_v‖π_v+1) per token, mean over steps | training-reward collapses | held-out collapses |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for variant in variants:
        rows = [r for r in results if r["variant"] == variant]
        if not rows:
            continue
        warm = [r["critic_warmup_explained_var"] for r in rows if r["critic_warmup_explained_var"] is not None]
        kl = [r["kl_step_mean"] for r in rows if r["kl_step_mean"] is not None]
        lines.append(
            f"| {variant} | {len(rows)} | {fmt(warm) if warm else '—'} | "
            f"{fmt([r['critic_explained_var_first'] for r in rows])} | "
            f"{fmt([r['critic_explained_var_mean'] for r in rows])} | "
            f"{statistics.mean(kl):.2g} | {sum(r['collapse_step_train'] is not None for r in rows)} | "
            f"{sum(r['collapsed'] for r in rows)} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--methods", nargs="+", default=DEFAULT_METHODS)
    parser.add_argument("--lags", nargs="+", type=int, default=[0, 4, 16, 64])
    parser.add_argument("--variants", nargs="+", default=["shared"], choices=list(VARIANTS))
    parser.add_argument(
        "--out", type=pathlib.Path, default=None, help="results file (default data/bench/staleness.jsonl)"
    )
    args = parser.parse_args()
    for m in args.methods:
        preset(m)  # an unknown name fails here, listing the valid ones
    from infra.checkpoints import cached_warm_start
    from infra.settings import data_dir

    root = data_dir()
    cache = root / "cache"
    out = args.out or root / "bench" / "staleness.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    done = [json.loads(line) for line in out.read_text().splitlines() if line.strip()] if out.exists() else []
    for variant in args.variants:  # once per warm-start key, before the workers race for it
        cached_warm_start(run_config(args.methods[0], 0, 0, args.steps, variant), cache)
    have = {key(r) for r in done}
    jobs = [
        (m, k, s, v)
        for v in args.variants
        for m in args.methods
        for k in args.lags
        for s in range(args.seeds)
        if not (preset(m).on_policy and k > 0) and (m, k, s, v, args.steps) not in have
    ]
    results = [r for r in done if r["steps"] == args.steps]
    started = time.perf_counter()
    with ProcessPoolExecutor(args.workers) as pool, out.open("a") as sink:
        futures = [pool.submit(one_run, m, k, s, args.steps, v, str(cache)) for m, k, s, v in jobs]
        for f in tqdm(as_completed(futures), total=len(futures), desc="runs", unit="run"):
            row = f.result()
            sink.write(json.dumps(row) + "\n")
            sink.flush()
            results.append(row)
    wanted = [
        r
        for r in results
        if r["method"] in args.methods
        and r["k"] in args.lags
        and r["variant"] in args.variants
        and r["seed"] < args.seeds
    ]
    cpu_s = sum(r["wall_s"] for r in wanted)
    print(
        f"{len(wanted)} runs ({len(jobs)} new, {time.perf_counter() - started:.0f} s of wall time for them); "
        f"{cpu_s / 60:.0f} CPU-minutes of training in all; results in {out}"
    )
    print(f"warm-start accuracy {wanted[0]['warm_start_accuracy']:.2f} (sampled, held-out)")
    print(tables(wanted, args.methods, args.lags, args.variants))


if __name__ == "__main__":
    main()
