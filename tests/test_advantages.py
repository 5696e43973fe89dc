import math

import pytest
import torch

from copc_core.rl.advantages import (
    copc_advantages,
    gae_advantages,
    masked_whiten,
    reverse_linear_scan,
    trace_coefficients,
    traced_advantages,
    vtrace_advantages,
)
from tests.references import loop_linear_scan, loop_traced_advantages, rlax_vtrace, verl_gae

F64 = dict(rtol=0.0, atol=1e-10)  # float64 comparisons
F32 = dict(rtol=1e-5, atol=1e-5)


def batch(B, T, seed=0, p_env=0.3, dtype=torch.float64, log_ratio_scale=0.7):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(B, T, generator=g, dtype=dtype)
    values = torch.randn(B, T, generator=g, dtype=dtype)
    mask = (torch.rand(B, T, generator=g) > p_env).to(dtype)
    log_ratio = torch.randn(B, T, generator=g, dtype=dtype) * log_ratio_scale
    return rewards, values, mask, log_ratio


# ---------------- the shared kernel ----------------


@pytest.mark.parametrize("T", [1, 7, 32, 33, 100, 1025, 1100])
def test_scan_matches_loop_including_zeros_and_multi_level_recursion(T):
    g = torch.Generator().manual_seed(T)
    b = torch.randn(3, T, generator=g, dtype=torch.float64)
    a = torch.rand(3, T, generator=g, dtype=torch.float64) * 1.1
    a[:, ::5] = 0.0  # zeros cut the recursion: nothing is divided
    terminal = torch.randn(3, generator=g, dtype=torch.float64)
    torch.testing.assert_close(reverse_linear_scan(b, a, terminal), loop_linear_scan(b, a, terminal), **F64)


def test_scan_hand_values():
    # y2 = 3 + 0.5·1 = 3.5; y1 = 2 + 2·3.5 = 9; y0 = 1 + 0·9 = 1
    b = torch.tensor([[1.0, 2.0, 3.0]])
    a = torch.tensor([[0.0, 2.0, 0.5]])
    out = reverse_linear_scan(b, a, torch.tensor([1.0]))
    torch.testing.assert_close(out, torch.tensor([[1.0, 9.0, 3.5]]), rtol=0, atol=0)


def test_scan_rejects_bad_shapes():
    with pytest.raises(ValueError, match="shape mismatch"):
        reverse_linear_scan(torch.zeros(2, 3), torch.zeros(2, 4), torch.zeros(2))
    with pytest.raises(ValueError, match="terminal"):
        reverse_linear_scan(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3))


# ---------------- hand-derived values ----------------


def test_gae_hand_derived_with_environment_token():
    # t = 1 is an environment token (tool output): skipped; its reward 5 and value 9 are inert.
    rewards = torch.tensor([[0.0, 5.0, 1.0]], dtype=torch.float64)
    values = torch.tensor([[0.5, 9.0, 0.2]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 0.0, 1.0]], dtype=torch.float64)
    gamma, lam = 0.9, 0.8
    # δ2 = 1 − 0.2 = 0.8;  δ0 = 0 + 0.9·0.2 − 0.5 = −0.32;  Â0 = −0.32 + 0.72·0.8 = 0.256
    out = gae_advantages(rewards, values, mask, gamma, lam)
    torch.testing.assert_close(out.advantages, torch.tensor([[0.256, 0.0, 0.8]], dtype=torch.float64), **F64)
    torch.testing.assert_close(out.returns, torch.tensor([[0.756, 0.0, 1.0]], dtype=torch.float64), **F64)


