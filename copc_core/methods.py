"""The method registry: every method of docs/ALGORITHMS.md §3 is a preset of one learner.

A preset is data: a `PolicySide` (which correction, which band, which anchor for the PPO ratio) and
an `AdvantageSide` (GAE or clipped-ratio traces). `method_spec` resolves a `MethodConfig` against
the table once; the learner then calls `correct_policy` and `estimate_advantages`, which dispatch
on the *kind* of each side through two small tables. Nothing outside this module asks which
method is running.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal, NamedTuple, TypeVar

from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor

from copc_core.advantages import AdvantageOutput, trace_coefficients, traced_advantages
from copc_core.corrections import (
    PolicyCorrection,
    m2po_correction,
    no_correction,
    ratio_band_correction,
    truncated_ratio_correction,
)

_FROZEN = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="strings")


class PolicySide(BaseModel):
    """Channel 1: which tokens enter the actor loss and with which weight."""

    model_config = _FROZEN

    kind: Literal["none", "ratio_band", "truncate", "m2po"]
    low: float = Field(0.0, ge=0.0)  # ratio_band: keep iff low ≤ ρ ≤ high
    high: float = Field(math.inf, gt=0.0)
    cap: float = Field(math.inf, gt=0.0)  # truncate: w = min(ρ, cap)
    m2_threshold: float = Field(0.04, gt=0.0)  # m2po: τ_M2
    weight: Literal["ratio", "one"] = "ratio"  # ratio_band / m2po: w = ρ inside the band, or 1
    anchor: Literal["recomputed", "behavior"] = "recomputed"  # π_old of the PPO ratio: learner or μ
    loss_denominator: Literal["all", "kept"] = "all"  # N = Σ mask, or Σ mask·M


class AdvantageSide(BaseModel):
    """Channel 2: the advantage estimator and the critic target."""

    model_config = _FROZEN

    kind: Literal["gae", "clipped_trace"]
    tau: float = Field(1.0, ge=1.0)  # two-sided: c = clip(ρ, 1/τ, τ); one-sided: c = min(τ, ρ)
    clip: Literal["two_sided", "one_sided"] = "two_sided"
    return_target: Literal["traced", "gae"] = "traced"


class MethodSpec(BaseModel):
    """A resolved method: what the learner runs."""

    model_config = _FROZEN

    name: str
    policy: PolicySide
    advantage: AdvantageSide
    on_policy: bool = False  # the method is defined at staleness 0 only (sync PPO)


class Preset(NamedTuple):
    """One registry row. `build(tau_policy, tau_advantage)` gets the resolved bands (or None)."""

    description: str
    source: str
    default_tau_policy: float | None  # None: the method has no τ_p
    default_tau_advantage: float | None  # None: the method has no τ_a
    build: Callable[[float | None, float | None], tuple[PolicySide, AdvantageSide]]
    on_policy: bool = False


def _band(tau: float) -> PolicySide:
    return PolicySide(kind="ratio_band", low=1.0 / tau, high=tau, weight="ratio")


_GAE = AdvantageSide(kind="gae")

METHODS: dict[str, Preset] = {
    "sync_ppo": Preset("PPO clip on-policy (k = 0)", "Schulman et al. 2017", None, None,
                       lambda tp, ta: (PolicySide(kind="none"), _GAE), on_policy=True),
    "async_ppo": Preset("PPO clip with π_old := μ (rollout log-probs as old)", "naive async default", None, None,
                        lambda tp, ta: (PolicySide(kind="none", anchor="behavior"), _GAE)),
    "async_ppo_recompute": Preset("PPO clip against recomputed π_old, μ ignored", "", None, None,
                                  lambda tp, ta: (PolicySide(kind="none"), _GAE)),
    "decoupled_ppo": Preset("w = ρ, drop tokens with ρ > 5", "AReaL, Fu et al. 2025 (arXiv 2505.24298)", None, None,
                            lambda tp, ta: (PolicySide(kind="ratio_band", low=0.0, high=5.0), _GAE)),
    "tis": Preset("w = min(ρ, 2), detached", "Yao et al. 2025 (truncated IS)", None, None,
                  lambda tp, ta: (PolicySide(kind="truncate", cap=2.0), _GAE)),
    "icepop": Preset("w = ρ inside [0.5, 5], else 0", "IcePop / Ring-1T (arXiv 2510.18855)", None, None,
                     lambda tp, ta: (PolicySide(kind="ratio_band", low=0.5, high=5.0), _GAE)),
    "m2po": Preset("drop largest (log ρ)² until mean < 0.04; w = ρ on kept tokens",
                   "Zheng et al. 2025 (arXiv 2510.01161)", None, None,
                   lambda tp, ta: (PolicySide(kind="m2po", m2_threshold=0.04), _GAE)),
    "vtrace": Preset("w = min(1, ρ); V-trace(λ) traces c = λ·min(1, ρ)", "Espeholt et al. 2018 (arXiv 1802.01561)",
                     None, None,
                     lambda tp, ta: (PolicySide(kind="truncate", cap=1.0),
                                     AdvantageSide(kind="clipped_trace", tau=1.0, clip="one_sided"))),
    "copc_policy_only": Preset("COPC channel 1 (ratio band τ_p), GAE", "ablation", 2.0, None,
                               lambda tp, ta: (_band(tp), _GAE)),
    "copc_advantage_only": Preset("w = 1, COPC channel 2 (clipped traces τ_a)", "ablation", None, 2.0,
                                  lambda tp, ta: (PolicySide(kind="none"), AdvantageSide(kind="clipped_trace", tau=ta))),
    "copc": Preset("COPC: ratio band τ_p and clipped-ratio traces τ_a", "arXiv 2610.09597 (project reading)", 2.0, 2.0,
                   lambda tp, ta: (_band(tp), AdvantageSide(kind="clipped_trace", tau=ta))),
}


class UnknownMethodError(ValueError):
    """Raised for a method name that is not in the registry; lists the valid names."""


def method_names() -> list[str]:
    return list(METHODS)


def preset(name: str) -> Preset:
    try:
        return METHODS[name]
    except KeyError:
        raise UnknownMethodError(f"unknown method {name!r}; valid methods: {', '.join(METHODS)}") from None


def method_spec(
    name: str,
    tau_policy: float | None = None,
    tau_advantage: float | None = None,
    policy_overrides: dict[str, object] | None = None,
    advantage_overrides: dict[str, object] | None = None,
) -> MethodSpec:
    """Resolve a registry row with its bands and option overrides, validating the result in full.

    A τ given to a method that has none, or an option that the method's sides do not read, is an
    error rather than silently ignored.
    """
    row = preset(name)
    for label, given, default in (("tau_policy", tau_policy, row.default_tau_policy),
                                  ("tau_advantage", tau_advantage, row.default_tau_advantage)):
        if given is not None and default is None:
            raise ValueError(f"method {name!r} has no {label}; methods with one: "
                             f"{', '.join(n for n, p in METHODS.items() if _has(p, label))}")
    tp = tau_policy if tau_policy is not None else row.default_tau_policy
    ta = tau_advantage if tau_advantage is not None else row.default_tau_advantage
    policy, advantage = row.build(tp, ta)
    policy = _override(name, policy, policy_overrides or {}, _POLICY_OPTIONS)
    advantage = _override(name, advantage, advantage_overrides or {}, _ADVANTAGE_OPTIONS)
    return MethodSpec(name=name, policy=policy, advantage=advantage, on_policy=row.on_policy)


def _has(row: Preset, label: str) -> bool:
    return (row.default_tau_policy if label == "tau_policy" else row.default_tau_advantage) is not None


# Which option may be overridden for which kind of side (the others would be silently dead).
_POLICY_OPTIONS = {"weight": {"ratio_band", "m2po"}, "loss_denominator": {"none", "ratio_band", "truncate", "m2po"}}
_ADVANTAGE_OPTIONS = {"return_target": {"clipped_trace"}, "clip": {"clipped_trace"}}


_Side = TypeVar("_Side", PolicySide, AdvantageSide)


def _override(name: str, side: _Side, overrides: dict[str, object], allowed: dict[str, set[str]]) -> _Side:
    for key in overrides:
        if key not in allowed:
            raise ValueError(f"unknown option {key!r}; options: {', '.join(allowed)}")
        if side.kind not in allowed[key]:
            raise ValueError(f"option {key!r} has no effect for method {name!r} ({side.kind} side)")
    if not overrides:
        return side
    return type(side).model_validate({**side.model_dump(), **overrides})


# ---- dispatch on the kind of each side (data, not method names) ----

_POLICY_CORRECTIONS: dict[str, Callable[[PolicySide, Tensor, Tensor], PolicyCorrection]] = {
    "none": lambda s, log_ratio, mask: no_correction(log_ratio, mask),
    "ratio_band": lambda s, log_ratio, mask: ratio_band_correction(log_ratio, mask, s.low, s.high, s.weight == "ratio"),
    "truncate": lambda s, log_ratio, mask: truncated_ratio_correction(log_ratio, mask, s.cap),
    "m2po": lambda s, log_ratio, mask: m2po_correction(log_ratio, mask, s.m2_threshold, s.weight == "ratio"),
}


def correct_policy(side: PolicySide, log_ratio: Tensor, mask: Tensor) -> PolicyCorrection:
    """Channel 1 of `side` applied to log ρ = log π_old − log μ. Shapes: [B, T]."""
    return _POLICY_CORRECTIONS[side.kind](side, log_ratio, mask)


class AdvantageEstimate(NamedTuple):
    output: AdvantageOutput
    trace: Tensor | None  # c_t, or None for GAE (c ≡ 1)


def estimate_advantages(
    side: AdvantageSide,
    rewards: Tensor,
    values: Tensor,
    mask: Tensor,
    log_ratio: Tensor,
    gamma: float,
    lam: float,
    bootstrap_value: Tensor | None = None,
) -> AdvantageEstimate:
    """Channel 2 of `side`: advantages, critic targets and the trace used. Shapes: [B, T]."""
    if side.kind == "gae":
        return AdvantageEstimate(traced_advantages(rewards, values, mask, None, gamma, lam, bootstrap_value), None)
    trace = trace_coefficients(log_ratio, side.tau, side.clip == "one_sided")
    output = traced_advantages(rewards, values, mask, trace, gamma, lam, bootstrap_value, side.return_target == "traced")
    return AdvantageEstimate(output, trace)
