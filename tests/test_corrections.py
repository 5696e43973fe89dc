import math

import pytest
import torch

from copc_core.rl.corrections import (
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

D = torch.float64


def ratios(*values):
    return torch.log(torch.tensor([values], dtype=D))


def test_behavior_log_ratio_is_clamped_and_masked():
    logp_old = torch.tensor([[0.0, -100.0, 0.0, 5.0]], dtype=D)
    logp_beh = torch.tensor([[-89.0, 0.0, -1.0, float("-inf")]], dtype=D)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]], dtype=D)
    out = behavior_log_ratio(logp_old, logp_beh, mask)
    torch.testing.assert_close(out, torch.tensor([[20.0, -20.0, 1.0, 0.0]], dtype=D), rtol=0, atol=0)
    assert not out.requires_grad


def test_ratio_band_keeps_inside_inclusive_and_weights_by_ratio():
    lr = ratios(0.2, 0.5, 1.0, 2.0, 2.5)
    mask = torch.ones(1, 5, dtype=D)
    c = ratio_band_correction(lr, mask, 0.5, 2.0, lr)
    torch.testing.assert_close(c.keep, torch.tensor([[0, 1, 1, 1, 0]], dtype=D), rtol=0, atol=0)
    torch.testing.assert_close(c.weight, torch.tensor([[0, 0.5, 1.0, 2.0, 0]], dtype=D), rtol=0, atol=1e-12)
    torch.testing.assert_close(c.dropped_low, torch.tensor([[1, 0, 0, 0, 0]], dtype=D), rtol=0, atol=0)
    torch.testing.assert_close(c.dropped_high, torch.tensor([[0, 0, 0, 0, 1]], dtype=D), rtol=0, atol=0)
    ones = ratio_band_correction(lr, mask, 0.5, 2.0, torch.zeros_like(lr))
    torch.testing.assert_close(ones.weight, c.keep, rtol=0, atol=0)


def test_infinite_band_masks_nothing():
    lr = torch.randn(4, 9, dtype=D) * 10
    mask = (torch.rand(4, 9) > 0.3).to(D)
    c = ratio_band_correction(lr, mask, 1.0 / math.inf, math.inf, lr)
    torch.testing.assert_close(c.keep, mask, rtol=0, atol=0)
    assert c.dropped_low.sum() == 0 and c.dropped_high.sum() == 0
    torch.testing.assert_close(c.weight, torch.exp(lr) * mask, rtol=0, atol=0)


def test_environment_tokens_are_never_kept_or_counted():
    lr = ratios(100.0, 0.001, 1.0)
    mask = torch.tensor([[0.0, 0.0, 1.0]], dtype=D)
    lr = lr * mask  # behavior_log_ratio's layout: 0 at environment tokens
    for c in (
        ratio_band_correction(lr, mask, 0.5, 2.0, lr),
        truncated_ratio_correction(lr, mask, 2.0),
        m2po_correction(lr, mask, 0.04, lr),
        no_correction(lr, mask),
        sequence_truncated_correction(lr, mask, 2.0),
        sequence_band_correction(lr, mask, 0.0, 2.0, lr),
        geometric_band_correction(lr, mask, 0.5, 2.0),
    ):
        torch.testing.assert_close(c.keep, mask, rtol=0, atol=0)
        assert c.weight[0, :2].abs().sum() == 0
        assert (c.dropped_low + c.dropped_high)[0, :2].sum() == 0


def test_truncated_ratio():
    lr = ratios(0.1, 1.0, 3.0)
    c = truncated_ratio_correction(lr, torch.ones(1, 3, dtype=D), 2.0)
    torch.testing.assert_close(c.weight, torch.tensor([[0.1, 1.0, 2.0]], dtype=D), rtol=0, atol=1e-12)


