"""Optuna studies for joint sweeps: resumable, failures recorded as FAIL, safe with two sweep processes.

Every trial a sweep asks for is heartbeat-managed: while it runs, its sweep process records a
heartbeat in the storage every `HEARTBEAT_S` seconds (Optuna's RDB heartbeat). A RUNNING trial whose
heartbeat is older than `GRACE_S` belongs to a sweep process that died: it is marked FAIL
("interrupted") and its point runs again. A RUNNING trial with a fresh heartbeat belongs to a live
sweep process: a second `copc sweep` on the same study leaves it alone and waits for it (it joins),
running only the points nobody is running. Trials asked before heartbeats existed (no `managed`
mark) are judged dead. Only public Optuna API is used.

A trial's parameters are the point's numbers, so that a study can grow (more seeds, more lags, more
methods) between sessions: each band as its reciprocal `1/tau_policy`, `1/tau_advantage` in [0, 1] (the
lower edge of the band [1/τ, τ]; τ = ∞ is 0), staleness and seed as integers. The reciprocal keeps every
number finite: optuna-dashboard sends parameters and their ranges to the browser as JSON, and a browser's
`JSON.parse` refuses `Infinity` (the study page stayed blank). Each trial's distribution spans the values
its batch of points takes, so the dashboard's axes span the sweep, not [0, 1024]. The method, a string,
is the user attribute `method`; the exact bands are the user attributes `tau_policy` / `tau_advantage`
(text: `1.5`, `inf`). A band the method does not have is not a parameter of its trials (Optuna's
conditional parameters). Each told trial also carries its run's final / peak accuracy, collapse and
collapse step as user attributes.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import optuna

from copc_core.results import TrialResult
from sweeps.results import TrialOutcome
from sweeps.space import SweepPoint, SweepSpace

FAIL_REASON = "fail_reason"
METHOD = "method"  # user attribute: the point's method (its key in the sweep space)
METHOD_SPEC = "method_spec"  # user attribute: the hash of the resolved method the trial ran (MethodConfig.spec_hash)
MANAGED = "heartbeat_managed"  # user attribute of every trial whose liveness the storage's heartbeat tells
BANDS = ("tau_policy", "tau_advantage")
INTEGERS = ("staleness", "seed")
HEARTBEAT_S = 5  # a live sweep records each running trial's heartbeat this often (default; COPC_HEARTBEAT_S)
GRACE_S = 30  # a heartbeat older than this: the trial's sweep process is gone (default; COPC_HEARTBEAT_GRACE_S)


def heartbeat_settings() -> tuple[int, int]:
    """(heartbeat, grace) in whole seconds: `COPC_HEARTBEAT_S` and `COPC_HEARTBEAT_GRACE_S` over the defaults above
    (a store on a slow shared disk may want a longer grace; a test, a shorter one). The grace must exceed the
    heartbeat twice over, or a live trial whose process stalls a moment would be judged dead. Every sweep process on
    a study should use the same values (each judges the others' trials by its own grace). Raises ValueError naming
    the variable."""
    values = []
    for name, default in (("COPC_HEARTBEAT_S", HEARTBEAT_S), ("COPC_HEARTBEAT_GRACE_S", GRACE_S)):
        text = os.environ.get(name, "").strip() or str(default)
        if not (text.isascii() and text.isdigit()) or int(text) < 1:
            raise ValueError(f"{name} must be a whole number of seconds ≥ 1, got {text!r}")
        values.append(int(text))
    beat, grace = values
    if grace < 2 * beat:
        raise ValueError(f"COPC_HEARTBEAT_GRACE_S ({grace}) must be at least twice COPC_HEARTBEAT_S ({beat})")
    return beat, grace


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
        beat, grace = heartbeat_settings()
        rdb = optuna.storages.RDBStorage(storage, heartbeat_interval=beat, grace_period=grace)
    study = optuna.create_study(
        study_name=name, storage=rdb, direction="maximize", load_if_exists=True, sampler=samplers[sampler]()
    )
    problem = older_format(study)
    if problem:
        raise StudyFormatError(f"study {name!r} in {storage} {problem}")
    return SweepStudy(study, rdb)


SEED_SCOPE = "warm_start_per_seed"  # study user attribute: whether a seed picks its warm start (SweepSpace)


def same_seed_scope(sweep: SweepStudy, space: SweepSpace) -> None:
    """Record whether the study's seeds vary the warm start, or refuse a space that says otherwise: a point's identity
    (method, bands, lag, seed) does not hold it, so its finished trials would count as done under the other scope. A
    study that holds trials from before the attribute existed ran one warm start for every seed."""
    recorded = sweep.study.user_attrs.get(SEED_SCOPE)
    if recorded is None:
        recorded = False if sweep.study.get_trials(deepcopy=False) else space.warm_start_per_seed
        sweep.study.set_user_attr(SEED_SCOPE, recorded)
    if recorded != space.warm_start_per_seed:
        said = {True: "each seed its own warm start", False: "one warm start for every seed"}
        flag = "--warm-start-per-seed" if recorded else "--one-warm-start"
        raise StudyFormatError(
            f"study {sweep.study.study_name!r} ran {said[recorded]}; this sweep asks for {said[not recorded]}: its "
            f"finished points would count as done under the other. Resume it with {flag} (the form's "
            "warm_start_per_seed), or run the other choice under a new name."
        )


def name_objective(sweep: SweepStudy, name: str) -> None:
    """The objective's name where optuna-dashboard shows it (in place of "Objective 0")."""
    with warnings.catch_warnings():  # "experimental" in Optuna
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        sweep.study.set_metric_names([name])


def older_format(study: optuna.Study) -> str | None:
    """Why this version cannot grow `study` (written by an older copc), or None."""
    trials = study.get_trials(deepcopy=False)
    categorical = [
        t.number
        for t in trials
        if any(isinstance(d, optuna.distributions.CategoricalDistribution) for d in t.distributions.values())
    ]
    if categorical:
        return (
            f"was written by an older copc (categorical parameters, trials {categorical[:5]}...): it cannot grow; "
            "run this sweep under a new name"
        )
    unbounded = [t.number for t in trials if any(b in t.params for b in BANDS)]
    if unbounded:
        return (
            f"was written by an older copc (bands as unbounded parameters up to ∞, trials {unbounded[:5]}..., "
            "which optuna-dashboard cannot show): migrate it with `copc migrate-study`, or run this sweep under "
            "a new name; its runs stay in MLflow and the report either way"
        )
    return None


class StudyFormatError(ValueError):
    """A study whose trials this version cannot extend."""


def changed_definitions(sweep: SweepStudy, space: SweepSpace, spec_of: Callable[[SweepPoint], str]) -> None:
    """Refuse to grow a study whose finished trials ran a method under another definition than today's (their
    `METHOD_SPEC` differs from `spec_of(point)`: a registry row's defaults or meaning changed). Their results would be
    mixed with new ones under one name. Trials written before methods were recorded carry no spec and pass."""
    grid = set(space.grid())
    counts: dict[str, int] = {}
    for t in sweep.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        key = _trial_key(t)
        if key in grid and METHOD_SPEC in t.user_attrs and t.user_attrs[METHOD_SPEC] != spec_of(key):
            counts[t.user_attrs[METHOD]] = counts.get(t.user_attrs[METHOD], 0) + 1
    if counts:
        raise StudyFormatError(
            f"study {sweep.study.study_name!r} holds finished trials that ran another definition of "
            + ", ".join(f"{m} ({n} trial{'s' * (n > 1)})" for m, n in sorted(counts.items()))
            + " than this version's registry gives (a default or the meaning of the method changed since): their "
            "results would be mixed with new ones. Run the sweep under a new --name, or with the version that "
            "wrote them."
        )


def migrate_study(name: str, storage: str) -> int:
    """Rewrite study `name` of the older format (bands as parameters up to ∞) in this version's, keeping every
    trial's state, value, times and attributes; returns how many trials it holds. Optuna cannot rename or edit
    a finished trial, so the trials are copied under `<name>.migrating`, the old study deleted, the copy
    copied back under `name`, and the temporary study deleted: a migration stopped midway is finished by
    running it again (the temporary study is the copy)."""
    temp = f"{name}.migrating"
    names = {s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)}
    if name in names:
        study = optuna.load_study(study_name=name, storage=storage)
        if not older_format(study):
            return len(study.get_trials(deepcopy=False))
        if "categorical" in (older_format(study) or ""):
            raise StudyFormatError(f"study {name!r} in {storage} {older_format(study)}")
        old = study.get_trials(deepcopy=False)
        if any(t.state == optuna.trial.TrialState.RUNNING for t in old):
            raise StudyFormatError(f"study {name!r} has running trials: stop its sweep, then migrate")
        trials = _in_this_format(old)
        if temp in names:
            optuna.delete_study(study_name=temp, storage=storage)
        optuna.create_study(study_name=temp, storage=storage, direction="maximize").add_trials(trials)
        optuna.delete_study(study_name=name, storage=storage)
    elif temp not in names:
        raise StudyFormatError(f"no study {name!r} in {storage} (known: {', '.join(sorted(names)) or 'none'})")
    trials = optuna.load_study(study_name=temp, storage=storage).get_trials(deepcopy=False)
    optuna.create_study(study_name=name, storage=storage, direction="maximize").add_trials(trials)
    optuna.delete_study(study_name=temp, storage=storage)
    return len(trials)


