"""Actor losses with per-token correction weights (PPO clip, optional dual clip; CISPO) and the clipped value loss."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from copc_core.rl.tensors import LOG_RATIO_CLAMP, check_float_mask, check_same_shape, masked_mean


class ActorLoss(NamedTuple):
    """Scalar loss and its diagnostics (all 0-dim tensors)."""

    loss: Tensor
    clipfrac: Tensor  # fraction of kept tokens where the clip is the active branch


class ValueLoss(NamedTuple):
    loss: Tensor
    clipfrac: Tensor


def ppo_actor_loss(
    logp: Tensor,
    logp_anchor: Tensor,
    advantages: Tensor,
    weight: Tensor,
    keep: Tensor,
    mask: Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None,
    normalise_by_kept: bool,
) -> ActorLoss:
    """Weighted clipped surrogate.

        r_t = exp(clamp(log π_θ − log π_anchor, ±20))
        ℓ_t = −w_t · min(r_t Â_t, clip(r_t, 1−ε_lo, 1+ε_hi) Â_t)
        dual clip (Ye et al. 2020, arXiv 1912.09729): for Â_t < 0, ℓ_t = min(ℓ_t, −w_t · c · Â_t)
        L = Σ_t keep_t ℓ_t / N,  N = Σ mask_t (default) or Σ keep_t (`normalise_by_kept`)

    `weight` and `keep` come from a `PolicyCorrection`; `logp_anchor` is the reading's anchor
    (copc_core.rl.corrections). ε_lo = 1 and ε_hi = ∞ leave the ratio unclipped (clip(r, 0, ∞) = r).
    The log-ratio clamp means a ratio of exp(89) yields a finite loss and zero (not NaN)
    gradient. Schulman et al. 2017, arXiv 1707.06347, eq. 7.

    Shapes: all [B, T]; returns 0-dim tensors.
    """
    check_same_shape(logp=logp, logp_anchor=logp_anchor, advantages=advantages, weight=weight, keep=keep, mask=mask)
    check_float_mask(mask)
    if not (0 <= clip_low <= 1 and clip_high >= 0):
        raise ValueError(f"need 0 <= clip_low <= 1 and clip_high >= 0, got {clip_low}, {clip_high}")
    if dual_clip is not None and not dual_clip > 1:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    # dropped and environment positions may hold anything (-inf included): select, never multiply
    log_r = torch.where(keep > 0, logp - logp_anchor.detach(), torch.zeros_like(logp))
    log_r = torch.clamp(log_r, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_r)
    adv = advantages.detach() * keep
    surrogate = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    per_token = -torch.minimum(surrogate, clipped)
    if dual_clip is not None:
        per_token = torch.where(adv < 0, torch.minimum(per_token, -dual_clip * adv), per_token)
    per_token = per_token * weight.detach()
    denominator = keep.sum() if normalise_by_kept else mask.sum()
    loss = (per_token * keep).sum() / denominator.clamp(min=1)
    with torch.no_grad():
        clipfrac = masked_mean((clipped < surrogate).to(mask.dtype), keep)
    return ActorLoss(loss, clipfrac)


def cispo_actor_loss(
    logp: Tensor,
    logp_anchor: Tensor,
    advantages: Tensor,
    weight: Tensor,
    keep: Tensor,
    mask: Tensor,
    is_clip_low: float,
    is_clip_high: float,
    normalise_by_kept: bool,
) -> ActorLoss:
    """CISPO: the clipped ratio as a detached weight on the REINFORCE term, so no token loses its gradient.

        r_t = exp(clamp(log π_θ − log π_anchor, ±20))
        ℓ_t = −w_t · sg(clip(r_t, 1 − ε_lo, 1 + ε_hi)) · Â_t · log π_θ(y_t)
        L = Σ_t keep_t ℓ_t / N   (N as in `ppo_actor_loss`)

    Its gradient is −w · clip(r) · Â · ∇log π_θ: the PPO gradient where r is inside the band,
    the band's edge times it outside (PPO gives 0 there). MiniMax-M1 (arXiv 2506.13585), eqs. 4–5;
    verl / SkyRL `compute_policy_loss_cispo`.

    Shapes: all [B, T]; returns 0-dim tensors.
    """
    check_same_shape(logp=logp, logp_anchor=logp_anchor, advantages=advantages, weight=weight, keep=keep, mask=mask)
    check_float_mask(mask)
    if not (0 <= is_clip_low <= 1 and is_clip_high >= 0):
        raise ValueError(f"need 0 <= is_clip_low <= 1 and is_clip_high >= 0, got {is_clip_low}, {is_clip_high}")
    kept = keep > 0
    log_r = torch.where(kept, logp - logp_anchor.detach(), torch.zeros_like(logp)).detach()
    ratio = torch.exp(torch.clamp(log_r, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    clipped = torch.clamp(ratio, 1.0 - is_clip_low, 1.0 + is_clip_high)
    safe_logp = torch.where(kept, logp, torch.zeros_like(logp))  # dropped positions may hold -inf
    per_token = -(clipped * advantages.detach() * keep * weight.detach()) * safe_logp
    denominator = keep.sum() if normalise_by_kept else mask.sum()
    loss = (per_token * keep).sum() / denominator.clamp(min=1)
    with torch.no_grad():
        clipfrac = masked_mean((clipped != ratio).to(mask.dtype), keep)
    return ActorLoss(loss, clipfrac)


def clipped_value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, clip: float | None
) -> ValueLoss:
    """L = ½ · mean_t mask_t · max((V − v)², (clip(V, V_old ± ε_v) − v)²); ε_v = None: no clip.

    Targets and old values are detached (no gradient through the critic target).
    Shapes: all [B, T]; returns 0-dim tensors.
    """
    check_same_shape(values=values, old_values=old_values, returns=returns, mask=mask)
    check_float_mask(mask)
    returns = returns.detach() * mask
    values = values * mask
    unclipped = (values - returns).square()
    if clip is None:
        per_token = unclipped
        clipfrac = values.new_zeros(())
    else:
        old = old_values.detach() * mask
        clipped_values = old + torch.clamp(values - old, -clip, clip)
        clipped = (clipped_values - returns).square()
        per_token = torch.maximum(unclipped, clipped)
        with torch.no_grad():
            clipfrac = masked_mean((clipped > unclipped).to(mask.dtype), mask)
    return ValueLoss(0.5 * masked_mean(per_token, mask), clipfrac)
