"""The joint sweep end to end: Optuna study ↔ Ray trial tasks ↔ MLflow runs (Prefect wraps this later)."""

from __future__ import annotations

import logging
import math
import os
import pathlib
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from copc_core.config import RunConfig, with_overrides
from copc_core.results import TrialResult
from flows.progress import Bar
from reports.analysis import best_with_ties
from sweeps.plan import PLAN_VERSION
from sweeps.results import SweepResult, TrialOutcome
from sweeps.space import SweepPoint, SweepSpace, objective_name
from sweeps.study import (
    METHOD_SPEC,
    changed_definitions,
    heartbeat_settings,
    name_objective,
    open_study,
    pending_points,
    run_study,
    running_elsewhere,
    same_seed_scope,
    trial_point,
)

log = logging.getLogger("copc.sweep")


@dataclass
class SweepHooks:
    """What a caller sees of a running sweep (the Prefect flow: its log, a node per phase and per trial)."""

    say: logging.Logger | logging.LoggerAdapter = log  # a line per trial, and the sweep's state
    warm_start: Callable[[list[RunConfig], pathlib.Path], None] | None = None  # builds the warm starts (else here)
    opened: Callable[[str], None] | None = None  # (URL of the sweep's runs in MLflow's UI) once it exists
    trial_started: Callable[[str], None] | None = None  # (run name) as its trial starts
    trial_ended: Callable[[str, TrialResult | BaseException], None] | None = None  # (run name, result or error)


def run_sweep(
    space: SweepSpace,
    name: str,
    base: RunConfig,
    data: pathlib.Path,
    storage: str | None = None,
    tracking: str | None = None,
    sampler: str = "grid",
    max_parallel: int | None = None,
    hooks: SweepHooks | None = None,
    plan: str | None = None,
) -> SweepResult:
    """Run every point of `space` not finished yet in study `name`: open the study (refusing one this space cannot
    grow) → warm the cache → open the sweep's MLflow parent → record the plan, if one is given, before any trial
    (sweeps/plan.py) → tell Optuna what MLflow holds already → run the fresh points (each a child run from its start,
    its curves streamed while it trains, then told to Optuna) → close the parent with the per-cell table."""
    from infra.local_stack import require_servers
    from infra.tracking import Tracker, tracking_uri

    hooks = hooks or SweepHooks()
    storage = storage or f"sqlite:///{data / 'optuna.db'}"
    require_servers(tracking_uri(data, tracking), prefect=False)  # before the study or any run exists
    tracker = Tracker(tracking_uri(data, tracking), artifact_dir=data / "mlartifacts")
    sweep = open_study(name, storage, sampler)
    changed_definitions(sweep, space, lambda p: space.run_config(base, p).method.spec_hash())
    same_seed_scope(sweep, space)  # both refuse before any warm start is trained
    (hooks.warm_start or warm_cache)([space.run_config(base, p) for p in space.grid()], data / "cache")
    name_objective(sweep, objective_name(space))
    # the base's steps are the space's (a trial runs space.steps): logged so, not as the base config says
    logged_base = with_overrides(base, {"train.steps": space.steps}).model_dump(mode="json")
    parent = tracker.parent_run(name, {"space": space.model_dump(mode="json"), "base": logged_base})
    tracker.sweep_view(name)  # the runs view every link to the sweep opens
    _announce(sweep, tracker, name, space, hooks)
    version = _record_plan(sweep, tracker, parent, plan, hooks)
    outcomes = _run_pending(_Sweep(space, name, base, data, sweep, tracker, parent, max_parallel, hooks, version))
    mine = set(space.grid())
    complete = [
        t for t in sweep.study.get_trials(deepcopy=False) if t.state.name == "COMPLETE" and trial_point(t) in mine
    ]
    best = max(complete, key=lambda t: t.value) if complete else None
    tracker.finish_parent(
        parent,
        {"sweep/trials_complete": len(complete), "sweep/best_value": best.value if best else float("nan")},
        table=sweep_rows(sweep.study, space),
    )
    return SweepResult(sweep.study, outcomes, best, parent, storage, tracker.uri, tracker.experiment_id)


def _announce(sweep, tracker, name: str, space: SweepSpace, hooks: SweepHooks) -> None:
    """Where to watch the sweep, said as it starts: a log line, the hook, and the Optuna study's attributes (which
    optuna-dashboard shows on the study's page)."""
    from infra.tracking import mlflow_ui_for, sweep_url

    url = sweep_url(mlflow_ui_for(tracker.uri), tracker.experiment_id, name)
    hooks.say.info(f"MLflow: the sweep's runs at {url}")
    if hooks.opened is not None:
        hooks.opened(url)
    for key, value in {
        "mlflow_runs": url,
        "objective": objective_name(space),
        "points": len(space.grid()),
        "steps_per_trial": space.steps,
    }.items():
        sweep.study.set_user_attr(key, value)