def test_copc_hand_derived_traces():
    rewards = torch.tensor([[0.0, 5.0, 1.0]], dtype=torch.float64)
    values = torch.tensor([[0.5, 9.0, 0.2]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 0.0, 1.0]], dtype=torch.float64)
    # ρ0 = 0.25 (clipped to 1/2 at τ_a = 2), ρ2 = 1.5 (inside the band)
    log_ratio = torch.log(torch.tensor([[0.25, 1.0, 1.5]], dtype=torch.float64))
    out = copc_advantages(rewards, values, mask, log_ratio, 0.9, 0.8, tau_advantage=2.0)
    # Â2 = 0.8; Â0 = −0.32 + 0.72·c2·Â2 = −0.32 + 0.72·1.5·0.8 = 0.544
    # v2 = 0.2 + 1.5·0.8 = 1.4;  v0 = 0.5 + c0·Â0 = 0.5 + 0.5·0.544 = 0.772
    torch.testing.assert_close(out.advantages, torch.tensor([[0.544, 0.0, 0.8]], dtype=torch.float64), **F64)
    torch.testing.assert_close(out.returns, torch.tensor([[0.772, 0.0, 1.4]], dtype=torch.float64), **F64)
    gae_target = copc_advantages(rewards, values, mask, log_ratio, 0.9, 0.8, 2.0, traced_returns=False)
    torch.testing.assert_close(gae_target.returns, torch.tensor([[1.044, 0.0, 1.0]], dtype=torch.float64), **F64)


def test_trace_coefficients_band_and_one_sided():
    rho = torch.tensor([0.1, 0.5, 1.0, 3.0, 100.0], dtype=torch.float64)
    two = trace_coefficients(torch.log(rho), 2.0, one_sided=False)
    one = trace_coefficients(torch.log(rho), 2.0, one_sided=True)
    torch.testing.assert_close(two, torch.tensor([0.5, 0.5, 1.0, 2.0, 2.0], dtype=torch.float64), **F64)
    torch.testing.assert_close(one, torch.tensor([0.1, 0.5, 1.0, 2.0, 2.0], dtype=torch.float64), **F64)
    assert torch.equal(trace_coefficients(torch.log(rho), 1.0, False), torch.ones(5, dtype=torch.float64))
    with pytest.raises(ValueError, match="tau"):
        trace_coefficients(rho, 0.5, False)


def test_bootstrap_value_for_truncated_sequences():
    rewards = torch.tensor([[0.0, 1.0]], dtype=torch.float64)
    values = torch.tensor([[0.3, 0.6]], dtype=torch.float64)
    mask = torch.ones(1, 2, dtype=torch.float64)
    out = gae_advantages(rewards, values, mask, 0.5, 1.0, bootstrap_value=torch.tensor([2.0], dtype=torch.float64))
    # Â1 = 1 + 0.5·2 − 0.6 = 1.4 ; Â0 = 0 + 0.5·0.6 − 0.3 + 0.5·1.4 = 0.7
    torch.testing.assert_close(out.advantages, torch.tensor([[0.7, 1.4]], dtype=torch.float64), **F64)


# ---------------- vectorised vs loop references ----------------


@pytest.mark.parametrize("T,seed", [(5, 0), (40, 1), (257, 2), (1100, 3)])
@pytest.mark.parametrize("tau,one_sided,traced", [(1.5, False, True), (3.0, False, False), (1.2, True, True)])
def test_copc_matches_loop_reference(T, seed, tau, one_sided, traced):
    rewards, values, mask, log_ratio = batch(4, T, seed)
    boot = torch.randn(4, dtype=torch.float64)
    out = copc_advantages(rewards, values, mask, log_ratio, 0.97, 0.9, tau, one_sided, traced, boot)
    trace = trace_coefficients(log_ratio, tau, one_sided)
    adv, ret = loop_traced_advantages(rewards, values, mask, trace, 0.97, 0.9, boot, traced)
    torch.testing.assert_close(out.advantages, adv, **F64)
    torch.testing.assert_close(out.returns, ret, **F64)


@pytest.mark.parametrize("T", [6, 300])
def test_gae_matches_verl_reference(T):
    rewards, values, mask, _ = batch(5, T, seed=T)
    out = gae_advantages(rewards, values, mask, 1.0, 0.95)
    adv, ret = verl_gae(rewards, values, mask, 1.0, 0.95)
    torch.testing.assert_close(out.advantages, adv * mask, **F64)
    torch.testing.assert_close(out.returns, ret * mask, **F64)


