"""Optuna studies for joint sweeps: resumable, failures recorded as FAIL, safe with two sweep processes.

Every trial a sweep asks for is heartbeat-managed: while it runs, its sweep process records a
heartbeat in the storage every `HEARTBEAT_S` seconds (Optuna's RDB heartbeat). A RUNNING trial whose
heartbeat is older than `GRACE_S` belongs to a sweep process that died: it is marked FAIL
("interrupted") and its point runs again. A RUNNING trial with a fresh heartbeat belongs to a live
sweep process: a second `copc sweep` on the same study leaves it alone and waits for it (it joins),
running only the points nobody is running. Trials asked before heartbeats existed (no `managed`
mark) are judged dead. Only public Optuna API is used.

A trial's parameters are the point's numbers with static distributions (the bands on [1, ∞], staleness
and seed as integers), so that a study can grow (more seeds, more lags, more methods) between sessions;
the method, a string, is the user attribute `method`. A band the method does not have is not a
parameter of its trials (Optuna's conditional parameters). Each told trial also carries its run's
final / peak accuracy, collapse and collapse step as user attributes.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import optuna

from copc_core.results import TrialResult
from sweeps.results import TrialOutcome
from sweeps.space import SweepSpace

FAIL_REASON = "fail_reason"
METHOD = "method"  # user attribute: the point's method (its key in the sweep space)
MANAGED = "heartbeat_managed"  # user attribute of every trial whose liveness the storage's heartbeat tells
DISTRIBUTIONS = {
    "tau_policy": optuna.distributions.FloatDistribution(1.0, float("inf")),
    "tau_advantage": optuna.distributions.FloatDistribution(1.0, float("inf")),
    "staleness": optuna.distributions.IntDistribution(0, 1024),
    "seed": optuna.distributions.IntDistribution(0, 2**31 - 1),
}
HEARTBEAT_S = 5  # a live sweep records each running trial's heartbeat this often
GRACE_S = 30  # a heartbeat older than this: the trial's sweep process is gone


@dataclass
class SweepStudy:
    """An Optuna study and the heartbeat-enabled storage it lives in."""

    study: optuna.Study
    storage: optuna.storages.RDBStorage
    study_id: int = field(init=False)

    def __post_init__(self) -> None:
        self.study_id = self.storage.get_study_id_from_name(self.study.study_name)

    def trial_id(self, number: int) -> int:
        return self.storage.get_trial_id_from_study_id_trial_number(self.study_id, number)

    def fail(self, number: int, reason: str) -> None:
        trial_id = self.trial_id(number)
        self.storage.set_trial_user_attr(trial_id, FAIL_REASON, reason)
        try:
            self.storage.set_trial_state_values(trial_id, optuna.trial.TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            pass  # it finished meanwhile: its result stands


def open_study(name: str, storage: str, sampler: str = "grid") -> SweepStudy:
    """Create or load `name` in `storage` (an Optuna RDB URL; SQLite by default), heartbeats on."""
    # grid points reach the study as enqueued trials with every parameter fixed, so in grid mode the sampler
    # never proposes a value (Optuna's GridSampler, given such trials, fails on a one-point grid: KeyError 'grid_id')
    samplers = {
        "grid": lambda: optuna.samplers.RandomSampler(seed=0),
        "tpe": lambda: optuna.samplers.TPESampler(seed=0),
    }
    if sampler not in samplers:
        raise ValueError(f"unknown sampler {sampler!r}; valid: {', '.join(samplers)}")
    with warnings.catch_warnings():  # heartbeats are "experimental" in Optuna
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        rdb = optuna.storages.RDBStorage(storage, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S)
    study = optuna.create_study(
        study_name=name, storage=rdb, direction="maximize", load_if_exists=True, sampler=samplers[sampler]()
    )
    old = [
        t.number
        for t in study.get_trials(deepcopy=False)
        if any(isinstance(d, optuna.distributions.CategoricalDistribution) for d in t.distributions.values())
    ]
    if old:
        raise StudyFormatError(
            f"study {name!r} in {storage} was written by an older copc (categorical parameters, "
            f"trials {old[:5]}...): it cannot grow; run this sweep under a new name"
        )
    return SweepStudy(study, rdb)


class StudyFormatError(ValueError):
    """A study whose trials this version cannot extend."""


# Set when a trial is asked, replaced when it is told: a trial that the heartbeat check fails (its process died)
# keeps this reason, since a finished trial's attributes cannot be written any more.
STALE_REASON = f"interrupted: its sweep process stopped (no heartbeat for {GRACE_S} s)"


def point_key(point: dict[str, Any]) -> tuple:
    """A point's identity: (method, τ_p, τ_a, staleness, seed), a band the method lacks as None."""
    band = lambda v: None if v is None else float(v)  # noqa: E731
    return (
        point["method"],
        band(point.get("tau_policy")),
        band(point.get("tau_advantage")),
        int(point["staleness"]),
        int(point["seed"]),
    )


