"""Benchmark: the paper's three claims on an embedded task, over seeds, with bootstrap intervals.

    python -m bench.claims --task tool_math|search [--seeds 3 --steps 60 --workers 2 --lags 0 4 16 64]

Runs (all on the task's default RunConfig, only method / bands / k / seed changed):
  - COPC on the (τ_p, τ_a) grid of the `claims-<task>` sweep preset (sweeps/presets.py),
  - the single-channel ablations on the same band values (copc_policy_only: τ_p; copc_advantage_only: τ_a),
  - the baselines (sync_ppo at k = 0; async_ppo, decoupled_ppo, tis, icepop, vtrace at every k).
Each finished run is appended to data/bench/claims-<task>.jsonl at once (rerun to resume; nothing
finished is rerun). The score of a run is its final held-out accuracy; a run counts as collapsed as
in copc_core.stability. Then:
  (a) coupling: per k, the 2×2 interaction contrasts of COPC's grid with 95 % bootstrap intervals
      over seeds, significant sign reversals, and the interaction share of the grid's variation;
  (b) per k, COPC's best cell vs the best baseline cell (and the ablations), with intervals;
  (c) at the largest k, the collapse rate of every method (COPC at its best cell and over the grid);
  plus the high-performing region: the share of each two-channel / single-channel grid within
  90 % of the best cell over the three at that k.
Tables are printed as Markdown and written to data/bench/claims-<task>.md.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

from tqdm import tqdm

from copc_core.config import RunConfig, with_overrides
from copc_core.methods import preset
from sweeps.presets import sweep_preset

BASELINES = ["sync_ppo", "async_ppo", "decoupled_ppo", "tis", "icepop", "vtrace"]
ABLATIONS = ["copc_policy_only", "copc_advantage_only"]
TASK_PRESETS = {"tool_math": "claims-tool-math", "search": "claims-search"}


def jobs(lags: list[int], seeds: int, taus_p: list[float], taus_a: list[float]) -> list[dict]:
    """Every (method, τ_p, τ_a, k, seed) point; None where a method has no such band."""
    cells = [("copc", tp, ta) for tp in taus_p for ta in taus_a]
    cells += [("copc_policy_only", tp, None) for tp in taus_p] + [("copc_advantage_only", None, ta) for ta in taus_a]
    cells += [(m, None, None) for m in BASELINES]
    return [{"method": m, "tau_policy": tp, "tau_advantage": ta, "staleness": k, "seed": s}
            for m, tp, ta in cells for k in lags for s in range(seeds) if not (preset(m).on_policy and k > 0)]


def run_config(base: RunConfig, job: dict, steps: int) -> RunConfig:
    overrides = {"method.name": job["method"], "train.staleness": job["staleness"], "train.seed": job["seed"],
                 "train.steps": steps, "method.tau_policy": job["tau_policy"], "method.tau_advantage": job["tau_advantage"]}
    return with_overrides(base, overrides)


def one_run(base_json: str, job: dict, steps: int, cache_dir: str) -> dict:
    from copc_core.trainer import Trainer
    from infra.checkpoints import cached_warm_start
    from infra.settings import configure_torch_threads

    cfg = run_config(RunConfig.model_validate_json(base_json), job, steps)
    configure_torch_threads(1)
    warm = cached_warm_start(cfg, pathlib.Path(cache_dir))
    start = time.perf_counter()
    summary = Trainer(cfg, warm).run()
    return job | {"steps": steps, "wall_s": time.perf_counter() - start, **summary.model_dump()}


def key(job: dict) -> tuple:
    return job["method"], job["tau_policy"], job["tau_advantage"], job["staleness"], job["seed"]


def load(path: pathlib.Path, steps: int) -> dict[tuple, dict]:
    if not path.exists():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {key(r): r for r in rows if r["steps"] == steps}


# ---- analysis (pure functions of the result rows) ----


def frame(rows: list[dict]):
    """The runs frame the report's analysis functions take; a method without a band gets τ = inf there."""
    import pandas as pd

    def band(v):
        return math.inf if v is None else float(v)

    return pd.DataFrame([{"method": r["method"], "staleness": int(r["staleness"]), "tau_policy": band(r["tau_policy"]),
                          "tau_advantage": band(r["tau_advantage"]), "seed": int(r["seed"]), "scored": True,
                          "objective": float(r["final_accuracy"]), "collapsed": bool(r["collapsed"]),
                          "final_accuracy": float(r["final_accuracy"]), "peak_accuracy": float(r["peak_accuracy"])}
                         for r in rows])


def _ci(row) -> str:
    if math.isnan(row["ci_low"]):
        return f"{row['mean']:.2f}"
    return f"{row['mean']:.2f} [{row['ci_low']:.2f}, {row['ci_high']:.2f}]"


