"""The joint sweep end to end: Optuna study ↔ Ray trial tasks ↔ MLflow runs (Prefect wraps this later)."""

from __future__ import annotations

import os
import pathlib
import sys
import time
from typing import Any

from copc_core.config import RunConfig
from sweeps.space import SweepSpace, objective_value
from sweeps.study import HEARTBEAT_S, open_study, pending_points, run_study, running_elsewhere


def run_sweep(space: SweepSpace, name: str, base: RunConfig, data: pathlib.Path, storage: str | None = None,
              tracking: str | None = None, sampler: str = "grid") -> dict[str, Any]:
    from tqdm import tqdm

    from infra.checkpoints import cached_warm_start
    from infra.local_stack import require_servers
    from infra.ray_runtime import init_ray
    from infra.sweep_runs import run_trials
    from infra.tracking import Tracker, tracking_uri

    storage = storage or f"sqlite:///{data / 'optuna.db'}"
    require_servers(tracking_uri(data, tracking), prefect=False)  # before the study or any run exists
    tracker = Tracker(tracking_uri(data, tracking), artifact_dir=data / "mlartifacts")
    cache = data / "cache"
    bars: list = []

    def on_warm(step: int, total: int, loss: float) -> None:  # only called when not cached yet
        if not bars:
            bars.append(tqdm(total=total, desc="warm start (SFT, cached for later)", unit="step", file=sys.stderr))
        bars[0].update(1)
        bars[0].set_postfix(loss=f"{loss:.3f}")

    cached_warm_start(base, cache, on_warm)
    for bar in bars:
        bar.close()
    sweep = open_study(name, storage, space, sampler)
    study = sweep.study
    points = pending_points(sweep, space)
    total, elsewhere = len(space.grid()), running_elsewhere(sweep, space)
    print(f"sweep {name!r}: {total} points, {total - len(points) - len(elsewhere)} already finished, {len(points)} to run"
          + (f", {len(elsewhere)} being run by another sweep process (this one waits for them)" if elsewhere else ""),
          file=sys.stderr)
    parent = tracker.parent_run(name, {"space": space.model_dump(mode="json"), "base": base.model_dump(mode="json")})
    init_ray(num_cpus=os.cpu_count())

    def run_points(params_list: list[dict[str, Any]], on_result) -> None:
        configs = [space.run_config(base, p) for p in params_list]
        bar = tqdm(total=len(configs), desc="trials", unit="run", file=sys.stderr)

        def done(i: int, result) -> None:  # track in MLflow, then tell Optuna: as each trial ends
            p = params_list[i]
            lag = "k" if space.schedule == "lag" else "eta"
            run_name = f"{space.method} tp={p['tau_policy']:g} ta={p['tau_advantage']:g} {lag}={p['staleness']} s={p['seed']}"
            if isinstance(result, BaseException):
                tracker.log_failed_trial(parent, name, run_name, f"{type(result).__name__}: {result}", configs[i])
            else:
                score = objective_value(result["summary"], space.objective, space.collapse_penalty)
                result["mlflow_run_id"] = tracker.log_trial(parent, name, run_name, configs[i], result["summary"],
                                                            result["history"], result["evals"], score,
                                                            runtime=result["runtime"])
                bar.set_postfix(last=f"k={p['staleness']} acc={result['summary']['final_accuracy']:.2f}")
            on_result(i, result)
            bar.update(1)

        run_trials(configs, cache, done)
        bar.close()

    outcomes: list[dict] = []
    attempted: set[tuple] = set()  # points this process ran: a failure here is final until the next sweep
    while True:
        attempted |= {_key(p) for p in points}
        # a result logged to MLflow whose sweep died before telling Optuna is told now, not trained again
        logged = tracker.logged_trials(parent)
        hashes = {_key(p): space.run_config(base, p).config_hash() for p in points}
        recovered = [p for p in points if hashes[_key(p)] in logged]
        if recovered:
            print(f"{len(recovered)} result(s) found in MLflow that Optuna was not told of: told now", file=sys.stderr)
            outcomes += run_study(sweep, space, recovered, lambda params_list, on_result: [
                on_result(i, logged[hashes[_key(p)]]) for i, p in enumerate(params_list)])
        fresh = [p for p in points if hashes[_key(p)] not in logged]
        if fresh:
            outcomes += run_study(sweep, space, fresh, run_points)
        # points another live sweep process holds: wait until each ends, or its process dies (then run it)
        while running_elsewhere(sweep, space):
            time.sleep(HEARTBEAT_S)
        points = [p for p in pending_points(sweep, space) if _key(p) not in attempted]
        if not points:
            break
    complete = [t for t in study.trials if t.state.name == "COMPLETE"]
    best = max(complete, key=lambda t: t.value) if complete else None
    tracker.finish_parent(parent, {"sweep/trials_complete": len(complete),
                                   "sweep/best_value": best.value if best else float("nan")})
    return {"study": study, "outcomes": outcomes, "best": best, "parent_run_id": parent, "storage": storage,
            "tracking_uri": tracker.uri}


def _key(params: dict[str, Any]) -> tuple:
    return tuple(sorted(params.items()))


def grid_table(study, space: SweepSpace) -> str:
    """Text heatmaps: objective per (τ_p row, τ_a column) for each staleness level (seed mean)."""
    cells: dict[tuple, list[float]] = {}
    for t in study.trials:
        if t.state.name == "COMPLETE":
            cells.setdefault((t.params["staleness"], t.params["tau_policy"], t.params["tau_advantage"]), []).append(t.value)
    lines = [f"objective = {space.objective} accuracy − {space.collapse_penalty} if collapsed (mean over seeds)"]
    level = "k" if space.schedule == "lag" else "η"
    for k in space.staleness:
        lines.append(f"{level} = {k}:   τ_a → " + "  ".join(f"{ta:>6g}" for ta in space.tau_advantage))
        for tp in space.tau_policy:
            vals = [cells.get((k, tp, ta)) for ta in space.tau_advantage]
            lines.append(f"   τ_p = {tp:<6g}    " + "  ".join(f"{sum(v) / len(v):6.2f}" if v else "     —" for v in vals))
    return "\n".join(lines)