def m2po_reference(log_ratio, mask, threshold):
    """Brute force: drop the k largest (log ρ)² (stable order), smallest k whose rest has mean < τ."""
    flat = [(float(log_ratio.reshape(-1)[i]) ** 2, i) for i in range(log_ratio.numel()) if mask.reshape(-1)[i] > 0]
    order = sorted(range(len(flat)), key=lambda j: -flat[j][0])  # Python sort is stable
    for k in range(len(flat) + 1):
        rest = [flat[j][0] for j in order[k:]]
        if not rest or sum(rest) / len(rest) < threshold:
            dropped = {flat[j][1] for j in order[:k]}
            break
    out = torch.zeros(log_ratio.numel(), dtype=D)
    out[list(dropped)] = 1.0
    return out.reshape(log_ratio.shape)


@pytest.mark.parametrize("seed", range(5))
def test_m2po_matches_brute_force(seed):
    g = torch.Generator().manual_seed(seed)
    lr = torch.randn(3, 11, generator=g, dtype=D) * 0.4
    mask = (torch.rand(3, 11, generator=g) > 0.25).to(D)
    c = m2po_correction(lr, mask, 0.04, lr)
    dropped = c.dropped_low + c.dropped_high
    torch.testing.assert_close(dropped, m2po_reference(lr, mask, 0.04), rtol=0, atol=0)
    kept = c.keep > 0
    assert (lr[kept] ** 2).mean() < 0.04
    torch.testing.assert_close(c.dropped_high, dropped * (lr > 0), rtol=0, atol=0)


def test_m2po_drops_nothing_when_already_small():
    lr = torch.full((2, 4), 0.1, dtype=D)
    c = m2po_correction(lr, torch.ones(2, 4, dtype=D), 0.04, lr)
    assert c.keep.sum() == 8


def test_bad_bands_are_rejected():
    lr, m = ratios(1.0), torch.ones(1, 1, dtype=D)
    with pytest.raises(ValueError):
        ratio_band_correction(lr, m, 2.0, 1.0, lr)
    with pytest.raises(ValueError):
        truncated_ratio_correction(lr, m, 0.0)
    with pytest.raises(ValueError):
        m2po_correction(lr, m, -1.0, lr)
    with pytest.raises(ValueError):
        sequence_truncated_correction(lr, m, -2.0)
    with pytest.raises(ValueError):
        sequence_band_correction(lr, m, 3.0, 2.0, lr)
    with pytest.raises(ValueError):
        geometric_band_correction(lr, m, 1.1, 1.0)
    with pytest.raises(ValueError):
        anchor_log_prob(lr, lr, 1.5)


# ---- the three anchors (docs/ALGORITHMS.md §2) ----


def test_anchor_interpolates_in_log_space_and_is_exact_at_both_ends():
    logp_old = torch.tensor([[-0.5, -2.0, -1.0]], dtype=D)
    logp_mu = torch.tensor([[-1.5, -1.0, -1.0]], dtype=D)
    assert torch.equal(anchor_log_prob(logp_old, logp_mu, 0.0), logp_mu)
    assert torch.equal(anchor_log_prob(logp_old, logp_mu, 1.0), logp_old)
    # α = 0.25: log μ + 0.25 (log π_old − log μ) = −1.5 + 0.25, −1.0 − 0.25, −1.0
    torch.testing.assert_close(
        anchor_log_prob(logp_old, logp_mu, 0.25), torch.tensor([[-1.25, -1.25, -1.0]], dtype=D), rtol=0, atol=1e-15
    )
    per_token = torch.tensor([[0.0, 1.0, 0.5]], dtype=D)
    torch.testing.assert_close(
        anchor_log_prob(logp_old, logp_mu, per_token), torch.tensor([[-1.5, -2.0, -1.0]], dtype=D), rtol=0, atol=1e-15
    )


def test_staleness_alpha_is_a3po_version_rule():
    # AReaL: α = (v_prox − v_b) / (v_θ − v_b) with v_prox = v, v_θ = v + 1, lag k = v − v_b → k / (k + 1)
    lag = torch.tensor([[0, 1, 3, 7]])
    torch.testing.assert_close(staleness_alpha(lag), torch.tensor([[0.0, 0.5, 0.75, 0.875]]), rtol=0, atol=0)


