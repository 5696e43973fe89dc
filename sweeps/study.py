"""Optuna studies for joint sweeps: grid (default) or TPE, resumable, failures recorded as FAIL."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optuna

from sweeps.space import SweepSpace, objective_value

FAIL_REASON = "fail_reason"


def open_study(name: str, storage: str, space: SweepSpace, sampler: str = "grid") -> optuna.Study:
    """Create or load `name` in `storage` (any Optuna RDB URL; SQLite by default)."""
    # grid points reach the study as enqueued trials with every parameter fixed, so in grid mode the sampler
    # never proposes a value (Optuna's GridSampler, given such trials, fails on a one-point grid: KeyError 'grid_id')
    samplers = {"grid": lambda: optuna.samplers.RandomSampler(seed=0),
                "tpe": lambda: optuna.samplers.TPESampler(seed=0)}
    if sampler not in samplers:
        raise ValueError(f"unknown sampler {sampler!r}; valid: {', '.join(samplers)}")
    return optuna.create_study(study_name=name, storage=storage, direction="maximize", load_if_exists=True,
                               sampler=samplers[sampler]())


def _key(params: dict[str, Any]) -> tuple:
    return tuple(sorted((k, float(v)) for k, v in params.items()))


def pending_points(study: optuna.Study, space: SweepSpace) -> list[dict[str, Any]]:
    """Grid points without a COMPLETE trial. Trials left RUNNING by a killed sweep become FAIL."""
    done = set()
    for trial in study.get_trials(deepcopy=False):
        if trial.state == optuna.trial.TrialState.COMPLETE:
            done.add(_key(trial.params))
        elif trial.state == optuna.trial.TrialState.RUNNING:
            study._storage.set_trial_user_attr(trial._trial_id, FAIL_REASON, "interrupted (sweep killed)")
            study._storage.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.FAIL)
    return [p for p in space.grid() if _key(p) not in done]


def run_study(study: optuna.Study, space: SweepSpace, points: list[dict[str, Any]],
              run_points: Callable[[list[dict[str, Any]], Callable[[int, Any], None]], None]) -> list[dict]:
    """Ask one trial per point and run them (in parallel, by `run_points`); each trial is told the
    moment its run ends (`on_result(i, result_or_exception)`), so a sweep killed midway keeps every
    finished trial."""
    distributions = {k: optuna.distributions.CategoricalDistribution(v) for k, v in space.search_space().items()}
    trials = []
    for p in points:
        study.enqueue_trial(p, skip_if_exists=False)
        trials.append(study.ask(distributions))
    out: list[dict] = [{} for _ in trials]

    def on_result(i: int, result: Any) -> None:
        trial = trials[i]
        if isinstance(result, BaseException):
            trial.set_user_attr(FAIL_REASON, f"{type(result).__name__}: {result}")
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            out[i] = {"params": trial.params, "state": "FAIL", "reason": str(result)}
            return
        value = objective_value(result["summary"], space.objective, space.collapse_penalty)
        trial.set_user_attr("mlflow_run_id", result.get("mlflow_run_id", ""))
        study.tell(trial, value)
        out[i] = {"params": trial.params, "state": "COMPLETE", "value": value, **result}

    run_points([t.params for t in trials], on_result)
    return out
