"""The method registry: every method of docs/ALGORITHMS.md §3 is a preset of one learner.

A preset is data: a `PolicySide` (which correction, which band, which anchor for the PPO ratio,
which actor loss, whether the step size follows the ESS) and an `AdvantageSide` (GAE or
clipped-ratio traces). `method_spec` resolves a `MethodConfig` against the table once; the learner
then calls `policy_terms`, `correct_policy`, `actor_loss`, `step_size_scale` and
`estimate_advantages`, which dispatch on the *kind* of each side through small tables. Nothing
outside this module asks which method is running.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal, NamedTuple, TypeVar

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import Tensor

from copc_core.rl.advantages import AdvantageOutput, copc_advantages, gae_advantages, trace_coefficients
from copc_core.rl.corrections import (
    PolicyCorrection,
    anchor_log_prob,
    behavior_log_ratio,
    geometric_band_correction,
    m2po_correction,
    no_correction,
    ratio_band_correction,
    sequence_band_correction,
    sequence_truncated_correction,
    staleness_alpha,
    truncated_ratio_correction,
)
from copc_core.rl.diagnostics import sequence_effective_sample_size
from copc_core.rl.losses import ActorLoss, cispo_actor_loss, ppo_actor_loss

FROZEN = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="strings")

Anchor = Literal["behavior", "recomputed", "interpolated"]


class CorrectionKind(NamedTuple):
    """One kind of policy-side correction, whole: the function that applies it, its rule in words (`copc methods`),
    and the `PolicySide` options that have an effect for it (the others are refused as dead). A new kind is one
    record in `POLICY_KINDS` (and its function in corrections.py)."""

    apply: Callable[[PolicySide, Tensor, Tensor, Tensor], PolicyCorrection]  # (side, log ρ, log ω, mask)
    rule: Callable[[PolicySide], str]
    options: frozenset[str]


_EVERY_KIND = frozenset({"anchor", "alpha", "loss_denominator"})  # options every kind reads
POLICY_KINDS: dict[str, CorrectionKind] = {
    "none": CorrectionKind(lambda s, lr, w, m: no_correction(w, m), lambda p: "no weight", _EVERY_KIND),
    "ratio_band": CorrectionKind(
        lambda s, lr, w, m: ratio_band_correction(lr, m, s.low, s.high, w),
        lambda p: f"ρ ∈ [{p.low:g}, {p.high:g}] ({p.mask_ratio})",
        _EVERY_KIND | {"weight", "mask_ratio"},
    ),
    "truncate": CorrectionKind(
        lambda s, lr, w, m: truncated_ratio_correction(w, m, s.cap), lambda p: f"w = min(ω, {p.cap:g})", _EVERY_KIND
    ),
    "m2po": CorrectionKind(
        lambda s, lr, w, m: m2po_correction(lr, m, s.m2_threshold, w),
        lambda p: f"M2 mask τ = {p.m2_threshold:g}",
        _EVERY_KIND | {"weight"},
    ),
    "seq_truncate": CorrectionKind(
        lambda s, lr, w, m: sequence_truncated_correction(w, m, s.cap),
        lambda p: f"w_i = min(Πω, {p.cap:g})",
        _EVERY_KIND,
    ),
    "seq_band": CorrectionKind(
        lambda s, lr, w, m: sequence_band_correction(lr, m, s.low, s.high, w),
        lambda p: f"Πρ ∈ [{p.low:g}, {p.high:g}]",
        _EVERY_KIND | {"weight"},
    ),
    "geo_band": CorrectionKind(
        lambda s, lr, w, m: geometric_band_correction(lr, m, s.low, s.high),
        lambda p: f"(Πρ)^(1/T) ∈ [{p.low:g}, {p.high:g}]",
        _EVERY_KIND,
    ),
}


class PolicySide(BaseModel):
    """Channel 1: which tokens enter the actor loss, with which weight, against which anchor, by which loss."""

    model_config = FROZEN

    kind: Literal[tuple(POLICY_KINDS)]
    low: float = Field(0.0, ge=0.0)  # ratio_band / seq_band / geo_band: keep iff low ≤ statistic ≤ high
    high: float = Field(math.inf, gt=0.0)
    cap: float = Field(math.inf, gt=0.0)  # truncate / seq_truncate: w = min(ω, cap)
    m2_threshold: float = Field(0.04, gt=0.0)  # m2po: τ_M2
    weight: Literal["ratio", "one"] = "ratio"  # w = ω (π_anchor/μ) on kept tokens, or 1
    anchor: Anchor = "recomputed"  # the PPO ratio's denominator (corrections module docstring)
    alpha: float | None = Field(None, ge=0.0, le=1.0)  # interpolated: α; None = A-3PO's k/(k+1)
    mask_ratio: Literal["old", "live"] = "old"  # ratio_band tests π_old/μ, or π_θ/μ inside the epochs
    loss: Literal["ppo_clip", "unclipped", "cispo"] = "ppo_clip"
    is_clip_low: float = Field(1.0, ge=0.0, le=1.0)  # cispo: clip(r, 1 − ε_lo, 1 + ε_hi)
    is_clip_high: float = Field(4.0, ge=0.0)
    step_size: Literal["fixed", "ess"] = "fixed"  # ess: the policy's lr × √(ESS/N) of the sequence weights
    loss_denominator: Literal["all", "kept"] = "all"  # N = Σ mask, or Σ mask·M

    @model_validator(mode="after")
    def _consistent(self) -> PolicySide:
        if self.alpha is not None and self.anchor != "interpolated":
            raise ValueError(f"alpha only applies to the interpolated anchor, not {self.anchor!r}")
        return self


class AdvantageSide(BaseModel):
    """Channel 2: the advantage estimator and the critic target."""

    model_config = FROZEN

    kind: Literal["gae", "clipped_trace"]
    tau: float = Field(1.0, ge=1.0)  # two-sided: c = clip(ρ, 1/τ, τ); one-sided: c = min(τ, ρ)
    clip: Literal["two_sided", "one_sided"] = "two_sided"
    return_target: Literal["traced", "gae"] = "traced"


class MethodSpec(BaseModel):
    """A resolved method: what the learner runs."""

    model_config = FROZEN

    name: str
    policy: PolicySide
    advantage: AdvantageSide
    on_policy: bool = False  # the method is defined at staleness 0 only (sync PPO)


class Preset(NamedTuple):
    """One registry row. `build(tau_policy, tau_advantage)` gets the resolved bands (or None).

    `source` names the paper and where each default was checked (code or config file of the
    reference implementation), shown by `copc methods`.
    """

    description: str
    source: str
    default_tau_policy: float | None  # None: the method has no τ_p
    default_tau_advantage: float | None  # None: the method has no τ_a
    build: Callable[[float | None, float | None], tuple[PolicySide, AdvantageSide]]
    on_policy: bool = False


# COPC's default reading of the trust region (which policy anchors the PPO ratio; docs/ALGORITHMS.md §2). The rule
# docs/journal/2026-12-05-4-evening.md wrote down before the 5-seed runs chose `interpolated` on seeds 0-4; the
# confirmation on fresh seeds 5-9, also written down before it ran, did not bear it out, and the readings are not
# separated: by the rule's last step the default stays `recomputed`. The others are one option away
# (`method.anchor`, `copc[interpolated]`). The ablations keep it, so that each drops one channel and nothing else.
COPC_READING: Anchor = "recomputed"


def _copc_band(tau: float) -> PolicySide:
    return PolicySide(kind="ratio_band", low=1.0 / tau, high=tau, weight="ratio", anchor=COPC_READING)


_GAE = AdvantageSide(kind="gae")
_NONE = PolicySide(kind="none")

METHODS: dict[str, Preset] = {
    "sync_ppo": Preset(
        "PPO clip on-policy (k = 0)",
        "Schulman et al. 2017 (arXiv 1707.06347)",
        None,
        None,
        lambda tp, ta: (_NONE, _GAE),
        on_policy=True,
    ),
    "async_ppo": Preset(
        "PPO clip with π_old := μ (rollout log-probs as old)",
        "the naive async default; verl fully-async (old_log_prob from the rollout)",
        None,
        None,
        lambda tp, ta: (PolicySide(kind="none", anchor="behavior"), _GAE),
    ),
    "async_ppo_recompute": Preset(
        "PPO clip against recomputed π_old, μ ignored", "uncorrected baseline", None, None, lambda tp, ta: (_NONE, _GAE)
    ),
    "decoupled_ppo": Preset(
        "w = ρ, drop tokens with ρ > 5",
        "AReaL, Fu et al. 2025 (arXiv 2505.24298); cap 5 = AReaL behav_imp_weight_cap",
        None,
        None,
        lambda tp, ta: (PolicySide(kind="ratio_band", low=0.0, high=5.0), _GAE),
    ),
    "tis": Preset(
        "w = min(ρ, 2), detached",
        "Yao et al. 2025 (truncated IS); C = 2 = verl rollout_is_threshold",
        None,
        None,
        lambda tp, ta: (PolicySide(kind="truncate", cap=2.0), _GAE),
    ),
    "icepop": Preset(
        "w = ρ inside [0.5, 5], else 0",
        "IcePop / Ring-1T (arXiv 2510.18855)",
        None,
        None,
        lambda tp, ta: (PolicySide(kind="ratio_band", low=0.5, high=5.0), _GAE),
    ),
    "m2po": Preset(
        "drop largest (log ρ)² until mean < 0.04; w = ρ on kept tokens; no PPO clip",
        "Zheng et al. 2025 (arXiv 2510.01161); AReaL examples/math/gsm8k_m2po.yaml: m2_threshold "
        "0.04, eps_clip 0.0 with one minibatch (the ratio is 1 where the clip would act); this learner "
        "takes several minibatches, so the surrogate runs unclipped",
        None,
        None,
        lambda tp, ta: (PolicySide(kind="m2po", m2_threshold=0.04, loss="unclipped"), _GAE),
    ),
    "vtrace": Preset(
        "w = min(1, ρ); V-trace(λ) traces c = λ·min(1, ρ)",
        "Espeholt et al. 2018 (arXiv 1802.01561)",
        None,
        None,
        lambda tp, ta: (
            PolicySide(kind="truncate", cap=1.0),
            AdvantageSide(kind="clipped_trace", tau=1.0, clip="one_sided"),
        ),
    ),
    "seq_tis": Preset(
        "sequence weight w_i = min(Π_t ρ_t, 2), detached, on every token of sequence i",
        "verl rollout_corr decoupled_seq_is (rollout_is: sequence, threshold 2.0)",
        None,
        None,
        lambda tp, ta: (PolicySide(kind="seq_truncate", cap=2.0), _GAE),
    ),
    "seq_mis": Preset(
        "w_i = Π_t ρ_t · 1[Π_t ρ_t ≤ 2]: sequences over the cap are dropped",
        "verl rollout_corr masked IS (threshold 2.0; its decoupled_seq_is_rs preset also drops Π ρ < 0.5: option low)",
        None,
        None,
        lambda tp, ta: (PolicySide(kind="seq_band", low=0.0, high=2.0), _GAE),
    ),
    "geo_rs": Preset(
        "keep sequence i iff (Π_t ρ_t)^{1/T_i} ∈ [0.999, 1.001]; w = 1",
        "verl rollout_corr decoupled_geo_rs (rollout_rs: seq_mean_k1, threshold 0.999_1.001)",
        None,
        None,
        lambda tp, ta: (PolicySide(kind="geo_band", low=0.999, high=1.001, weight="one"), _GAE),
    ),
    "cispo": Preset(
        "J = sg(clip(r, 0, 5)) · Â · log π_θ with r = π_θ/μ: no token loses its gradient",
        "MiniMax-M1 (arXiv 2506.13585) eqs. 4-5 (r against the sampling policy); bounds "
        "1 − ε_lo = 0, 1 + ε_hi = 5 = SkyRL CISPOConfig (ScaleRL, arXiv 2510.13786)",
        None,
        None,
        lambda tp, ta: (PolicySide(kind="none", anchor="behavior", loss="cispo"), _GAE),
    ),
    "vcpo": Preset(
        "w = ρ, drop ρ > 5 (decoupled), policy lr × √(ESS/N) of the sequence weights Π_t ρ_t",
        "VCPO (arXiv 2602.17616) ESS-guided step scaling, sequence-level ESS as AReaL's port "
        "(areal ess.py); its closed-form baseline is not used: Â comes from the critic",
        None,
        None,
        lambda tp, ta: (PolicySide(kind="ratio_band", low=0.0, high=5.0, step_size="ess"), _GAE),
    ),
    "a3po": Preset(
        "decoupled PPO (w = π_prox/μ, drop ρ > 5) against log π_prox = log μ + α(log π_old − log μ), α = k/(k+1)",
        "A-3PO (arXiv 2512.06547); AReaL prox_logp_method loglinear, α = (v_prox − v_b)/(v_θ − v_b)",
        None,
        None,
        lambda tp, ta: (PolicySide(kind="ratio_band", low=0.0, high=5.0, anchor="interpolated"), _GAE),
    ),
    "copc_policy_only": Preset(
        "COPC channel 1 (ratio band τ_p), GAE", "ablation", 2.0, None, lambda tp, ta: (_copc_band(tp), _GAE)
    ),
    "copc_advantage_only": Preset(
        "w = 1, COPC channel 2 (clipped traces τ_a)",
        "ablation",
        None,
        2.0,
        lambda tp, ta: (PolicySide(kind="none", anchor=COPC_READING), AdvantageSide(kind="clipped_trace", tau=ta)),
    ),
    "copc": Preset(
        "COPC: ratio band τ_p and clipped-ratio traces τ_a",
        "arXiv 2610.09597 (project reading)",
        2.0,
        2.0,
        lambda tp, ta: (_copc_band(tp), AdvantageSide(kind="clipped_trace", tau=ta)),
    ),
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
    for label, given, default in (
        ("tau_policy", tau_policy, row.default_tau_policy),
        ("tau_advantage", tau_advantage, row.default_tau_advantage),
    ):
        if given is not None and default is None:
            raise ValueError(
                f"method {name!r} has no {label}; methods with one: "
                f"{', '.join(n for n, p in METHODS.items() if has_band(p, label))}"
            )
    tp = tau_policy if tau_policy is not None else row.default_tau_policy
    ta = tau_advantage if tau_advantage is not None else row.default_tau_advantage
    policy, advantage = row.build(tp, ta)
    policy = _override(name, policy, policy_overrides or {}, _POLICY_OPTIONS)
    advantage = _override(name, advantage, advantage_overrides or {}, _ADVANTAGE_OPTIONS)
    return MethodSpec(name=name, policy=policy, advantage=advantage, on_policy=row.on_policy)


def has_band(row: Preset, label: str) -> bool:
    """Whether the registry row has the band `label` (tau_policy | tau_advantage)."""
    return (row.default_tau_policy if label == "tau_policy" else row.default_tau_advantage) is not None


# Which option may be overridden for which kind of side (the others would be silently dead).
_POLICY_OPTIONS = {
    option: {kind for kind, record in POLICY_KINDS.items() if option in record.options}
    for option in ("weight", "anchor", "alpha", "mask_ratio", "loss_denominator")
}
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


def describe(spec: MethodSpec) -> str:
    """One line of what a resolved method runs: anchor, correction, loss, step size, estimator."""
    p, a = spec.policy, spec.advantage
    anchor = (
        p.anchor
        if p.anchor != "interpolated"
        else (f"interpolated (α = {p.alpha:g})" if p.alpha is not None else "interpolated (α = k/(k+1))")
    )
    kind = POLICY_KINDS[p.kind]
    rule = kind.rule(p)
    weight = f", w = {'ω' if p.weight == 'ratio' else '1'}" if "weight" in kind.options else ""
    loss = p.loss if p.loss != "cispo" else f"cispo [{1 - p.is_clip_low:g}, {1 + p.is_clip_high:g}]"
    advantage = (
        "GAE"
        if a.kind == "gae"
        else (
            f"traces c = clip(ρ, 1/{a.tau:g}, {a.tau:g})" if a.clip == "two_sided" else f"traces c = min({a.tau:g}, ρ)"
        )
    )
    step = ", lr × √(ESS/N)" if p.step_size == "ess" else ""
    return f"anchor {anchor}; {rule}{weight}; loss {loss}{step}; {advantage}"


# ---- dispatch on the kind of each side (data, not method names) ----


def correct_policy(side: PolicySide, log_ratio: Tensor, weight_log_ratio: Tensor, mask: Tensor) -> PolicyCorrection:
    """Channel 1 of `side`: the statistic log ρ decides what is kept, log ω = log π_anchor − log μ the weight.

    `weight: "one"` replaces ω by 1. Shapes: [B, T].
    """
    weight = weight_log_ratio if side.weight == "ratio" else torch.zeros_like(weight_log_ratio)
    return POLICY_KINDS[side.kind].apply(side, log_ratio, weight, mask)


class PolicyTerms(NamedTuple):
    """What channel 1 needs for one step, all [B, T] (detached)."""

    log_ratio: Tensor  # log ρ = clamp(log π_old − log μ), 0 at environment tokens
    anchor: Tensor  # log π_anchor, the PPO ratio's denominator
    weight_log_ratio: Tensor  # log ω = clamp(log π_anchor − log μ), 0 at environment tokens
    correction: PolicyCorrection  # from the statistic log ρ (mask_ratio "old")


def anchor_alpha(side: PolicySide, lag: Tensor) -> Tensor | float:
    """α of log π_anchor = log μ + α (log π_old − log μ): 0 (behavior), 1 (recomputed), or the
    interpolation weight (a fixed α, or A-3PO's k/(k+1) from each token's lag). Shapes: lag [B, T]."""
    if side.anchor == "behavior":
        return 0.0
    if side.anchor == "recomputed":
        return 1.0
    return side.alpha if side.alpha is not None else staleness_alpha(lag)


def policy_terms(side: PolicySide, logp_old: Tensor, logp_behavior: Tensor, mask: Tensor, lag: Tensor) -> PolicyTerms:
    """The anchor, the two log-ratios and the correction of one step. `lag` is each token's
    staleness in versions (learner version − sampling version). Shapes: [B, T]."""
    log_ratio = behavior_log_ratio(logp_old, logp_behavior, mask)
    anchor = anchor_log_prob(logp_old, logp_behavior, anchor_alpha(side, lag))
    weight_log_ratio = behavior_log_ratio(anchor, logp_behavior, mask)
    return PolicyTerms(log_ratio, anchor, weight_log_ratio, correct_policy(side, log_ratio, weight_log_ratio, mask))


def actor_loss(
    side: PolicySide,
    logp: Tensor,
    anchor: Tensor,
    advantages: Tensor,
    correction: PolicyCorrection,
    mask: Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None,
) -> ActorLoss:
    """The side's actor loss on one minibatch: PPO clip (ε from the method config), unclipped, or CISPO.

    Shapes: [b, T] tensors; returns 0-dim tensors.
    """
    by_kept = side.loss_denominator == "kept"
    if side.loss == "cispo":
        return cispo_actor_loss(
            logp,
            anchor,
            advantages,
            correction.weight,
            correction.keep,
            mask,
            side.is_clip_low,
            side.is_clip_high,
            by_kept,
        )
    if side.loss == "unclipped":
        clip_low, clip_high, dual_clip = 1.0, math.inf, None  # clip(r, 0, ∞) = r
    return ppo_actor_loss(
        logp, anchor, advantages, correction.weight, correction.keep, mask, clip_low, clip_high, dual_clip, by_kept
    )


def step_size_scale(side: PolicySide, log_ratio: Tensor, mask: Tensor) -> Tensor:
    """Multiplier of the policy's learning rate for this step: 1, or √(ESS/N) of the sequence-level
    weights Π_t ρ_t (VCPO, arXiv 2602.17616: the square-root rule for Adam-type optimisers).
    Shapes: [B, T] → 0-dim, in (0, 1]."""
    if side.step_size == "fixed":
        return log_ratio.new_ones(())
    return torch.sqrt(sequence_effective_sample_size(log_ratio, mask))


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
    """Channel 2 of `side`: advantages, critic targets and the trace used. Shapes: [B, T].

    Runs the named estimators the tests check (`gae_advantages`, `copc_advantages`); the trace is
    recomputed beside them for the diagnostics (an elementwise clip)."""
    if side.kind == "gae":
        return AdvantageEstimate(gae_advantages(rewards, values, mask, gamma, lam, bootstrap_value), None)
    one_sided = side.clip == "one_sided"
    output = copc_advantages(
        rewards,
        values,
        mask,
        log_ratio,
        gamma,
        lam,
        side.tau,
        one_sided,
        side.return_target == "traced",
        bootstrap_value,
    )
    return AdvantageEstimate(output, trace_coefficients(log_ratio, side.tau, one_sided))