def trial_point(trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
    """The point a trial ran (the inverse of how `run_study` asks it)."""
    p = trial.params
    return {
        "method": trial.user_attrs.get(METHOD, "?"),
        "tau_policy": p.get("tau_policy"),
        "tau_advantage": p.get("tau_advantage"),
        "staleness": p.get("staleness"),
        "seed": p.get("seed"),
    }


def _trial_key(trial: optuna.trial.FrozenTrial) -> tuple | None:
    return point_key(trial_point(trial)) if METHOD in trial.user_attrs else None


def _settle(sweep: SweepStudy) -> list[optuna.trial.FrozenTrial]:
    """Fail the RUNNING trials of dead sweep processes; returns the trials that are still running (live)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(sweep.study)
    live = []
    for trial in sweep.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        if trial.user_attrs.get(MANAGED):
            live.append(trial)
        else:  # asked by a version without heartbeats: nobody can be running it any more
            sweep.fail(trial.number, "interrupted (sweep killed)")
    return live


def pending_points(sweep: SweepStudy, space: SweepSpace) -> list[dict[str, Any]]:
    """Grid points that nobody has finished and no live sweep process is running.

    RUNNING trials of dead sweep processes are marked FAIL here (their points are pending again)."""
    live = {_trial_key(t) for t in _settle(sweep)}
    done = {_trial_key(t) for t in sweep.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))}
    return [p for p in space.grid() if point_key(p) not in done | live]


def running_elsewhere(sweep: SweepStudy, space: SweepSpace) -> list[dict[str, Any]]:
    """Grid points a live sweep process (another one, or this one) is running now."""
    points = {point_key(p): p for p in space.grid()}
    return [points[_trial_key(t)] for t in _settle(sweep) if _trial_key(t) in points]


class _Heartbeats:
    """A thread recording the heartbeat of every trial in `running` until it is stopped."""

    def __init__(self, sweep: SweepStudy):
        self.sweep = sweep
        self.running: set[int] = set()
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, name="optuna-heartbeats", daemon=True)

    def _beat(self) -> None:
        while True:
            with self.lock:
                ids = list(self.running)
            for trial_id in ids:
                self.sweep.storage.record_heartbeat(trial_id)
            if self.stop.wait(HEARTBEAT_S):
                return

    def __enter__(self) -> _Heartbeats:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()


def run_study(
    sweep: SweepStudy,
    points: list[dict[str, Any]],
    run_points: Callable[[list[dict[str, Any]], Callable[[int, TrialResult | BaseException], None]], None],
) -> list[TrialOutcome]:
    """Ask one trial per point and run them (in parallel, by `run_points`); each trial is told the
    moment its run ends (`on_result(i, result_or_exception)`, the result scored already), so a sweep
    killed midway keeps every finished trial. Every asked trial carries a heartbeat until it is told."""
    study = sweep.study
    out: list[TrialOutcome | None] = [None] * len(points)
    with _Heartbeats(sweep) as beats:
        trials = []
        for p in points:
            numbers = {k: p[k] for k in DISTRIBUTIONS if p.get(k) is not None}
            study.enqueue_trial(numbers, skip_if_exists=False)
            with warnings.catch_warnings():  # this module records the heartbeats itself (ask/tell, not optimize)
                warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
                trial = study.ask({k: DISTRIBUTIONS[k] for k in numbers})
            trial_id = sweep.trial_id(trial.number)
            sweep.storage.record_heartbeat(trial_id)  # live from the first moment
            trial.set_user_attr(METHOD, p["method"])
            trial.set_user_attr(MANAGED, True)
            trial.set_user_attr(FAIL_REASON, STALE_REASON)
            with beats.lock:
                beats.running.add(trial_id)
            trials.append((trial, trial_id))

        def on_result(i: int, result: TrialResult | BaseException) -> None:
            trial, trial_id = trials[i]
            try:
                if isinstance(result, BaseException):
                    reason = f"{type(result).__name__}: {result}"
                    trial.set_user_attr(FAIL_REASON, reason)
                    study.tell(trial, state=optuna.trial.TrialState.FAIL)
                    out[i] = TrialOutcome(points[i], "FAIL", reason=reason)
                    return
                if result.objective is None:
                    raise ValueError("a trial result reaches the study scored (TrialResult.objective)")
                s = result.summary
                for key, value in {
                    "mlflow_run_id": result.mlflow_run_id,
                    FAIL_REASON: "",
                    "final_accuracy": s.final_accuracy,
                    "peak_accuracy": s.peak_accuracy,
                    "auc_accuracy": s.auc_accuracy,
                    "collapsed": s.collapsed,
                    "collapse_step": s.collapse_step,
                }.items():
                    trial.set_user_attr(key, value)
                study.tell(trial, result.objective)
                out[i] = TrialOutcome(points[i], "COMPLETE", result.objective, result=result)
            finally:
                with beats.lock:
                    beats.running.discard(trial_id)

        run_points(points, on_result)
    return [o for o in out if o is not None]
