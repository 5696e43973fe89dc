"""Policy-side off-policy corrections: the PPO ratio's anchor, per-token weights w_t and keep-masks M_t.

Three log-probabilities meet here (docs/ALGORITHMS.md §1): log μ (the rollout engine's), log π_old
(the learner's recompute at the start of the step) and log π_θ (inside the epochs). The anchor of
the PPO ratio r = π_θ / π_anchor is one of three readings (docs/ALGORITHMS.md §2):

    behavior      π_anchor = μ                       (the IS weight sits inside r)
    recomputed    π_anchor = π_old                   (decoupled PPO)
    interpolated  log π_anchor = log μ + α (log π_old − log μ)   (A-3PO)

Every correction is a pure function of two clamped log-ratios over the policy tokens:

    log ρ_t       = log π_old − log μ        the *statistic* masks and sequence rules test
    log ω_t       = log π_anchor − log μ     the *weight* w_t is built from (α · log ρ)

so that one rule serves the three readings: with the behavior anchor ω ≡ 1 (w = 1 on kept tokens),
with the recomputed one ω = ρ. Each returns a `PolicyCorrection`; the actor loss then reads

    L_actor = −(1/N) Σ_t mask_t · M_t · w_t · ℓ_t(r_t, Â_t)

Weights are constants of the loss: they are computed from log-probs that carry no gradient, and are
detached here as well so that a caller cannot leak one in. Sequence-level rules work on Σ_t log ρ_t
over the policy tokens of each sequence (environment tokens are not actions), in float64 and in log
space: a product of 30 ratios overflows float32.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from copc_core.rl.tensors import LOG_RATIO_CLAMP, check_float_mask, check_same_shape


class PolicyCorrection(NamedTuple):
    """Weights and masks of one correction, all [B, T].

    weight: w_t (0 where dropped or not a policy token); keep: M_t·mask_t as 0/1 floats;
    dropped_low / dropped_high: policy tokens dropped for a ratio below / above the band.
    """

    weight: Tensor
    keep: Tensor
    dropped_low: Tensor
    dropped_high: Tensor


def behavior_log_ratio(logp_old: Tensor, logp_behavior: Tensor, mask: Tensor) -> Tensor:
    """log ρ_t = clamp(log π_old − log μ, ±20), 0 at environment tokens.

    The clamp keeps exp(log ρ) finite (exp(20) ≈ 4.9e8) whatever the engines report.
    Shapes: [B, T] → [B, T].
    """
    check_same_shape(logp_old=logp_old, logp_behavior=logp_behavior, mask=mask)
    check_float_mask(mask)
    log_ratio = torch.clamp(logp_old - logp_behavior, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return (log_ratio * mask).detach()


def anchor_log_prob(logp_old: Tensor, logp_behavior: Tensor, alpha: Tensor | float) -> Tensor:
    """log π_anchor = log μ + α (log π_old − log μ): α = 0 is μ, α = 1 is π_old, both exactly.

    A-3PO (Li, Wu, Shen 2025, arXiv 2512.06547; AReaL `prox_logp_method: loglinear`) interpolates
    between μ and the policy being trained; here the end point is π_old, the learner's recompute
    at the start of the step (which the learner has anyway: the same pass gives V).
    Shapes: [B, T] (α a float or [B, T]) → [B, T], detached.
    """
    check_same_shape(logp_old=logp_old, logp_behavior=logp_behavior)
    dtype = torch.promote_types(logp_old.dtype, logp_behavior.dtype)
    alpha = torch.as_tensor(alpha, dtype=dtype, device=logp_old.device)
    if not bool(((alpha >= 0) & (alpha <= 1)).all()):
        raise ValueError("alpha must lie in [0, 1]")
    # lerp is exact at α = 0 and α = 1
    return torch.lerp(logp_behavior.to(dtype), logp_old.to(dtype), alpha).detach()


def staleness_alpha(lag: Tensor) -> Tensor:
    """A-3PO's interpolation weight from each token's lag k = v − v_b (in versions): α = k / (k + 1).

    AReaL sets α = (v_prox − v_b) / (v_θ − v_b) with v_prox = v (the policy at the start of the
    step) and v_θ = v + 1 (the one being trained), which is k / (k + 1); α = 0 at k = 0, where
    μ = π_old and every anchor coincides. Shapes: [B, T] (integer or float) → [B, T] float.
    """
    lag = lag.to(torch.get_default_dtype()).clamp(min=0)
    return lag / (lag + 1.0)


def no_correction(weight_log_ratio: Tensor, mask: Tensor) -> PolicyCorrection:
    """w ≡ 1, nothing dropped (plain PPO, whatever the anchor). Shapes: [B, T]."""
    check_same_shape(weight_log_ratio=weight_log_ratio, mask=mask)
    none = torch.zeros_like(mask)
    return PolicyCorrection(mask.clone(), mask.clone(), none, none.clone())


def _band_edges(low: float, high: float) -> tuple[float, float]:
    if not (0.0 <= low <= high):
        raise ValueError(f"need 0 <= low <= high, got low={low}, high={high}")
    return (math.log(low) if low > 0 else -math.inf), (math.log(high) if math.isfinite(high) else math.inf)


def _kept(keep_low: Tensor, keep_high: Tensor, mask: Tensor, weight_log_ratio: Tensor) -> PolicyCorrection:
    """The record from per-token "below the band" / "above the band" flags and the weight's log-ratio."""
    dropped_low = (keep_low.to(mask.dtype) * mask).detach()
    dropped_high = (keep_high.to(mask.dtype) * mask).detach()
    keep = mask - dropped_low - dropped_high
    weight = keep * torch.exp(weight_log_ratio).detach()
    return PolicyCorrection(weight, keep, dropped_low, dropped_high)


