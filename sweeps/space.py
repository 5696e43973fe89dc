"""Search spaces as data, and the objective computed from a run summary."""

from __future__ import annotations

import itertools
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from copc_core.config import MethodConfig, RunConfig, with_overrides

# search-space parameter → RunConfig field it sets
PARAM_FIELDS = {"tau_policy": "method.tau_policy", "tau_advantage": "method.tau_advantage",
                "staleness": "train.staleness", "seed": "train.seed"}


Band = Annotated[float, Field(ge=1.0, description="τ ≥ 1; inf: no mask / no clip")]

# a sweep's name keys the Optuna study, the MLflow parent run and the report's file: letters, digits and
# . _ + = - (and inner spaces) only, so that it is safe in a filter string and a file name
SweepName = Annotated[str, Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9 ._+=-]*$",
                                 description="letters, digits, . _ + = - and inner spaces")]
MAX_GRID_POINTS = 100_000  # a grid larger than this is refused before it is built


class SweepSpace(BaseModel):
    """A joint grid over (τ_p, τ_a) × staleness × seed for one method, and how to score a run.

    Staleness is a controlled lag k (`schedule: lag`) or a bound η on free-running sampling
    (`schedule: bounded`, whose trials run on the Ray runtime, one at a time).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="strings")

    method: str = "copc"
    tau_policy: list[Band] = Field(default_factory=lambda: [1.5, 2.0, 4.0], min_length=1)
    tau_advantage: list[Band] = Field(default_factory=lambda: [1.0, 2.0, 4.0], min_length=1)
    staleness: list[Annotated[int, Field(ge=0, le=1024)]] = Field(default_factory=lambda: [0, 4], min_length=1)
    schedule: Literal["lag", "bounded"] = Field("lag", description="lag: staleness values are controlled lags k; "
                                                                   "bounded: they are staleness bounds η (free-"
                                                                   "running sampling on the Ray runtime)")
    seeds: list[Annotated[int, Field(ge=0, le=2**31 - 1)]] = Field(default_factory=lambda: [0], min_length=1)
    steps: int = Field(60, ge=1, le=1_000_000)
    objective: Literal["final", "peak", "auc"] = "final"
    collapse_penalty: float = Field(0.5, ge=0.0, le=1.0, description="subtracted from a collapsed run's score")

    @field_validator("tau_policy", "tau_advantage", "staleness", "seeds")
    @classmethod
    def _distinct(cls, v: list) -> list:
        if len(set(v)) != len(v):
            raise ValueError(f"values must be distinct, got {v}")
        return v

    @model_validator(mode="after")
    def _valid_points(self) -> SweepSpace:
        size = len(self.tau_policy) * len(self.tau_advantage) * len(self.staleness) * len(self.seeds)
        if size > MAX_GRID_POINTS:
            raise ValueError(f"the grid has {size:,} points; at most {MAX_GRID_POINTS:,} are allowed")
        for tp, ta in itertools.product(self.tau_policy, self.tau_advantage):
            MethodConfig(name=self.method, tau_policy=tp, tau_advantage=ta)  # the method has both bands
        return self

    def grid(self) -> list[dict[str, Any]]:
        return [{"tau_policy": tp, "tau_advantage": ta, "staleness": k, "seed": s}
                for tp, ta, k, s in itertools.product(self.tau_policy, self.tau_advantage, self.staleness, self.seeds)]

    def search_space(self) -> dict[str, list]:
        return {"tau_policy": self.tau_policy, "tau_advantage": self.tau_advantage, "staleness": self.staleness,
                "seed": self.seeds}

    def run_config(self, base: RunConfig, params: dict[str, Any]) -> RunConfig:
        fields = PARAM_FIELDS if self.schedule == "lag" else {**PARAM_FIELDS, "staleness": "train.eta"}
        overrides = {fields[k]: v for k, v in params.items()}
        return with_overrides(base, {"method.name": self.method, "train.steps": self.steps, **overrides})


def objective_value(summary: dict[str, Any], objective: str, collapse_penalty: float) -> float:
    """final / peak / auc held-out accuracy, minus the penalty when the run collapsed."""
    score = {"final": summary["final_accuracy"], "peak": summary["peak_accuracy"], "auc": summary["auc_accuracy"]}[objective]
    return score - (collapse_penalty if summary["collapsed"] else 0.0)