def _in_this_format(trials: list[optuna.trial.FrozenTrial]) -> list[optuna.trial.FrozenTrial]:
    """Older-format trials (bands as parameters up to ∞) as this version writes them."""
    points = [
        SweepPoint(
            t.user_attrs.get(METHOD, "?"), *(t.params.get(b) for b in BANDS), t.params["staleness"], t.params["seed"]
        )
        for t in trials
    ]
    distributions = study_distributions(points)
    out = []
    for t, p in zip(trials, points):
        params = study_params(p)
        attrs = dict(t.user_attrs) | {b: str(getattr(p, b)) for b in BANDS}
        system = dict(t.system_attrs) | ({"fixed_params": params} if "fixed_params" in t.system_attrs else {})
        out.append(
            optuna.trial.FrozenTrial(
                number=t.number,
                state=t.state,
                value=None,
                values=t.values,
                datetime_start=t.datetime_start,
                datetime_complete=t.datetime_complete,
                params=params,
                distributions={k: distributions[k] for k in params},
                user_attrs=attrs,
                system_attrs=system,
                intermediate_values=t.intermediate_values,
                trial_id=t._trial_id,
            )
        )
    return out


# Set when a trial is asked, replaced when it is told: a trial that the heartbeat check fails (its process died)
# keeps this reason, since a finished trial's attributes cannot be written any more.
def stale_reason() -> str:
    return f"interrupted: its sweep process stopped (no heartbeat for {heartbeat_settings()[1]} s)"


