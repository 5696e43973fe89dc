"""Configuration: a tree of frozen pydantic models, validated once at the edge.

`RunConfig` (added with the training engine) holds a `MethodConfig`; the method registry resolves
it into a `MethodSpec` (copc_core.methods). Sweep overrides build a new config with
`with_overrides`, which re-validates the whole tree (pydantic's `model_copy(update=...)` does not).
"""

from __future__ import annotations

import math
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from copc_core.methods import MethodSpec, method_spec, preset

FROZEN = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="strings")


class MethodConfig(BaseModel):
    """Which method, its two bands, and the options of docs/ALGORITHMS.md §2–3.

    None for an option means "the preset's value". τ may be `inf` (no masking / no clipping).
    """

    model_config = FROZEN

    name: str = "copc"
    tau_policy: float | None = Field(None, ge=1.0, description="policy mask band τ_p ≥ 1 (COPC channel 1)")
    tau_advantage: float | None = Field(None, ge=1.0, description="advantage clip band τ_a ≥ 1 (COPC channel 2)")
    policy_weight: Literal["ratio", "one"] | None = None
    loss_denominator: Literal["all", "kept"] | None = None
    return_target: Literal["traced", "gae"] | None = None
    advantage_clip: Literal["two_sided", "one_sided"] | None = None
    clip_low: float = Field(0.2, ge=0.0, lt=1.0, description="PPO clip ε_lo")
    clip_high: float = Field(0.2, ge=0.0, description="PPO clip ε_hi")
    dual_clip: float | None = Field(None, gt=1.0, description="dual-clip constant c (None: off)")
    value_clip: float | None = Field(0.2, gt=0.0, description="value clip ε_v (None: off)")
    gamma: float = Field(1.0, ge=0.0, le=1.0)
    lam: float = Field(0.95, ge=0.0, le=1.0)
    normalize_advantages: bool = True

    @model_validator(mode="after")
    def _resolvable(self) -> MethodConfig:
        self.spec()  # unknown names, τ for a method without one, dead options: fail here
        return self

    def spec(self) -> MethodSpec:
        policy = {k: v for k, v in (("weight", self.policy_weight), ("loss_denominator", self.loss_denominator))
                  if v is not None}
        advantage = {k: v for k, v in (("return_target", self.return_target), ("clip", self.advantage_clip))
                     if v is not None}
        return method_spec(self.name, self.tau_policy, self.tau_advantage, policy, advantage)

    def resolved_taus(self) -> tuple[float | None, float | None]:
        """(τ_p, τ_a) in effect, None where the method has no such band."""
        row = preset(self.name)
        tp = self.tau_policy if self.tau_policy is not None else row.default_tau_policy
        ta = self.tau_advantage if self.tau_advantage is not None else row.default_tau_advantage
        return tp, ta


M = TypeVar("M", bound=BaseModel)


def with_overrides(config: M, overrides: dict[str, Any]) -> M:
    """A new config with dotted-path overrides (`{"method.tau_policy": 4}`), fully re-validated."""
    data = config.model_dump()
    for dotted, value in overrides.items():
        node = data
        *parents, leaf = dotted.split(".")
        for key in parents:
            if not isinstance(node.get(key), dict):
                raise KeyError(f"no config section {key!r} in {dotted!r}")
            node = node[key]
        if leaf not in node:
            raise KeyError(f"no config field {leaf!r} in {dotted!r}; fields: {', '.join(node)}")
        node[leaf] = value
    return type(config).model_validate(data)


def is_infinite(x: float | None) -> bool:
    return x is not None and math.isinf(x)
