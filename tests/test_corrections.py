import math

import pytest
import torch

from copc_core.corrections import (
    behavior_log_ratio,
    m2po_correction,
    no_correction,
    ratio_band_correction,
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
    c = ratio_band_correction(lr, mask, 0.5, 2.0, weight_by_ratio=True)
    torch.testing.assert_close(c.keep, torch.tensor([[0, 1, 1, 1, 0]], dtype=D), rtol=0, atol=0)
    torch.testing.assert_close(c.weight, torch.tensor([[0, 0.5, 1.0, 2.0, 0]], dtype=D), rtol=0, atol=1e-12)
    torch.testing.assert_close(c.dropped_low, torch.tensor([[1, 0, 0, 0, 0]], dtype=D), rtol=0, atol=0)
    torch.testing.assert_close(c.dropped_high, torch.tensor([[0, 0, 0, 0, 1]], dtype=D), rtol=0, atol=0)
    ones = ratio_band_correction(lr, mask, 0.5, 2.0, weight_by_ratio=False)
    torch.testing.assert_close(ones.weight, c.keep, rtol=0, atol=0)


def test_infinite_band_masks_nothing():
    lr = torch.randn(4, 9, dtype=D) * 10
    mask = (torch.rand(4, 9) > 0.3).to(D)
    c = ratio_band_correction(lr, mask, 1.0 / math.inf, math.inf, weight_by_ratio=True)
    torch.testing.assert_close(c.keep, mask, rtol=0, atol=0)
    assert c.dropped_low.sum() == 0 and c.dropped_high.sum() == 0
    torch.testing.assert_close(c.weight, torch.exp(lr) * mask, rtol=0, atol=0)


def test_environment_tokens_are_never_kept_or_counted():
    lr = ratios(100.0, 0.001, 1.0)
    mask = torch.tensor([[0.0, 0.0, 1.0]], dtype=D)
    for c in (ratio_band_correction(lr, mask, 0.5, 2.0, True), truncated_ratio_correction(lr, mask, 2.0),
              m2po_correction(lr, mask, 0.04, True), no_correction(lr, mask)):
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
    c = m2po_correction(lr, mask, 0.04, weight_by_ratio=True)
    dropped = c.dropped_low + c.dropped_high
    torch.testing.assert_close(dropped, m2po_reference(lr, mask, 0.04), rtol=0, atol=0)
    kept = c.keep > 0
    assert (lr[kept] ** 2).mean() < 0.04
    torch.testing.assert_close(c.dropped_high, dropped * (lr > 0), rtol=0, atol=0)


def test_m2po_drops_nothing_when_already_small():
    lr = torch.full((2, 4), 0.1, dtype=D)
    c = m2po_correction(lr, torch.ones(2, 4, dtype=D), 0.04, True)
    assert c.keep.sum() == 8


def test_bad_bands_are_rejected():
    lr, m = ratios(1.0), torch.ones(1, 1, dtype=D)
    with pytest.raises(ValueError):
        ratio_band_correction(lr, m, 2.0, 1.0, True)
    with pytest.raises(ValueError):
        truncated_ratio_correction(lr, m, 0.0)
    with pytest.raises(ValueError):
        m2po_correction(lr, m, -1.0, True)