def study_params(point: SweepPoint) -> dict[str, float | int]:
    """A point's numbers as a trial's parameters: each band as 1/τ (∞ → 0, so every number is finite JSON),
    staleness and seed as they are; a band the method lacks is no parameter."""
    bands = {f"1/{b}": 1.0 / getattr(point, b) for b in BANDS if getattr(point, b) is not None}
    return bands | {k: getattr(point, k) for k in INTEGERS}


def study_distributions(points: list[SweepPoint]) -> dict[str, optuna.distributions.BaseDistribution]:
    """Each parameter's distribution over the values `points` take (optuna-dashboard draws an axis over the
    union of the trials' ranges; Optuna lets a float or int range differ between trials, never its kind)."""
    values: dict[str, list] = {}
    for p in points:
        for k, v in study_params(p).items():
            values.setdefault(k, []).append(v)
    return {
        k: optuna.distributions.IntDistribution(min(vs), max(vs))
        if k in INTEGERS
        else optuna.distributions.FloatDistribution(min(vs), max(vs))
        for k, vs in values.items()
    }


def trial_point(trial: optuna.trial.FrozenTrial) -> SweepPoint:
    """The point a trial ran (the inverse of how `run_study` asks it): the exact bands from the user attributes."""
    attrs = trial.user_attrs
    bands = [None if attrs.get(b) in (None, "None") else float(attrs[b]) for b in BANDS]
    return SweepPoint(attrs.get(METHOD, "?"), *bands, trial.params["staleness"], trial.params["seed"])


