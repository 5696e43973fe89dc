"""Typed results of a sweep: each point's outcome in the study, and the sweep's (a run's own result is
`copc_core.results.TrialResult`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from copc_core.results import TrialResult
from sweeps.space import SweepPoint


@dataclass(frozen=True)
class TrialOutcome:
    """What became of one point of a sweep."""

    point: SweepPoint
    state: Literal["COMPLETE", "FAIL"]
    value: float | None = None
    reason: str = ""
    result: TrialResult | None = None


@dataclass(frozen=True)
class SweepResult:
    """A sweep's outcome: this process's trials, the best trial of the whole study, where it all lives."""

    study: Any  # optuna.Study
    outcomes: list[TrialOutcome]
    best: Any  # optuna.trial.FrozenTrial | None
    parent_run_id: str
    storage: str
    tracking_uri: str
    experiment_id: str

    @property
    def failed(self) -> int:
        return sum(o.state == "FAIL" for o in self.outcomes)