def test_float32_large_batch_matches_float64_loop():
    rewards, values, mask, log_ratio = batch(8, 700, seed=7, dtype=torch.float32)
    out = copc_advantages(rewards, values, mask, log_ratio, 1.0, 0.95, 2.0)
    trace = trace_coefficients(log_ratio.double(), 2.0, False)
    adv, ret = loop_traced_advantages(rewards.double(), values.double(), mask.double(), trace, 1.0, 0.95)
    torch.testing.assert_close(out.advantages.double(), adv, **F32)
    torch.testing.assert_close(out.returns.double(), ret, **F32)


# ---------------- reductions ----------------


def test_tau_one_is_exactly_gae():
    rewards, values, mask, log_ratio = batch(6, 90, seed=11)
    gae = gae_advantages(rewards, values, mask, 0.99, 0.9)
    copc = copc_advantages(rewards, values, mask, log_ratio, 0.99, 0.9, tau_advantage=1.0)
    torch.testing.assert_close(copc.advantages, gae.advantages, rtol=0, atol=1e-12)
    torch.testing.assert_close(copc.returns, gae.returns, rtol=0, atol=1e-12)


@pytest.mark.parametrize("tau", [1.0, 1.5, 4.0, math.inf])
def test_on_policy_behavior_is_gae_for_any_tau(tau):
    rewards, values, mask, _ = batch(6, 90, seed=12)
    zero_log_ratio = torch.zeros_like(rewards)  # μ = π_old
    gae = gae_advantages(rewards, values, mask, 0.99, 0.9)
    for one_sided in (False, True):
        copc = copc_advantages(rewards, values, mask, zero_log_ratio, 0.99, 0.9, tau, one_sided)
        torch.testing.assert_close(copc.advantages, gae.advantages, rtol=0, atol=1e-12)
        torch.testing.assert_close(copc.returns, gae.returns, rtol=0, atol=1e-12)


@pytest.mark.parametrize("lam", [1.0, 0.8])
def test_one_sided_clip_is_vtrace(lam):
    """rlax V-trace (c̄ = ρ̄ = 1) on a fully policy-token sequence equals our one-sided traces."""
    T, gamma = 30, 0.95
    rewards, values, _, log_ratio = batch(3, T, seed=5, log_ratio_scale=1.0)
    mask = torch.ones(3, T, dtype=torch.float64)
    boot = torch.randn(3, dtype=torch.float64)
    out = vtrace_advantages(rewards, values, mask, log_ratio, gamma, lam, c_bar=1.0, bootstrap_value=boot)
    for i in range(3):
        v_t = torch.cat([values[i, 1:], boot[i : i + 1]])
        targets, pg_adv = rlax_vtrace(
            values[i],
            v_t,
            rewards[i],
            torch.full((T,), gamma, dtype=torch.float64),
            torch.exp(log_ratio[i]),
            lambda_=lam,
        )
        torch.testing.assert_close(out.returns[i], targets, **F64)
        rho_bar = torch.clamp(torch.exp(log_ratio[i]), max=1.0)
        torch.testing.assert_close(rho_bar * out.advantages[i], pg_adv, **F64)


def test_gamma_lambda_zero_gives_one_step_td():
    rewards, values, mask, log_ratio = batch(3, 20, seed=2)
    out = copc_advantages(rewards, values, mask, log_ratio, 0.9, 0.0, 2.0, traced_returns=False)
    adv, _ = loop_traced_advantages(rewards, values, mask, None, 0.9, 0.0)
    torch.testing.assert_close(out.advantages, adv, **F64)


# ---------------- invariances ----------------


def test_values_rewards_and_ratios_at_environment_tokens_change_nothing():
    rewards, values, mask, log_ratio = batch(5, 77, seed=3)
    env = mask == 0
    noisy = [x.masked_fill(env, 1e6) for x in (rewards, values, log_ratio)]
    for fn in (
        lambda r, v, lr: gae_advantages(r, v, mask, 0.99, 0.9),
        lambda r, v, lr: copc_advantages(r, v, mask, lr, 0.99, 0.9, 3.0),
        lambda r, v, lr: vtrace_advantages(r, v, mask, lr, 0.99, 0.9),
    ):
        clean, dirty = fn(rewards, values, log_ratio), fn(*noisy)
        assert torch.equal(clean.advantages, dirty.advantages)
        assert torch.equal(clean.returns, dirty.returns)
        assert torch.all(clean.advantages[env] == 0) and torch.all(clean.returns[env] == 0)