def ratio_band_correction(
    log_ratio: Tensor, mask: Tensor, low: float, high: float, weight_log_ratio: Tensor
) -> PolicyCorrection:
    """Keep a token iff low ≤ ρ_t ≤ high; inside the band w = ω_t (ρ with the recomputed anchor).

        M_t = 1[low ≤ ρ_t ≤ high],   w_t = ω_t · M_t

    COPC channel 1 is the band [1/τ_p, τ_p] (τ_p = ∞ masks nothing); decoupled PPO (AReaL, Fu et
    al. 2025, arXiv 2505.24298) is [0, cap]; IcePop (arXiv 2510.18855) is [α, β]. Pass
    `weight_log_ratio = 0` for w = 1 on kept tokens.

    Shapes: [B, T]. Comparisons are made in log space, so band edges are exact.
    """
    check_same_shape(log_ratio=log_ratio, mask=mask, weight_log_ratio=weight_log_ratio)
    log_low, log_high = _band_edges(low, high)
    return _kept(log_ratio < log_low, log_ratio > log_high, mask, weight_log_ratio)


def truncated_ratio_correction(weight_log_ratio: Tensor, mask: Tensor, cap: float) -> PolicyCorrection:
    """w_t = min(ω_t, cap), detached, nothing dropped.

    Truncated importance sampling (Yao et al. 2025, "Your efficient RL framework secretly brings
    you off-policy RL training", TIS) and V-trace's policy-gradient weight min(ρ̄, ρ) (Espeholt
    et al. 2018, arXiv 1802.01561, eq. 4).

    Shapes: [B, T] → record of [B, T].
    """
    check_same_shape(weight_log_ratio=weight_log_ratio, mask=mask)
    if not cap > 0:
        raise ValueError(f"cap must be > 0, got {cap}")
    log_cap = min(math.log(cap), LOG_RATIO_CLAMP)
    weight = torch.exp(torch.clamp(weight_log_ratio, max=log_cap)).detach() * mask
    none = torch.zeros_like(mask)
    return PolicyCorrection(weight, mask.clone(), none, none.clone())


def m2po_correction(log_ratio: Tensor, mask: Tensor, m2_threshold: float, weight_log_ratio: Tensor) -> PolicyCorrection:
    """Second-moment trust region: drop the tokens with the largest (log ρ)² until the mean of
    (log ρ)² over the remaining policy tokens of the batch is below τ_M2; w = ω on kept tokens.

        k* = min{k : Σ_{i>k} s_(i) / (N − k) < τ_M2},  s_(1) ≥ s_(2) ≥ … the sorted (log ρ)²

    The tokens of rank ≤ k* are dropped (ties broken by position). A dropped token counts as
    "high" when ρ > 1 and "low" otherwise. Zheng et al. 2025, "Prosperity before Collapse"
    (M2PO), arXiv 2510.01161.

    Shapes: [B, T] → record of [B, T].
    """
    check_same_shape(log_ratio=log_ratio, mask=mask, weight_log_ratio=weight_log_ratio)
    if not m2_threshold > 0:
        raise ValueError(f"m2_threshold must be > 0, got {m2_threshold}")
    flat_mask = mask.reshape(-1)
    second = (log_ratio.square() * mask).reshape(-1)
    # Sort policy tokens first by (log ρ)², environment tokens last (score −1).
    score = torch.where(flat_mask > 0, second, second.new_full((), -1.0))
    order = torch.argsort(score, descending=True, stable=True)
    sorted_second = second[order]
    n = flat_mask.sum()
    removed = torch.cat([sorted_second.new_zeros(1), torch.cumsum(sorted_second, 0)])  # Σ of top-k
    k = torch.arange(removed.numel(), device=mask.device, dtype=mask.dtype)
    remaining = (n - k).clamp(min=1)
    ok = ((second.sum() - removed) / remaining < m2_threshold) | (k >= n)
    k_star = torch.argmax(ok.to(torch.int8))  # first k at which the remaining moment is small
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=mask.device)
    dropped = (rank < k_star).reshape(mask.shape)
    return _kept(dropped & (log_ratio <= 0), dropped & (log_ratio > 0), mask, weight_log_ratio)