# ---- sequence-level rules (verl rollout_corr), hand-derived ----


def _two_sequences():
    """Sequence 0: ρ = 2, 0.5 (env token between), 3 → Π ρ = 3 over 3 policy tokens.
    Sequence 1: ρ = 1.1, 1.0 → Π ρ = 1.1 over 2 policy tokens (its last position is padding)."""
    lr = torch.log(torch.tensor([[2.0, 7.0, 0.5, 3.0], [1.1, 1.0, 1.0, 1.0]], dtype=D))
    mask = torch.tensor([[1, 0, 1, 1], [1, 1, 0, 0]], dtype=D)
    return lr * mask, mask


def test_sequence_truncated_is_hand_values():
    lr, mask = _two_sequences()
    c = sequence_truncated_correction(lr, mask, 2.0)
    # w_0 = min(3, 2) = 2 on its 3 policy tokens; w_1 = min(1.1, 2) = 1.1 on its 2
    torch.testing.assert_close(c.weight, torch.tensor([[2, 0, 2, 2], [1.1, 1.1, 0, 0]], dtype=D), rtol=0, atol=1e-12)
    torch.testing.assert_close(c.keep, mask, rtol=0, atol=0)


def test_sequence_masked_is_drops_whole_sequences_over_the_cap():
    lr, mask = _two_sequences()
    c = sequence_band_correction(lr, mask, 0.0, 2.0, lr)
    torch.testing.assert_close(c.keep, torch.tensor([[0, 0, 0, 0], [1, 1, 0, 0]], dtype=D), rtol=0, atol=0)
    torch.testing.assert_close(c.dropped_high, torch.tensor([[1, 0, 1, 1], [0, 0, 0, 0]], dtype=D), rtol=0, atol=0)
    torch.testing.assert_close(c.weight, torch.tensor([[0, 0, 0, 0], [1.1, 1.1, 0, 0]], dtype=D), rtol=0, atol=1e-12)
    # C = ∞ is plain sequence-level IS: w_i = Π ρ on every policy token of i
    plain = sequence_band_correction(lr, mask, 0.0, math.inf, lr)
    torch.testing.assert_close(
        plain.weight, torch.tensor([[3, 0, 3, 3], [1.1, 1.1, 0, 0]], dtype=D), rtol=0, atol=1e-12
    )
    torch.testing.assert_close(plain.keep, mask, rtol=0, atol=0)


def test_geometric_rejection_hand_values():
    lr, mask = _two_sequences()
    # geometric means: 3^(1/3) ≈ 1.442, 1.1^(1/2) ≈ 1.0488
    c = geometric_band_correction(lr, mask, 1.0, 1.2)
    torch.testing.assert_close(c.keep, torch.tensor([[0, 0, 0, 0], [1, 1, 0, 0]], dtype=D), rtol=0, atol=0)
    torch.testing.assert_close(c.weight, c.keep, rtol=0, atol=0)  # w = 1 on kept sequences
    assert geometric_band_correction(lr, mask, 1.5, 2.0).keep.sum() == 0
    assert geometric_band_correction(lr, mask, 1.44, 1.45).keep[0].sum() == 3


def test_sequence_rules_do_not_overflow_where_float32_would():
    """60 policy tokens of ρ = e^2: Π ρ = e^120 overflows float32; the log-space rules stay finite."""
    lr = torch.full((1, 60), 2.0)
    mask = torch.ones(1, 60)
    assert not torch.isfinite(torch.exp(lr).prod())
    for c in (
        sequence_truncated_correction(lr, mask, 2.0),
        sequence_band_correction(lr, mask, 0.0, 2.0, lr),
        sequence_truncated_correction(lr, mask, math.inf),
    ):
        assert torch.isfinite(c.weight).all()
    assert sequence_truncated_correction(lr, mask, 2.0).weight[0, 0] == pytest.approx(2.0, rel=1e-6)
    assert sequence_band_correction(lr, mask, 0.0, 2.0, lr).keep.sum() == 0