def test_inserting_environment_tokens_skips_them():
    rewards, values, _, log_ratio = batch(2, 12, seed=4)
    mask = torch.ones(2, 12, dtype=torch.float64)
    dense = copc_advantages(rewards, values, mask, log_ratio, 0.98, 0.9, 2.0)
    # spread the same policy tokens over 30 positions, environment tokens in between
    positions = torch.tensor([0, 1, 4, 5, 6, 10, 11, 17, 20, 21, 25, 29])
    wide = [torch.randn(2, 30, dtype=torch.float64) for _ in range(3)]
    wide_mask = torch.zeros(2, 30, dtype=torch.float64)
    for w, x in zip(wide, (rewards, values, log_ratio)):
        w[:, positions] = x
    wide_mask[:, positions] = 1.0
    sparse = copc_advantages(wide[0], wide[1], wide_mask, wide[2], 0.98, 0.9, 2.0)
    torch.testing.assert_close(sparse.advantages[:, positions], dense.advantages, **F64)
    torch.testing.assert_close(sparse.returns[:, positions], dense.returns, **F64)


def test_batch_permutation_permutes_outputs():
    rewards, values, mask, log_ratio = batch(7, 50, seed=9)
    perm = torch.randperm(7, generator=torch.Generator().manual_seed(0))
    out = copc_advantages(rewards, values, mask, log_ratio, 0.99, 0.95, 2.0)
    permuted = copc_advantages(rewards[perm], values[perm], mask[perm], log_ratio[perm], 0.99, 0.95, 2.0)
    torch.testing.assert_close(permuted.advantages, out.advantages[perm], **F64)
    torch.testing.assert_close(permuted.returns, out.returns[perm], **F64)


def test_no_gradient_flows_into_targets():
    rewards, values, mask, log_ratio = batch(2, 10, seed=1)
    values.requires_grad_(True)
    out = copc_advantages(rewards, values, mask, log_ratio, 0.99, 0.95, 2.0)
    assert not out.advantages.requires_grad and not out.returns.requires_grad


def test_input_validation():
    r, v, m, lr = batch(2, 5)
    with pytest.raises(TypeError, match="float"):
        gae_advantages(r, v, m.bool(), 0.9, 0.9)
    with pytest.raises(ValueError, match="shape mismatch"):
        gae_advantages(r, v[:, :4], m, 0.9, 0.9)
    with pytest.raises(ValueError, match="gamma"):
        gae_advantages(r, v, m, 1.5, 0.9)


# ---------------- whitening ----------------


def test_masked_whiten_over_policy_tokens():
    x, _, mask, _ = batch(4, 30, seed=8)
    w = masked_whiten(x, mask)
    sel = w[mask > 0]
    torch.testing.assert_close(sel.mean(), torch.tensor(0.0, dtype=torch.float64), rtol=0, atol=1e-12)
    torch.testing.assert_close(sel.std(unbiased=True), torch.tensor(1.0, dtype=torch.float64), rtol=0, atol=1e-7)
    assert torch.all(w[mask == 0] == 0)
    ref = (x[mask > 0] - x[mask > 0].mean()) / torch.sqrt(x[mask > 0].var(unbiased=True) + 1e-8)
    torch.testing.assert_close(sel, ref, **F64)


def test_traced_advantages_trace_none_equals_ones():
    rewards, values, mask, _ = batch(3, 40, seed=13)
    a = traced_advantages(rewards, values, mask, None, 0.99, 0.9)
    b = traced_advantages(rewards, values, mask, torch.ones_like(rewards), 0.99, 0.9)
    torch.testing.assert_close(a.advantages, b.advantages, rtol=0, atol=1e-12)
    torch.testing.assert_close(a.returns, b.returns, rtol=0, atol=1e-12)
