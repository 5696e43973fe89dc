"""The joint sweep end to end: Optuna study ↔ Ray trial tasks ↔ MLflow runs (Prefect wraps this later)."""

from __future__ import annotations

import logging
import os
import pathlib
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from copc_core.config import RunConfig
from copc_core.results import TrialResult
from reports.analysis import best_with_ties
from sweeps.results import SweepResult, TrialOutcome
from sweeps.space import SweepSpace, objective_name, point_label
from sweeps.study import (
    HEARTBEAT_S,
    name_objective,
    open_study,
    pending_points,
    point_key,
    run_study,
    running_elsewhere,
    trial_point,
)

log = logging.getLogger("copc.sweep")


def run_sweep(
    space: SweepSpace,
    name: str,
    base: RunConfig,
    data: pathlib.Path,
    storage: str | None = None,
    tracking: str | None = None,
    sampler: str = "grid",
    max_parallel: int | None = None,
    progress: logging.Logger | logging.LoggerAdapter | None = None,
    on_trial: Callable[[str, TrialResult | BaseException], None] | None = None,
) -> SweepResult:
    """Run every point of `space` not finished yet in study `name`; each trial is logged to MLflow, then
    told to Optuna, as it ends. `progress` (a logger: the Prefect flow's) gets a line per trial, and
    `on_trial(run name, result or exception)` is called as each trial ends (the flow draws it as a node)."""
    from tqdm import tqdm

    from copc_core.warmstart import warm_start_key
    from infra.checkpoints import cached_warm_start
    from infra.local_stack import require_servers
    from infra.ray_runtime import init_ray
    from infra.sweep_runs import run_trials
    from infra.tracking import Tracker, machine_tags, tracking_uri

    say = progress or log
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

    for config in {warm_start_key(c): c for c in (space.run_config(base, p) for p in space.grid())}.values():
        cached_warm_start(config, cache, on_warm)
    for bar in bars:
        bar.close()
    sweep = open_study(name, storage, sampler)
    name_objective(sweep, objective_name(space))
    study = sweep.study
    points = pending_points(sweep, space)
    total, elsewhere = len(space.grid()), running_elsewhere(sweep, space)
    say.info(
        f"sweep {name!r}: {total} points, {total - len(points) - len(elsewhere)} already finished, "
        f"{len(points)} to run"
        + (f", {len(elsewhere)} being run by another sweep process (this one waits for them)" if elsewhere else "")
    )
    parent = tracker.parent_run(name, {"space": space.model_dump(mode="json"), "base": base.model_dump(mode="json")})
    tracker.sweep_view(name)  # the runs view every link to the sweep opens
    init_ray(num_cpus=os.cpu_count())
    machine = machine_tags()

    def run_points(batch: list[dict[str, Any]], on_result) -> None:
        configs = [space.run_config(base, p) for p in batch]
        bar = tqdm(total=len(configs), desc="trials", unit="run", file=sys.stderr)

        def done(i: int, outcome: TrialResult | BaseException) -> None:  # track in MLflow, then tell Optuna
            p, run_name = batch[i], point_label(batch[i], space.schedule)
            if isinstance(outcome, BaseException):
                tracker.log_failed_trial(
                    parent, name, run_name, f"{type(outcome).__name__}: {outcome}", configs[i], label=p["method"]
                )
                say.warning(f"trial {run_name} FAILED: {type(outcome).__name__}: {outcome}")
            else:
                scored = TrialResult(**{**outcome.__dict__, "objective": space.score(outcome.summary)})
                run_id = tracker.log_trial(parent, name, run_name, configs[i], scored, label=p["method"], tags=machine)
                outcome = TrialResult(**{**scored.__dict__, "mlflow_run_id": run_id})
                s = outcome.summary
                bar.set_postfix(last=f"k={p['staleness']} acc={s.final_accuracy:.2f}")
                say.info(
                    f"trial {bar.n + 1}/{len(configs)} {run_name}: final {s.final_accuracy:.3f}, peak "
                    f"{s.peak_accuracy:.3f}"
                    + (f", COLLAPSED at step {s.collapse_step}" if s.collapsed else "")
                    + f" (objective {outcome.objective:.3f}; MLflow run {run_id})"
                )
            on_result(i, outcome)
            if on_trial is not None:
                on_trial(run_name, outcome)
            bar.update(1)

        run_trials(configs, cache, done, max_parallel)
        bar.close()

    outcomes: list[TrialOutcome] = []
    attempted: set[tuple] = set()  # points this process ran: a failure here is final until the next sweep
    while True:
        attempted |= {point_key(p) for p in points}
        # a result logged to MLflow whose sweep died before telling Optuna is told now, not trained again
        logged = tracker.logged_trials(parent)
        # a point's key in MLflow: (config hash, method label), as Tracker.logged_trials keys its runs
        keys = {point_key(p): (space.run_config(base, p).config_hash(), p["method"]) for p in points}
        recovered = [p for p in points if keys[point_key(p)] in logged]
        if recovered:
            say.info(f"{len(recovered)} result(s) found in MLflow that Optuna was not told of: told now")

            def tell_logged(batch, on_result, logged=logged, keys=keys):
                for i, p in enumerate(batch):
                    on_result(i, logged[keys[point_key(p)]])

            outcomes += run_study(sweep, recovered, tell_logged)
        fresh = [p for p in points if keys[point_key(p)] not in logged]
        if fresh:
            outcomes += run_study(sweep, fresh, run_points)
        # points another live sweep process holds: wait until each ends, or its process dies (then run it)
        while running_elsewhere(sweep, space):
            time.sleep(HEARTBEAT_S)
        points = [p for p in pending_points(sweep, space) if point_key(p) not in attempted]
        if not points:
            break
    mine = {point_key(p) for p in space.grid()}
    complete = [
        t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE" and point_key(trial_point(t)) in mine
    ]
    best = max(complete, key=lambda t: t.value) if complete else None
    tracker.finish_parent(
        parent,
        {"sweep/trials_complete": len(complete), "sweep/best_value": best.value if best else float("nan")},
        table=sweep_rows(study, space),
    )
    return SweepResult(study, outcomes, best, parent, storage, tracker.uri, tracker.experiment_id)