def _record_plan(sweep, tracker, parent: str, text: str | None, hooks: SweepHooks) -> int | None:
    """The plan's version this run of the sweep works under: `text` recorded (a new version if it changed), else the
    study's latest, else None; every version the study holds is on the MLflow parent too."""
    from dataclasses import asdict

    from sweeps.plan import record_plan, study_plans

    if text is not None:
        plan = record_plan(sweep.study, text)
        hooks.say.info(f"plan v{plan.version} (sha256 {plan.sha256[:12]}) recorded before any trial of this run")
    plans = study_plans(sweep.study)
    tracker.record_plans(parent, [asdict(p) for p in plans])
    return plans[-1].version if plans else None


def warm_cache(configs: list[RunConfig], cache: pathlib.Path, on_warm=None) -> None:
    """Build the SFT warm start of every distinct warm-start section of `configs` not cached yet (a progress bar on
    a terminal; `on_warm(step, total, loss)` for another display)."""
    from copc_core.train.warmstart import warm_start_key
    from infra.checkpoints import cached_warm_start

    bar = Bar("warm start (SFT, cached for later)")
    for config in {warm_start_key(c): c for c in configs}.values():
        cached_warm_start(
            config, cache, on_warm or (lambda step, total, loss: bar.step(step, total, loss=f"{loss:.3f}"))
        )
    bar.close()


@dataclass
class _Sweep:
    """One run of a sweep: what its steps share."""

    space: SweepSpace
    name: str
    base: RunConfig
    data: pathlib.Path
    study: Any  # sweeps.study.SweepStudy
    tracker: Any  # infra.tracking.Tracker
    parent: str
    max_parallel: int | None
    hooks: SweepHooks
    plan_version: int | None = None  # the plan this run of the sweep works under (sweeps/plan.py)

    def spec(self, point: SweepPoint) -> str:
        """The hash of the method a point runs, as this version's registry resolves it."""
        return self.space.run_config(self.base, point).method.spec_hash()

    @property
    def plan_tags(self) -> dict[str, str]:
        """The plan version this run of the sweep works under, as its trials record it in Optuna and MLflow."""
        return {} if self.plan_version is None else {PLAN_VERSION: str(self.plan_version)}

    def attrs(self, point: SweepPoint) -> dict[str, str]:
        """What a point's trial records beside its point: the method it ran (sweeps.study.changed_definitions) and
        the plan it ran under."""
        return {METHOD_SPEC: self.spec(point)} | self.plan_tags


def _run_pending(s: _Sweep) -> list[TrialOutcome]:
    """Until no point is left: tell Optuna the results MLflow holds already, run the fresh points, wait for the
    points another live sweep process runs (or run them, if it dies)."""
    from infra.ray_runtime import init_ray

    points = pending_points(s.study, s.space)
    total, elsewhere = len(s.space.grid()), running_elsewhere(s.study, s.space)
    s.hooks.say.info(
        f"sweep {s.name!r}: {total} points, {total - len(points) - len(elsewhere)} already finished, "
        f"{len(points)} to run"
        + (f", {len(elsewhere)} being run by another sweep process (this one waits for them)" if elsewhere else "")
    )
    init_ray(num_cpus=os.cpu_count())
    outcomes: list[TrialOutcome] = []
    attempted: set[SweepPoint] = set()  # points this process ran: a failure here is final until the next sweep
    while True:
        _kill_orphans(s)
        attempted |= set(points)
        # results whose sweep died before telling Optuna (of today's definition of their method)
        logged = s.tracker.logged_trials(s.parent, {_mlflow_key(s, p): s.spec(p) for p in points})
        recovered = [p for p in points if _mlflow_key(s, p) in logged]
        if recovered:
            s.hooks.say.info(f"{len(recovered)} result(s) found in MLflow that Optuna was not told of: told now")
            outcomes += run_study(
                s.study, recovered, lambda batch, tell, got=logged: _tell_logged(s, batch, tell, got), s.attrs
            )
        fresh = [p for p in points if _mlflow_key(s, p) not in logged]
        if fresh:
            outcomes += run_study(s.study, fresh, lambda batch, tell: _train_points(s, batch, tell), s.attrs)
        while running_elsewhere(s.study, s.space):  # another live sweep process's points: wait, or run if it dies
            time.sleep(heartbeat_settings()[0])
        points = [p for p in pending_points(s.study, s.space) if p not in attempted]
        if not points:
            return outcomes