def _trial_key(trial: optuna.trial.FrozenTrial) -> SweepPoint | None:
    """The point a trial of this module ran; None for a trial it did not ask."""
    return trial_point(trial) if METHOD in trial.user_attrs else None


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


def pending_points(sweep: SweepStudy, space: SweepSpace) -> list[SweepPoint]:
    """Grid points that nobody has finished and no live sweep process is running.

    RUNNING trials of dead sweep processes are marked FAIL here (their points are pending again)."""
    taken = {_trial_key(t) for t in _settle(sweep)}  # live
    taken |= {_trial_key(t) for t in sweep.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))}
    return [p for p in space.grid() if p not in taken]


def running_elsewhere(sweep: SweepStudy, space: SweepSpace) -> list[SweepPoint]:
    """Grid points a live sweep process (another one, or this one) is running now."""
    points = set(space.grid())
    return [p for p in map(_trial_key, _settle(sweep)) if p in points]


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
            if self.stop.wait(heartbeat_settings()[0]):
                return

    def __enter__(self) -> _Heartbeats:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()


def run_study(
    sweep: SweepStudy,
    points: list[SweepPoint],
    run_points: Callable[[list[SweepPoint], Callable[[int, TrialResult | BaseException], None]], None],
    point_attrs: Callable[[SweepPoint], dict[str, str]] | None = None,
) -> list[TrialOutcome]:
    """Ask one trial per point (with `point_attrs(point)` as user attributes) and run them (in parallel, by
    `run_points`); each trial is told the moment its run ends (`on_result(i, result_or_exception)`, the result scored
    already), so a sweep killed midway keeps every finished trial. Every asked trial carries a heartbeat until it is
    told."""
    study = sweep.study
    out: list[TrialOutcome | None] = [None] * len(points)
    with _Heartbeats(sweep) as beats:
        trials = []
        distributions = study_distributions(points)
        for p in points:
            numbers = study_params(p)
            study.enqueue_trial(numbers, skip_if_exists=False)
            with warnings.catch_warnings():  # this module records the heartbeats itself (ask/tell, not optimize)
                warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
                trial = study.ask({k: distributions[k] for k in numbers})
            trial_id = sweep.trial_id(trial.number)
            sweep.storage.record_heartbeat(trial_id)  # live from the first moment
            trial.set_user_attr(METHOD, p.method)
            for band in BANDS:  # exact, as text: a number user attribute of ∞ would reach the browser as Infinity
                trial.set_user_attr(band, str(getattr(p, band)))
            for key, value in (point_attrs(p) if point_attrs else {}).items():
                trial.set_user_attr(key, value)
            trial.set_user_attr(MANAGED, True)
            trial.set_user_attr(FAIL_REASON, stale_reason())
            with beats.lock:
                beats.running.add(trial_id)
            trials.append((trial, trial_id))
        keep = _claimed(sweep, points, trials, beats)

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

        if keep:
            run_points([points[i] for i in keep], lambda j, result: on_result(keep[j], result))
    return [o for o in out if o is not None]


TAKEN_REASON = "taken: another sweep process asked for this point first"


def _claimed(sweep: SweepStudy, points: list[SweepPoint], trials: list, beats: _Heartbeats) -> list[int]:
    """The indices of `points` this process runs. Asking a trial reserves its point; two sweep processes that found
    the same point pending both ask, and the one whose trial came first (the lower number) keeps it: each checks after
    its own asks, so the later asker always sees the earlier one. A point finished meanwhile is given up too. The
    trials given up end FAIL with `TAKEN_REASON`."""
    mine = {trial.number for trial, _ in trials}
    others = [
        t
        for t in _settle(sweep) + sweep.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if t.number not in mine
    ]
    first: dict[SweepPoint, int] = {}
    for t in others:
        key = _trial_key(t)
        if key is not None:
            first[key] = min(first.get(key, t.number), -1 if t.state == optuna.trial.TrialState.COMPLETE else t.number)
    keep = []
    for i, (trial, trial_id) in enumerate(trials):
        if first.get(points[i], trial.number + 1) < trial.number:
            with beats.lock:
                beats.running.discard(trial_id)
            sweep.fail(trial.number, TAKEN_REASON)
        else:
            keep.append(i)
    return keep
