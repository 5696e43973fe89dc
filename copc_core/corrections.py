"""Policy-side off-policy corrections: per-token weights w_t and keep-masks M_t.

Every correction is a pure function of the clamped behavior log-ratio log ρ_t = log π_old − log μ
and the policy-token mask, returning a `PolicyCorrection` record. The actor loss then reads

    L_actor = −(1/N) Σ_t mask_t · M_t · w_t · min(r_t Â_t, clip(r_t, 1−ε_lo, 1+ε_hi) Â_t)

(docs/ALGORITHMS.md §2). Weights are constants of the loss: they are computed from log-probs that
carry no gradient, and are detached here as well so that a caller cannot leak one in.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from copc_core.advantages import LOG_RATIO_CLAMP
from copc_core.tensors import check_float_mask, check_same_shape


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


def no_correction(log_ratio: Tensor, mask: Tensor) -> PolicyCorrection:
    """w ≡ 1, nothing dropped (plain PPO). Shapes: [B, T]."""
    check_same_shape(log_ratio=log_ratio, mask=mask)
    none = torch.zeros_like(mask)
    return PolicyCorrection(mask.clone(), mask.clone(), none, none.clone())


def ratio_band_correction(
    log_ratio: Tensor, mask: Tensor, low: float, high: float, weight_by_ratio: bool
) -> PolicyCorrection:
    """Keep a token iff low ≤ ρ_t ≤ high; inside the band w = ρ (or 1).

        M_t = 1[low ≤ ρ_t ≤ high],   w_t = ρ_t · M_t   (weight_by_ratio)   or   M_t

    COPC channel 1 is the band [1/τ_p, τ_p] (τ_p = ∞ masks nothing); decoupled PPO (AReaL, Fu et
    al. 2025, arXiv 2505.24298) is [0, cap]; IcePop (arXiv 2510.18855) is [α, β].

    Shapes: log_ratio, mask: [B, T]. Comparisons are made in log space, so band edges are exact.
    """
    check_same_shape(log_ratio=log_ratio, mask=mask)
    if not (0.0 <= low <= high):
        raise ValueError(f"need 0 <= low <= high, got low={low}, high={high}")
    log_low = math.log(low) if low > 0 else -math.inf
    log_high = math.log(high) if math.isfinite(high) else math.inf
    dropped_low = ((log_ratio < log_low).to(mask.dtype) * mask).detach()
    dropped_high = ((log_ratio > log_high).to(mask.dtype) * mask).detach()
    keep = mask - dropped_low - dropped_high
    weight = keep * torch.exp(log_ratio).detach() if weight_by_ratio else keep.clone()
    return PolicyCorrection(weight, keep, dropped_low, dropped_high)


def truncated_ratio_correction(log_ratio: Tensor, mask: Tensor, cap: float) -> PolicyCorrection:
    """w_t = min(ρ_t, cap), detached, nothing dropped.

    Truncated importance sampling (Yao et al. 2025, "Your efficient RL framework secretly brings
    you off-policy RL training", TIS) and V-trace's policy-gradient weight min(ρ̄, ρ) (Espeholt
    et al. 2018, arXiv 1802.01561, eq. 4).

    Shapes: [B, T] → record of [B, T].
    """
    check_same_shape(log_ratio=log_ratio, mask=mask)
    if not cap > 0:
        raise ValueError(f"cap must be > 0, got {cap}")
    log_cap = min(math.log(cap), LOG_RATIO_CLAMP)
    weight = torch.exp(torch.clamp(log_ratio, max=log_cap)).detach() * mask
    none = torch.zeros_like(mask)
    return PolicyCorrection(weight, mask.clone(), none, none.clone())


def m2po_correction(log_ratio: Tensor, mask: Tensor, m2_threshold: float, weight_by_ratio: bool) -> PolicyCorrection:
    """Second-moment trust region: drop the tokens with the largest (log ρ)² until the mean of
    (log ρ)² over the remaining policy tokens of the batch is below τ_M2.

        k* = min{k : Σ_{i>k} s_(i) / (N − k) < τ_M2},  s_(1) ≥ s_(2) ≥ … the sorted (log ρ)²

    The tokens of rank ≤ k* are dropped (ties broken by position). A dropped token counts as
    "high" when ρ > 1 and "low" otherwise. Zheng et al. 2025, "Prosperity before Collapse"
    (M2PO), arXiv 2510.01161.

    Shapes: [B, T] → record of [B, T].
    """
    check_same_shape(log_ratio=log_ratio, mask=mask)
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
    dropped = ((rank < k_star).to(mask.dtype) * flat_mask).reshape(mask.shape).detach()
    high = (log_ratio > 0).to(mask.dtype)
    dropped_high = dropped * high
    dropped_low = dropped - dropped_high
    keep = mask - dropped
    weight = keep * torch.exp(log_ratio).detach() if weight_by_ratio else keep.clone()
    return PolicyCorrection(weight, keep, dropped_low, dropped_high)
