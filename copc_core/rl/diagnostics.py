"""Off-policy diagnostics of docs/ALGORITHMS.md §5, as pure functions returning 0-dim tensors.

Keys follow the `group/name` convention; the learner turns the tensors into floats once per step.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from copc_core.rl.corrections import PolicyCorrection
from copc_core.rl.tensors import check_float_mask, check_same_shape, masked_mean


def effective_sample_size(weight: Tensor, mask: Tensor) -> Tensor:
    """Normalised ESS = (Σ w)² / (N Σ w²) over policy tokens, in (0, 1]; 1 for uniform weights.

    Kong 1992; Owen 2013, "Monte Carlo theory, methods and examples", §9.3. Summed in float64: near-uniform
    float32 weights (a step on policy, ρ = 1 ± 1e-6) summed in float32 can read 1.0000001, above the bound.
    Shapes: [B, T] → [].
    """
    check_same_shape(weight=weight, mask=mask)
    w = (weight * mask).double()
    n = mask.sum().clamp(min=1).double()
    total_sq = w.square().sum()
    ess = torch.where(total_sq > 0, w.sum().square() / (n * total_sq), total_sq.new_zeros(()))
    return ess.to(weight.dtype)


def sequence_effective_sample_size(log_ratio: Tensor, mask: Tensor) -> Tensor:
    """ESS of sequence-level weights W_b = Π_t ρ_{b,t} over sequences with a policy token.

    Computed in log space: ESS = exp(2·lse(log W) − log B' − lse(2 log W)). Shapes: [B, T] → [].
    """
    check_same_shape(log_ratio=log_ratio, mask=mask)
    has_tokens = mask.sum(dim=1) > 0
    log_w = (log_ratio * mask).sum(dim=1).double()
    log_w = torch.where(has_tokens, log_w, log_w.new_full((), -math.inf))
    count = has_tokens.sum().clamp(min=1).double()
    ess = torch.exp(2 * torch.logsumexp(log_w, 0) - torch.log(count) - torch.logsumexp(2 * log_w, 0))
    return torch.where(has_tokens.any(), ess, ess.new_zeros(())).to(log_ratio.dtype)


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> Tensor:
    """1 − Var[v − V] / Var[v] over policy tokens (0 when Var[v] = 0). Shapes: [B, T] → []."""
    check_same_shape(values=values, returns=returns, mask=mask)
    mean_ret = masked_mean(returns, mask)
    var_ret = masked_mean((returns - mean_ret).square(), mask)
    resid = returns - values
    mean_res = masked_mean(resid, mask)
    var_res = masked_mean((resid - mean_res).square(), mask)
    return torch.where(var_ret > 0, 1.0 - var_res / var_ret.clamp(min=1e-12), var_ret.new_zeros(()))


def ratio_diagnostics(log_ratio: Tensor, mask: Tensor, correction: PolicyCorrection) -> dict[str, Tensor]:
    """Behavior-ratio statistics over policy tokens, with ρ = exp(log ρ) (log ρ already clamped).

        correction/ess          (Σρ)²/(NΣρ²)             correction/ess_seq  sequence-level ESS
        correction/ess_applied  ESS of the applied weights w·M
        correction/chi2         E[ρ²] − 1                correction/kl_k3    E[ρ − log ρ − 1]
        correction/masked_frac_{low,high}, correction/masked_frac
        correction/ratio_{mean,max,p99}

    Shapes: [B, T] inputs; returns 0-dim tensors.
    """
    check_same_shape(log_ratio=log_ratio, mask=mask)
    check_float_mask(mask)
    ratio = torch.exp(log_ratio) * mask
    policy_ratios = ratio[mask > 0]
    if policy_ratios.numel() == 0:
        policy_ratios = ratio.new_ones(1)
    low = masked_mean(correction.dropped_low, mask)
    high = masked_mean(correction.dropped_high, mask)
    return {
        "correction/ess": effective_sample_size(ratio, mask),
        "correction/ess_seq": sequence_effective_sample_size(log_ratio, mask),
        "correction/ess_applied": effective_sample_size(correction.weight, correction.keep),
        "correction/chi2": masked_mean(ratio.square(), mask) - 1.0,
        "correction/kl_k3": masked_mean(torch.expm1(log_ratio) - log_ratio, mask),
        "correction/masked_frac_low": low,
        "correction/masked_frac_high": high,
        "correction/masked_frac": low + high,
        "correction/ratio_mean": policy_ratios.mean(),
        "correction/ratio_max": policy_ratios.max(),
        "correction/ratio_p99": torch.quantile(policy_ratios.double(), 0.99).to(ratio.dtype),
    }


def exact_kl(log_probs_p: Tensor, log_probs_q: Tensor, mask: Tensor) -> Tensor:
    """Mean over policy tokens of the full-vocabulary KL(p ‖ q) = Σ_v p(v) (log p(v) − log q(v)).

    `policy/kl_step` is this with p = π_v (before a learner step) and q = π_{v+1} (after it), on
    the step's own states: the per-step policy change that k steps of lag accumulate.
    Shapes: log_probs_p, log_probs_q: [B, T, V] (log-softmax outputs); mask: [B, T] → [].
    """
    check_same_shape(log_probs_p=log_probs_p, log_probs_q=log_probs_q)
    check_same_shape(mask=mask, positions=log_probs_p[..., 0])
    per_token = (log_probs_p.exp() * (log_probs_p - log_probs_q)).sum(-1)
    return masked_mean(per_token, mask)


def behavior_kl(log_ratio: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """k3 estimates of KL(μ ‖ π_old) from samples of μ: E_μ[ρ − 1 − log ρ] per policy token, and its
    sum over each sequence's policy tokens averaged over sequences (the staleness a sequence carries).

        staleness/kl_behavior       mean_t (ρ_t − 1 − log ρ_t)
        staleness/kl_behavior_seq   mean_i Σ_t (ρ_{i,t} − 1 − log ρ_{i,t})
        staleness/ratio_in_band     share of policy tokens with ρ_t ∈ [0.8, 1.25] (the band LLM-RL
                                    reports quote for per-token train/rollout ratios)
        staleness/log_ratio_p01, staleness/log_ratio_p99   quantiles of log ρ_t over policy tokens

    Schulman 2020, "Approximating KL divergence" (k3). Shapes: [B, T] → 0-dim tensors.
    """
    check_same_shape(log_ratio=log_ratio, mask=mask)
    k3 = (torch.expm1(log_ratio) - log_ratio) * mask
    has_tokens = (mask.sum(dim=1) > 0).to(mask.dtype)
    per_sequence = (k3.sum(dim=1) * has_tokens).sum() / has_tokens.sum().clamp(min=1)
    tokens = log_ratio[mask > 0].double()
    if tokens.numel() == 0:
        tokens = tokens.new_zeros(1)
    in_band = ((tokens >= math.log(0.8)) & (tokens <= math.log(1.25))).double().mean()
    quantiles = torch.quantile(tokens, tokens.new_tensor([0.01, 0.99]))
    return {
        "staleness/kl_behavior": masked_mean(k3, mask),
        "staleness/kl_behavior_seq": per_sequence,
        "staleness/ratio_in_band": in_band.to(mask.dtype),
        "staleness/log_ratio_p01": quantiles[0].to(mask.dtype),
        "staleness/log_ratio_p99": quantiles[1].to(mask.dtype),
    }


def trace_diagnostics(log_ratio: Tensor, mask: Tensor, trace: Tensor | None) -> dict[str, Tensor]:
    """Trace-side statistics of the advantage estimator.

        correction/trace_clip_frac  fraction of policy tokens whose c_t ≠ ρ_t (c hit a band edge)
        correction/trace_mean       mean over sequences of Π_t c_t over the response

    `trace = None` (GAE: c ≡ 1 by definition, no ratio enters) gives 0 and 1.
    Shapes: [B, T] inputs; returns 0-dim tensors.
    """
    check_same_shape(log_ratio=log_ratio, mask=mask)
    if trace is None:
        return {"correction/trace_clip_frac": mask.new_zeros(()), "correction/trace_mean": mask.new_ones(())}
    check_same_shape(log_ratio=log_ratio, trace=trace)
    log_trace = torch.log(trace.clamp(min=1e-30))
    clipped = ((log_trace - log_ratio).abs() > 1e-6).to(mask.dtype)
    has_tokens = (mask.sum(dim=1) > 0).to(torch.float64)
    seq_log_trace = (log_trace * mask).sum(dim=1).double()
    trace_mean = (torch.exp(seq_log_trace) * has_tokens).sum() / has_tokens.sum().clamp(min=1)
    return {
        "correction/trace_clip_frac": masked_mean(clipped, mask),
        "correction/trace_mean": trace_mean.to(mask.dtype),
    }
