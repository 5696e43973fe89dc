"""A trial's result as data: the run's summary and curves, scored once by the sweep that ran it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from copc_core.train.stability import RunSummary


@dataclass(frozen=True)
class TrialResult:
    """A finished run of one point: its summary and curves, scored once by the sweep (`objective`)."""

    summary: RunSummary
    history: list[dict[str, float]] = field(default_factory=list)
    evals: list[dict[str, float]] = field(default_factory=list)
    runtime: str = "inprocess"
    objective: float | None = None
    mlflow_run_id: str = ""
    recovered: bool = False  # read back from MLflow (its sweep died before telling Optuna)
    streamed: tuple[int, int] = (0, 0)  # (history, evals) records the tracker received while the run trained

    @classmethod
    def from_run(cls, run: dict[str, Any]) -> TrialResult:
        """From a trial task's plain return value (`summary` as a dict: Ray ships plain data)."""
        streamed = tuple(run.get("streamed", (0, 0)))
        return cls(
            RunSummary.model_validate(run["summary"]), run["history"], run["evals"], run["runtime"], streamed=streamed
        )