def sequence_log_ratio(log_ratio: Tensor, mask: Tensor) -> Tensor:
    """log Π_t ρ_t over the policy tokens of each sequence, in float64. Shapes: [B, T] → [B]."""
    check_same_shape(log_ratio=log_ratio, mask=mask)
    return (log_ratio.double() * mask.double()).sum(dim=1)


def sequence_truncated_correction(weight_log_ratio: Tensor, mask: Tensor, cap: float) -> PolicyCorrection:
    """Sequence-level truncated IS: w_i = min(Π_t ω_{i,t}, cap), detached, on every policy token of i.

    verl `rollout_corr` (`rollout_is: sequence`, `rollout_is_threshold` 2.0 by default; the
    `decoupled_seq_is` preset). The product is formed in log space; an infinite cap still clamps
    log w at +20 (the token-level clamp). Shapes: [B, T] → record of [B, T].
    """
    check_same_shape(weight_log_ratio=weight_log_ratio, mask=mask)
    if not cap > 0:
        raise ValueError(f"cap must be > 0, got {cap}")
    log_w = torch.clamp(sequence_log_ratio(weight_log_ratio, mask), max=min(math.log(cap), LOG_RATIO_CLAMP))
    weight = torch.exp(log_w).to(mask.dtype)[:, None] * mask
    none = torch.zeros_like(mask)
    return PolicyCorrection(weight.detach(), mask.clone(), none, none.clone())


def sequence_band_correction(
    log_ratio: Tensor, mask: Tensor, low: float, high: float, weight_log_ratio: Tensor
) -> PolicyCorrection:
    """Sequence-level masked IS: keep sequence i iff low ≤ Π_t ρ_{i,t} ≤ high; w_i = Π_t ω_{i,t} on kept ones.

        w_i = Π_t ρ_t · 1[Π_t ρ_t ≤ C]        (low = 0, high = C; C = ∞ is plain sequence IS)

    verl `rollout_corr` masked IS ("seq-MIS"; the `decoupled_seq_is_rs` preset also rejects below
    0.5, here the option `low`). Every policy token of a dropped sequence counts as dropped; log w
    is clamped at +20 (only an infinite cap can reach it).
    Shapes: [B, T] → record of [B, T].
    """
    check_same_shape(log_ratio=log_ratio, mask=mask, weight_log_ratio=weight_log_ratio)
    log_low, log_high = _band_edges(low, high)
    seq = sequence_log_ratio(log_ratio, mask)[:, None]
    log_w = torch.clamp(sequence_log_ratio(weight_log_ratio, mask), max=LOG_RATIO_CLAMP)  # C = ∞: the token clamp
    log_w = log_w[:, None].to(mask.dtype).expand_as(mask)
    return _kept((seq < log_low).expand_as(mask), (seq > log_high).expand_as(mask), mask, log_w)


def geometric_band_correction(log_ratio: Tensor, mask: Tensor, low: float, high: float) -> PolicyCorrection:
    """Geometric-mean rejection: keep sequence i iff (Π_t ρ_{i,t})^{1/T_i} ∈ [low, high]; w = 1.

    T_i counts the policy tokens of sequence i. verl `rollout_corr` `rollout_rs: seq_mean_k1`
    (the `decoupled_geo_rs` preset, threshold "0.999_1.001"). Shapes: [B, T] → record of [B, T].
    """
    check_same_shape(log_ratio=log_ratio, mask=mask)
    log_low, log_high = _band_edges(low, high)
    mean = (sequence_log_ratio(log_ratio, mask) / mask.double().sum(dim=1).clamp(min=1))[:, None]
    return _kept((mean < log_low).expand_as(mask), (mean > log_high).expand_as(mask), mask, torch.zeros_like(mask))