def _band(v: float) -> str:
    return "—" if math.isinf(v) else f"{v:g}"


def claim_tables(rows: list[dict], lags: list[int]) -> str:
    from reports.analysis import cell_stats, coupling, interaction_fraction

    runs = frame(rows)
    cells = cell_stats(runs)
    out = []
    # (a) coupling
    copc = runs[runs["method"] == "copc"]
    pairs = coupling(copc)
    share = interaction_fraction(copc)
    out.append("#### (a) Coupling: does τ_p's effect depend on τ_a? (COPC grid)\n")
    out.append("| k | 2×2 sub-grids | significant interaction | sign reversals | significant reversals | "
               "interaction share [95 % CI] | largest |contrast| [95 % CI] |")
    out.append("|---|---|---|---|---|---|---|")
    for k in lags:
        p = pairs[pairs["staleness"] == k]
        s = share[share["staleness"] == k]
        if p.empty:
            out.append(f"| {k} | 0 | — | — | — | — | — |")
            continue
        top = p.loc[p["contrast"].abs().idxmax()]
        frac = (f"{s.iloc[0]['fraction']:.2f} [{s.iloc[0]['fraction_low']:.2f}, {s.iloc[0]['fraction_high']:.2f}]"
                if len(s) and not math.isnan(s.iloc[0]["fraction"]) else "— (grid flat)")
        out.append(f"| {k} | {len(p)} | {int(p['significant_interaction'].sum())} | {int(p['reversal'].sum())} | "
                   f"{int(p['significant_reversal'].sum())} | {frac} | {top['contrast']:+.2f} "
                   f"[{top['contrast_low']:+.2f}, {top['contrast_high']:+.2f}] (τ_p {top['tau_policy_from']:g}→"
                   f"{top['tau_policy_to']:g}, τ_a {top['tau_advantage_a']:g} vs {top['tau_advantage_b']:g}) |")
    # COPC grid itself, per k
    out.append("\nCOPC final accuracy per cell (seed mean [95 % CI]):\n")
    taus_a = sorted(copc["tau_advantage"].unique())
    for k in lags:
        g = cells[(cells["method"] == "copc") & (cells["staleness"] == k)]
        if g.empty:
            continue
        out.append(f"k = {k}\n\n| τ_p \\ τ_a | " + " | ".join(f"{t:g}" for t in taus_a) + " |")
        out.append("|---|" + "---|" * len(taus_a))
        for tp in sorted(g["tau_policy"].unique()):
            line = [_ci(g[(g["tau_policy"] == tp) & (g["tau_advantage"] == ta)].iloc[0])
                    if len(g[(g["tau_policy"] == tp) & (g["tau_advantage"] == ta)]) else "—" for ta in taus_a]
            out.append(f"| {tp:g} | " + " | ".join(line) + " |")
        out.append("")
    # (b) best cells
    out.append("#### (b) Best cell per method and k (final accuracy, seed mean [95 % CI]; collapse rate)\n")
    methods = ["copc", *ABLATIONS, *BASELINES]
    out.append("| method | " + " | ".join(f"k={k}" for k in lags) + " |")
    out.append("|---|" + "---|" * len(lags))
    best: dict[tuple, dict] = {}
    for m in methods:
        line = []
        for k in lags:
            g = cells[(cells["method"] == m) & (cells["staleness"] == k)]
            if g.empty:
                line.append("—")
                continue
            b = g.loc[g["mean"].idxmax()]
            best[m, k] = b
            bands = ", ".join(f"{n} {_band(b[c])}" for n, c in (("τ_p", "tau_policy"), ("τ_a", "tau_advantage"))
                              if not math.isinf(b[c]))
            line.append(f"{_ci(b)}; {b['collapse_rate']:.0%}" + (f" ({bands})" if bands else ""))
        out.append(f"| {m} | " + " | ".join(line) + " |")
    out.append("\n| k | COPC best | best baseline | COPC ≥ baseline (means) | intervals overlap |")
    out.append("|---|---|---|---|---|")
    for k in lags:
        if ("copc", k) not in best:
            continue
        c = best["copc", k]
        rivals = [(m, best[m, k]) for m in BASELINES if (m, k) in best]
        m, r = max(rivals, key=lambda mr: mr[1]["mean"])
        overlap = not (c["ci_low"] > r["ci_high"] or r["ci_low"] > c["ci_high"])
        out.append(f"| {k} | {_ci(c)} | {m} {_ci(r)} | {'yes' if c['mean'] >= r['mean'] else 'no'} | "
                   f"{'yes' if overlap else 'no'} |")
    # (c) stability at the largest k
    k = max(lags)
    out.append(f"\n#### (c) Stability at k = {k}: collapse rate over all runs of each method, and the early warnings\n")
    out.append("| method | runs | collapsed | final accuracy (mean over runs) | peak | runs with an ESS-drop or "
               "grad-spike warning | collapsed runs warned before the collapse |")
    out.append("|---|---|---|---|---|---|---|")
    for m in methods:
        g = runs[(runs["method"] == m) & (runs["staleness"] == k)]
        mine = [r for r in rows if r["method"] == m and r["staleness"] == k]
        if len(g):
            warned = [r for r in mine if r["ess_drop_steps"] or r["grad_norm_spike_steps"]]
            collapsed = [r for r in mine if r["collapsed"] and r["collapse_step"] is not None]
            early = [r for r in collapsed
                     if min(r["ess_drop_steps"] + r["grad_norm_spike_steps"], default=math.inf) < r["collapse_step"]]
            out.append(f"| {m} | {len(g)} | {int(g['collapsed'].sum())} ({g['collapsed'].mean():.0%}) | "
                       f"{g['final_accuracy'].mean():.2f} | {g['peak_accuracy'].mean():.2f} | {len(warned)} | "
                       f"{len(early)}/{len(collapsed)} |")
    # region
    out.append("\n#### High-performing region: share of each grid's cells within 90 % of the best cell of the three\n")
    out.append("| k | best of the three | copc (of 9) | copc_policy_only (of 3) | copc_advantage_only (of 3) |")
    out.append("|---|---|---|---|---|")
    for k in lags:
        g = cells[(cells["method"].isin(["copc", *ABLATIONS])) & (cells["staleness"] == k)]
        if g.empty:
            continue
        top = float(g["mean"].max())
        line = []
        for m in ["copc", *ABLATIONS]:
            mine = g[g["method"] == m]
            n = int((mine["mean"] >= 0.9 * top - 1e-12).sum())
            line.append(f"{n}/{len(mine)} ({n / len(mine):.0%})" if len(mine) else "—")
        out.append(f"| {k} | {top:.2f} | " + " | ".join(line) + " |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=sorted(TASK_PRESETS), default="tool_math")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=None, help="learner steps per run (default: the preset's)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--lags", nargs="+", type=int, default=None, help="default: the preset's staleness levels")
    parser.add_argument("--lr", type=float, default=None, help="learning rate of every run (default: the base "
                                                                 "config's); results go to claims-<task>-lr<lr>.*")
    args = parser.parse_args()
    if args.seeds < 2:
        parser.error("--seeds must be at least 2 (intervals are bootstrapped over seeds)")
    from infra.checkpoints import cached_warm_start
    from infra.settings import data_dir

    space, base = sweep_preset(TASK_PRESETS[args.task])
    suffix = ""
    if args.lr is not None:
        base = with_overrides(base, {"train.lr": args.lr})
        suffix = f"-lr{args.lr:g}"
    steps = args.steps or space.steps
    lags = args.lags or space.staleness
    root = data_dir()
    cache = root / "cache"
    out = root / "bench" / f"claims-{args.task}{suffix}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    cached_warm_start(base, cache)  # once, before the workers race for it
    todo = jobs(lags, args.seeds, space.tau_policy, space.tau_advantage)
    done = load(out, steps)
    pending = [j for j in todo if key(j) not in done]
    print(f"{args.task}: {len(todo)} runs of {steps} steps, {len(todo) - len(pending)} already in {out}", file=sys.stderr)
    with ProcessPoolExecutor(args.workers) as pool, out.open("a") as sink:
        futures = [pool.submit(one_run, base.model_dump_json(), j, steps, str(cache)) for j in pending]
        bar = tqdm(as_completed(futures), total=len(futures), desc="runs", unit="run", file=sys.stderr)
        for f in bar:
            row = f.result()
            sink.write(json.dumps(row) + "\n")
            sink.flush()
            done[key(row)] = row
            bar.set_postfix(last=f"{row['method']} k={row['staleness']} acc={row['final_accuracy']:.2f}")
    rows = [done[key(j)] for j in todo]
    lr_flag = f" --lr {args.lr:g}" if args.lr is not None else ""
    header = (f"### {args.task}: {len(rows)} runs, {steps} steps each, lr {base.train.lr:g}, seeds 0..{args.seeds - 1}, "
              f"k ∈ {lags}; warm start {rows[0]['warm_start_accuracy']:.2f} (sampled, held-out)\n\n"
              f"`python -m bench.claims --task {args.task} --seeds {args.seeds} --steps {steps} "
              f"--lags {' '.join(map(str, lags))}{lr_flag}`; total run time {sum(r['wall_s'] for r in rows) / 60:.0f} "
              f"CPU-minutes\n")
    text = header + "\n" + claim_tables(rows, lags) + "\n"
    (root / "bench" / f"claims-{args.task}{suffix}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