def sweep_rows(study, space: SweepSpace) -> list[dict[str, Any]]:
    """One row per (method, τ_p, τ_a, staleness) cell of the space: seed mean and sd of the objective,
    of final accuracy, collapses, over the study's completed trials."""
    cells: dict[tuple, list] = {}
    for t in study.get_trials(deepcopy=False):
        if t.state.name == "COMPLETE":
            p = trial_point(t)
            cells.setdefault(point_key({**p, "seed": 0})[:4], []).append(t)
    rows = []
    for m in space.methods:
        for tp, ta in m.bands():
            for k in m.lags(space.staleness):
                trials = cells.get(
                    point_key({"method": m.key, "tau_policy": tp, "tau_advantage": ta, "staleness": k, "seed": 0})[:4],
                    [],
                )
                trials = [t for t in trials if t.params.get("seed") in space.seeds]
                values = [t.value for t in trials]
                finals = [t.user_attrs.get("final_accuracy", float("nan")) for t in trials]
                rows.append(
                    {
                        "method": m.key,
                        "tau_policy": tp,
                        "tau_advantage": ta,
                        "staleness": k,
                        "seeds": len(trials),
                        "objective_mean": _mean(values),
                        "objective_sd": _sd(values),
                        "final_mean": _mean(finals),
                        "final_sd": _sd(finals),
                        "collapsed": sum(bool(t.user_attrs.get("collapsed")) for t in trials),
                    }
                )
    return rows


def best_per_level(rows: list[dict[str, Any]], schedule: str = "lag") -> list[str]:
    """Per staleness level, the best cell(s) by seed-mean objective over every method: ties all named."""
    level = "k" if schedule == "lag" else "η"
    out = []
    for k in sorted({r["staleness"] for r in rows}):
        at = [r for r in rows if r["staleness"] == k and r["seeds"]]
        if not at:
            continue
        bands = (("tp", "tau_policy"), ("ta", "tau_advantage"))
        best = best_with_ties(
            [
                (" ".join([r["method"]] + [f"{n}={r[b]:g}" for n, b in bands if r[b] is not None]), r["objective_mean"])
                for r in at
            ]
        )
        collapsed = all(r["collapsed"] == r["seeds"] for r in at)
        out.append(f"{level}={k}: {best}" + (" — every run collapsed" if collapsed else ""))
    return out


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def _sd(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else float("nan")


def _cell(mean: float, sd: float) -> str:
    if mean != mean:
        return "—"
    return f"{mean:.2f}" + (f"±{sd:.2f}" if sd == sd else "")


def grid_table(study, space: SweepSpace) -> str:
    """Text tables: per method, the objective's seed mean ± sd per (τ_p row, τ_a column) at each staleness
    level, collapses counted; the best cell of each level marked * (ties all marked)."""
    rows = sweep_rows(study, space)
    level = "k" if space.schedule == "lag" else "η"
    lines = [
        f"objective = {space.objective} accuracy − {space.collapse_penalty} if collapsed; mean ± sd over seeds "
        f"{space.seeds}; * best at its {level} (ties all marked); (c/n): collapsed runs of n"
    ]
    for k in space.staleness:
        at = [r for r in rows if r["staleness"] == k and r["seeds"]]
        best = max((r["objective_mean"] for r in at), default=None)

        def mark(r: dict, best: float | None = best) -> str:
            return "*" if best is not None and r["seeds"] and abs(r["objective_mean"] - best) < 1e-9 else " "

        lines.append(
            f"{level} = {k}" + ("   (all collapsed)" if at and all(r["collapsed"] == r["seeds"] for r in at) else "")
        )
        for m in space.methods:
            mine = [r for r in rows if r["method"] == m.key and r["staleness"] == k]
            if not mine:
                continue
            tas = list(dict.fromkeys(r["tau_advantage"] for r in mine))
            tps = list(dict.fromkeys(r["tau_policy"] for r in mine))
            if tas == [None] and tps == [None]:
                r = mine[0]
                lines.append(
                    f"  {m.key:<28s} {_cell(r['objective_mean'], r['objective_sd']):>11s}{mark(r)} "
                    f"({r['collapsed']}/{r['seeds']})"
                )
                continue
            lines.append(f"  {m.key:<28s} τ_a → " + "".join(f"{'—' if ta is None else f'{ta:g}':>17s}" for ta in tas))
            for tp in tps:
                cells = []
                for ta in tas:
                    r = next(r for r in mine if r["tau_policy"] == tp and r["tau_advantage"] == ta)
                    cells.append(
                        f"{_cell(r['objective_mean'], r['objective_sd']):>11s}{mark(r)} ({r['collapsed']}/{r['seeds']})"
                    )
                lines.append(
                    f"    τ_p = {'—' if tp is None else f'{tp:g}':<8s}" + " " * 18 + "".join(f"{c:>17s}" for c in cells)
                )
    return "\n".join(lines)
