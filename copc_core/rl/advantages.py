"""Advantage estimators over a token-level MDP: GAE, COPC clipped-ratio traces, V-trace.

All three are one recursion over the *policy* tokens of a response (environment tokens, `mask = 0`,
are skipped: the running value is carried across them, as verl's `compute_gae_advantage_return`
does):

    δ_t = R_t + γ V(s_{t'}) − V(s_t)                 t' = next policy token after t
    Â_t = δ_t + γλ · c_{t'} · Â_{t'}                 Â past the end = 0

with trace coefficients c ≡ 1 (GAE, Schulman et al. 2016, arXiv 1506.02438), c = clip(ρ, 1/τ, τ)
(COPC channel 2, docs ALGORITHMS.md §2) or c = min(c̄, ρ) (V-trace, Espeholt et al. 2018,
arXiv 1802.01561, §4.1). Critic targets are either v = V + c·Â ("traced", V-trace/Retrace style)
or v = V + Â ("gae").

The shared kernel is `reverse_linear_scan`. To avoid a gather of "the next policy token", the
recursion is rewritten in a local form. Let u_t = γ(V(s_k) + λ c_k Â_k) for k the first policy
token at or after t (u = γ·V_boot past the end). Then for a policy token t

    Â_t = R_t − V(s_t) + u_{t+1}
    u_t = γ(V_t + λ c_t (R_t − V_t)) + γλ c_t · u_{t+1}

and u_t = u_{t+1} on environment tokens, so u is a first-order linear recurrence with purely local
coefficients. Derivation: substitute Â_t into the definition of u_t.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from copc_core.rl.tensors import LOG_RATIO_CLAMP, check_float_mask, check_same_shape, masked_mean

_SCAN_CHUNK = 32


class AdvantageOutput(NamedTuple):
    """Advantages and critic targets, both [B, T], zero at environment tokens."""

    advantages: Tensor
    returns: Tensor


def reverse_linear_scan(b: Tensor, a: Tensor, terminal: Tensor) -> Tensor:
    """Solve y_t = b_t + a_t · y_{t+1} backwards in time, with y_T = terminal.

    Vectorised over the batch and, within chunks of 32 steps, over time: each chunk is solved by a
    Hillis–Steele doubling scan over the pairs (a, b) (the composition of two steps is
    (a₁, b₁)∘(a₂, b₂) = (a₁a₂, b₁ + a₁b₂)), and the chunk boundaries form a 16× shorter recurrence
    of the same kind, solved recursively (32× shorter each level). Arithmetic is exact up to float
    reassociation; zeros in `a` are fine (nothing is divided or logged). Products of `a` over a
    chunk are formed explicitly, so they overflow only where the trace product itself does.

    Shapes: b, a: [B, T]; terminal: [B]; returns [B, T].
    """
    check_same_shape(b=b, a=a)
    if b.dim() != 2 or terminal.shape != b.shape[:1]:
        raise ValueError(f"expected b, a [B, T] and terminal [B], got {tuple(b.shape)} and {tuple(terminal.shape)}")
    batch, steps = b.shape
    chunk = _SCAN_CHUNK
    if steps <= chunk:
        out = torch.empty_like(b)
        y = terminal
        for t in range(steps - 1, -1, -1):
            y = torch.addcmul(b[:, t], a[:, t], y)
            out[:, t] = y
        return out
    n_chunks = -(-steps // chunk)
    pad = n_chunks * chunk - steps
    if pad:  # padded steps are identities (b = 0, a = 1): they pass the terminal through
        b = torch.nn.functional.pad(b, (0, pad), value=0.0)
        a = torch.nn.functional.pad(a, (0, pad), value=1.0)
    # Ping-pong buffers [B, n, C + C/2]: the last C/2 slots of each chunk hold identity steps
    # (b = 0, a = 1), so every doubling step can read `span` ahead without a bounds case.
    width = chunk + chunk // 2
    locals_ = [b.new_zeros(batch, n_chunks, width) for _ in range(2)]
    gains = [a.new_ones(batch, n_chunks, width) for _ in range(2)]
    locals_[0][..., :chunk] = b.view(batch, n_chunks, chunk)
    gains[0][..., :chunk] = a.view(batch, n_chunks, chunk)
    span, src = 1, 0
    while span < chunk:
        old_l, old_g, new_l, new_g = locals_[src], gains[src], locals_[1 - src], gains[1 - src]
        torch.addcmul(old_l[..., :chunk], old_g[..., :chunk], old_l[..., span : span + chunk], out=new_l[..., :chunk])
        torch.mul(old_g[..., :chunk], old_g[..., span : span + chunk], out=new_g[..., :chunk])
        span, src = span * 2, 1 - src
    local = locals_[src][..., :chunk]  # [B, n, C]: y within the chunk with zero carry-in
    gain = gains[src][..., :chunk]  # [B, n, C]: Π_{i=t..end of chunk} a_i
    # y at the first step of every chunk obeys the same recursion, one level up: [B, n]
    first = reverse_linear_scan(local[..., 0].contiguous(), gain[..., 0].contiguous(), terminal)
    carry = torch.cat([first[:, 1:], terminal[:, None]], dim=1)  # y entering each chunk from the right
    out = torch.addcmul(local, gain, carry[..., None]).reshape(batch, n_chunks * chunk)
    return out[:, :steps]


def trace_coefficients(log_ratio: Tensor, tau: float, one_sided: bool) -> Tensor:
    """Clipped-ratio trace coefficients c_t.

        two-sided (COPC):   c = clip(ρ, 1/τ, τ)        τ = 1 gives c ≡ 1 (GAE)
        one-sided (V-trace): c = min(τ, ρ)             τ plays the role of c̄

    with ρ = exp(clamp(log ρ, ±20)). Computed as one exp of a clamped log, so the result is exact
    at the band edges (c = 1 exactly when τ = 1).

    Shapes: log_ratio: [B, T] → [B, T].
    """
    if not tau >= 1.0:
        raise ValueError(f"tau must be >= 1, got {tau}")
    log_tau = min(math.log(tau), LOG_RATIO_CLAMP)
    low = -LOG_RATIO_CLAMP if one_sided else -log_tau
    return torch.exp(torch.clamp(log_ratio, low, log_tau))


def traced_advantages(
    rewards: Tensor,
    values: Tensor,
    mask: Tensor,
    trace: Tensor | None,
    gamma: float,
    lam: float,
    bootstrap_value: Tensor | None = None,
    traced_returns: bool = True,
) -> AdvantageOutput:
    """Importance-traced TD(λ) advantages and critic targets over policy tokens.

        Â_t = Σ_l (γλ)^l (Π_{i=1..l} c_{t+i}) δ_{t+l}      (indices run over policy tokens)
        v_t = V(s_t) + c_t · Â_t   (traced_returns)   or   V(s_t) + Â_t

    `trace = None` means c ≡ 1 (GAE). Rewards, values and trace at environment tokens change
    nothing (they must be finite: masking is by multiplication, the fast path on CPU). `bootstrap_value`
    is V past the end (truncated sequences); None means 0 (terminal).

    Shapes: rewards, values, mask, trace: [B, T] (mask float 0/1); bootstrap_value: [B];
    returns two [B, T] tensors, zero at environment tokens.
    References: Schulman et al. 2016 (GAE, arXiv 1506.02438) eq. 16; Espeholt et al. 2018
    (V-trace, arXiv 1802.01561) eq. 1; Munos et al. 2016 (Retrace, arXiv 1606.02647).
    """
    check_same_shape(rewards=rewards, values=values, mask=mask)
    if rewards.dim() != 2:
        raise ValueError(f"expected [B, T] tensors, got {tuple(rewards.shape)}")
    check_float_mask(mask)
    if trace is not None:
        check_same_shape(rewards=rewards, trace=trace)
    if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise ValueError(f"gamma and lam must lie in [0, 1], got {gamma}, {lam}")
    # Targets carry no gradient. Masking is by multiplication: entries at environment tokens must
    # be finite, and are then inert.
    rewards, values, mask = rewards.detach(), values.detach(), mask.detach()
    trace = None if trace is None else trace.detach()
    values = values * mask
    td = rewards * mask - values  # R_t − V_t on policy tokens, 0 elsewhere
    env = 1.0 - mask
    if bootstrap_value is None:
        terminal = rewards.new_zeros(rewards.shape[0])
    else:
        terminal = gamma * bootstrap_value.to(rewards.dtype)
    if trace is None:
        b = torch.add(values, td, alpha=lam).mul_(gamma)  # γ(V + λ(R − V))
        a = torch.add(env, mask, alpha=gamma * lam)  # γλ on policy tokens, 1 on environment tokens
    else:
        b = torch.addcmul(values, trace, td, value=lam).mul_(gamma)  # γ(V + λc(R − V))
        a = torch.addcmul(env, mask, trace, value=gamma * lam)  # γλc on policy tokens, 1 elsewhere
    u = reverse_linear_scan(b, a, terminal)
    u_next = torch.cat([u[:, 1:], terminal[:, None]], dim=1)
    advantages = td.add_(u_next).mul_(mask)
    if trace is None or not traced_returns:
        returns = values + advantages
    else:
        returns = torch.addcmul(values, trace, advantages)
    return AdvantageOutput(advantages, returns)


def gae_advantages(
    rewards: Tensor,
    values: Tensor,
    mask: Tensor,
    gamma: float,
    lam: float,
    bootstrap_value: Tensor | None = None,
) -> AdvantageOutput:
    """GAE(γ, λ) with skip-carry over environment tokens; returns = V + Â.

    Shapes: [B, T] inputs (mask float 0/1), bootstrap_value [B]; see `traced_advantages`.
    Reference: Schulman et al. 2016, arXiv 1506.02438; verl `compute_gae_advantage_return`.
    """
    return traced_advantages(rewards, values, mask, None, gamma, lam, bootstrap_value)


def copc_advantages(
    rewards: Tensor,
    values: Tensor,
    mask: Tensor,
    log_ratio: Tensor,
    gamma: float,
    lam: float,
    tau_advantage: float,
    one_sided: bool = False,
    traced_returns: bool = True,
    bootstrap_value: Tensor | None = None,
) -> AdvantageOutput:
    """COPC channel 2: TD residuals weighted by two-sided clipped behavior ratios.

        c_t = clip(ρ_t, 1/τ_a, τ_a),  ρ_t = π_old(y_t)/μ(y_t)
        Â_t = δ_t + γλ c_{t'} Â_{t'},  v_t = V(s_t) + c_t Â_t  (traced)  or  V + Â

    τ_a = 1 is GAE exactly; ρ ≡ 1 (μ = π_old) is GAE for any τ_a; `one_sided` gives
    c = min(τ_a, ρ), the V-trace(λ) traces.

    Shapes: [B, T] inputs (mask float 0/1), log_ratio = log π_old − log μ; bootstrap_value [B].
    Reference: docs/ALGORITHMS.md §2 (the project's reading of arXiv 2610.09597).
    """
    trace = trace_coefficients(log_ratio, tau_advantage, one_sided)
    return traced_advantages(rewards, values, mask, trace, gamma, lam, bootstrap_value, traced_returns)


def vtrace_advantages(
    rewards: Tensor,
    values: Tensor,
    mask: Tensor,
    log_ratio: Tensor,
    gamma: float,
    lam: float,
    c_bar: float = 1.0,
    bootstrap_value: Tensor | None = None,
) -> AdvantageOutput:
    """V-trace(λ): c_t = min(c̄, ρ_t); targets v_s = V(s) + Σ γ^l (Π_{i<l} λc_{s+i}) min(c̄, ρ_{s+l}) δ_{s+l}.

    The advantage Â_t = R_t + γ(λ v_{t'} + (1−λ) V_{t'}) − V_t is V-trace's q_t − V(s_t); the
    policy-gradient weight min(ρ̄, ρ_t) belongs to the policy side (preset `vtrace`).

    Shapes: as `copc_advantages`. Reference: Espeholt et al. 2018, arXiv 1802.01561, §4.1–4.2;
    rlax `vtrace_td_error_and_advantage`.
    """
    return copc_advantages(rewards, values, mask, log_ratio, gamma, lam, c_bar, True, True, bootstrap_value)


def masked_whiten(x: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """(x − mean) / sqrt(var + eps) over the policy tokens of the whole batch; 0 elsewhere.

    The variance is the unbiased one (verl `masked_whiten`). Shapes: [B, T] → [B, T].
    """
    check_same_shape(x=x, mask=mask)
    count = mask.sum()
    mean = masked_mean(x, mask)
    centred = (x - mean) * mask
    var = centred.square().sum() / (count - 1).clamp(min=1)
    return centred * torch.rsqrt(var + eps)
