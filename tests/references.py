"""Loop-based reference implementations, written for readability, in float64 Python scalars.

They follow the published pseudo-code line by line so that the vectorised library code can be
checked against something that shares none of its structure.
"""

from __future__ import annotations

import torch


def loop_traced_advantages(rewards, values, mask, trace, gamma, lam, bootstrap=None, traced_returns=True):
    """Per-sequence backward loop over policy tokens (environment tokens skipped, verl style).

    Â_t = δ_t + γλ c_{t'} Â_{t'}, δ_t = R_t + γ V_{t'} − V_t, v_t = V_t + c_t Â_t (or V_t + Â_t).
    trace None means c ≡ 1.
    """
    B, T = rewards.shape
    adv = torch.zeros(B, T, dtype=torch.float64)
    ret = torch.zeros(B, T, dtype=torch.float64)
    for i in range(B):
        next_value = 0.0 if bootstrap is None else float(bootstrap[i])
        next_adv, next_c = 0.0, 1.0
        for t in reversed(range(T)):
            if mask[i, t] == 0:
                continue
            c = 1.0 if trace is None else float(trace[i, t])
            v = float(values[i, t])
            delta = float(rewards[i, t]) + gamma * next_value - v
            a = delta + gamma * lam * next_c * next_adv
            adv[i, t] = a
            ret[i, t] = v + (c if traced_returns else 1.0) * a
            next_value, next_adv, next_c = v, a, c
    return adv, ret


def verl_gae(rewards, values, response_mask, gamma, lam):
    """verl `compute_gae_advantage_return` (trainer/ppo/core_algos.py), before whitening."""
    nextvalues = 0
    lastgaelam = 0
    advantages_reversed = []
    for t in reversed(range(rewards.shape[-1])):
        delta = rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam_ = delta + gamma * lam * lastgaelam
        nextvalues = values[:, t] * response_mask[:, t] + (1 - response_mask[:, t]) * nextvalues
        lastgaelam = lastgaelam_ * response_mask[:, t] + (1 - response_mask[:, t]) * lastgaelam
        advantages_reversed.append(lastgaelam)
    advantages = torch.stack(advantages_reversed[::-1], dim=1)
    return advantages, advantages + values


def rlax_vtrace(v_tm1, v_t, r_t, discount_t, rho_tm1, lambda_=1.0, clip_rho_threshold=1.0, clip_pg_rho_threshold=1.0):
    """Port of rlax `vtrace_td_error_and_advantage` (rlax/_src/vtrace.py) for one sequence.

    Returns (targets v_s, pg advantages ρ̄_s (q_s − V(x_s))). Inputs are 1-D float64 tensors of
    length T: v_tm1 = V(x_s), v_t = V(x_{s+1}), discount_t = γ (0 at the end of an episode).
    """
    c_tm1 = torch.clamp(rho_tm1, max=1.0) * lambda_
    clipped_rhos_tm1 = torch.clamp(rho_tm1, max=clip_rho_threshold)
    td_errors = clipped_rhos_tm1 * (r_t + discount_t * v_t - v_tm1)
    err = 0.0
    errors = []
    for i in reversed(range(v_t.shape[0])):
        err = td_errors[i] + discount_t[i] * c_tm1[i] * err
        errors.insert(0, err)
    targets_tm1 = torch.stack(errors) + v_tm1
    q_bootstrap = torch.cat([lambda_ * targets_tm1[1:] + (1 - lambda_) * v_tm1[1:], v_t[-1:]])
    q_estimate = r_t + discount_t * q_bootstrap
    clipped_pg_rho_tm1 = torch.clamp(rho_tm1, max=clip_pg_rho_threshold)
    return targets_tm1, clipped_pg_rho_tm1 * (q_estimate - v_tm1)


def loop_linear_scan(b, a, terminal):
    out = torch.zeros(b.shape, dtype=torch.float64)
    for i in range(b.shape[0]):
        y = float(terminal[i])
        for t in reversed(range(b.shape[1])):
            y = float(b[i, t]) + float(a[i, t]) * y
            out[i, t] = y
    return out