def _kill_orphans(s: _Sweep) -> None:
    """Mark KILLED the MLflow runs a stopped sweep process left RUNNING (their points are no longer live)."""
    killed = s.tracker.kill_orphans(s.parent, {_mlflow_key(s, p) for p in running_elsewhere(s.study, s.space)})
    if killed:
        s.hooks.say.info(f"{killed} MLflow run(s) of a stopped sweep process marked KILLED")


def _mlflow_key(s: _Sweep, point: SweepPoint) -> tuple[str, str]:
    """A point's key among MLflow's runs: (config hash, method label), as `Tracker.logged_trials` keys them."""
    return s.space.run_config(s.base, point).config_hash(), point.method


def _tell_logged(s: _Sweep, batch: list[SweepPoint], tell, logged: dict) -> None:
    for i, p in enumerate(batch):
        tell(i, logged[_mlflow_key(s, p)])


def _train_points(s: _Sweep, batch: list[SweepPoint], tell) -> None:
    """Train `batch` as Ray trials: each gets its MLflow run as it starts (its curves stream there), is scored,
    finished in MLflow and told to Optuna (`tell`) as it ends."""
    from infra.sweep_runs import run_trials
    from infra.tracking import machine_tags, stream_every_s

    configs = [s.space.run_config(s.base, p) for p in batch]
    names = [p.label(s.space.schedule) for p in batch]
    tags, every_s = machine_tags() | s.plan_tags, stream_every_s()
    run_ids: dict[int, str] = {}
    bar = Bar("trials", "run")
    done_count = [0]

    def start(i: int) -> dict:
        run_ids[i] = s.tracker.start_trial(s.parent, s.name, names[i], configs[i], batch[i].method, tags)
        if s.hooks.trial_started is not None:
            s.hooks.trial_started(names[i])
        return {"uri": s.tracker.uri, "run_id": run_ids[i], "every_s": every_s}

    def done(i: int, outcome: TrialResult | BaseException) -> None:  # track in MLflow, then tell Optuna
        if i not in run_ids:  # it failed before it started
            start(i)
        done_count[0] += 1
        if isinstance(outcome, BaseException):
            s.tracker.fail_trial(run_ids[i], f"{type(outcome).__name__}: {outcome}")
            s.hooks.say.warning(f"trial {names[i]} FAILED: {type(outcome).__name__}: {outcome}")
        else:
            outcome = replace(outcome, objective=s.space.score(outcome.summary), mlflow_run_id=run_ids[i])
            s.tracker.finish_trial(run_ids[i], outcome)
            m = outcome.summary
            s.hooks.say.info(
                f"trial {done_count[0]}/{len(batch)} {names[i]}: final {m.final_accuracy:.3f}, peak "
                f"{m.peak_accuracy:.3f}"
                + (f", COLLAPSED at step {m.collapse_step}" if m.collapsed else "")
                + f" (objective {outcome.objective:.3f}; MLflow run {run_ids[i]})"
            )
        tell(i, outcome)
        if s.hooks.trial_ended is not None:
            s.hooks.trial_ended(names[i], outcome)
        bar.step(done_count[0], len(batch))

    run_trials(configs, s.data / "cache", done, s.max_parallel, on_start=start)
    bar.close()


def sweep_rows(study, space: SweepSpace) -> list[dict[str, Any]]:
    """One row per (method, τ_p, τ_a, staleness) cell of the space: seed mean and sd of the objective,
    of final accuracy, collapses, over the study's completed trials."""
    cells: dict[tuple, list] = {}
    for t in study.get_trials(deepcopy=False):
        if t.state.name == "COMPLETE":
            cells.setdefault(trial_point(t).cell, []).append(t)
    rows = []
    for m in space.methods:
        for tp, ta in m.bands():
            for k in m.lags(space.staleness):
                trials = cells.get(SweepPoint(m.key, tp, ta, k, 0).cell, [])
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
    """The sample sd; NaN for fewer than two values or any NaN among them (statistics.stdev raises on a NaN)."""
    return statistics.stdev(values) if len(values) > 1 and not any(math.isnan(v) for v in values) else float("nan")


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
        for key in space.method_keys():
            mine = [r for r in rows if r["method"] == key and r["staleness"] == k]
            if not mine:
                continue
            tas = list(dict.fromkeys(r["tau_advantage"] for r in mine))
            tps = list(dict.fromkeys(r["tau_policy"] for r in mine))
            if tas == [None] and tps == [None]:
                r = mine[0]
                lines.append(
                    f"  {key:<28s} {_cell(r['objective_mean'], r['objective_sd']):>11s}{mark(r)} "
                    f"({r['collapsed']}/{r['seeds']})"
                )
                continue
            lines.append(f"  {key:<28s} τ_a → " + "".join(f"{'—' if ta is None else f'{ta:g}':>17s}" for ta in tas))
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
