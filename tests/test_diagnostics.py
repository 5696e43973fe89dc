import math

import pytest
import torch

from copc_core.rl.corrections import no_correction, ratio_band_correction
from copc_core.rl.diagnostics import (
    behavior_kl,
    effective_sample_size,
    exact_kl,
    explained_variance,
    ratio_diagnostics,
    sequence_effective_sample_size,
    trace_diagnostics,
)

D = torch.float64


def test_ess_hand_values():
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=D)
    w = torch.tensor([[1.0, 3.0, 100.0]], dtype=D)
    # (1 + 3)² / (2 · (1 + 9)) = 0.8; the environment token's weight is ignored
    torch.testing.assert_close(effective_sample_size(w, mask), torch.tensor(0.8, dtype=D), rtol=0, atol=1e-12)
    torch.testing.assert_close(
        effective_sample_size(torch.full((2, 5), 3.0, dtype=D), torch.ones(2, 5, dtype=D)),
        torch.tensor(1.0, dtype=D),
        rtol=0,
        atol=1e-12,
    )


def test_ess_of_near_uniform_float32_weights_stays_within_its_bound():
    """ESS ≤ 1 by Cauchy–Schwarz; float32 sums of weights 1 ± 1e-5 (a step on policy: the sampler's and the
    learner's log-probs agree to rounding) overshot it in about a third of such draws (CI's HF test read 1.0000001)."""
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        w = torch.exp(torch.randn(64, 100, generator=g) * 1e-5)
        mask = (torch.rand(64, 100, generator=g) < 0.7).float()
        ess = effective_sample_size(w, mask)
        exact = effective_sample_size(w.double(), mask.double())
        assert ess.dtype == torch.float32 and 0.0 < ess.item() <= 1.0
        assert abs(ess.item() - exact.item()) <= 6e-8  # float32's rounding of the float64 value


def test_sequence_ess_equals_direct_formula():
    g = torch.Generator().manual_seed(0)
    lr = torch.randn(6, 10, generator=g, dtype=D) * 0.3
    mask = (torch.rand(6, 10, generator=g) > 0.3).to(D)
    W = torch.exp((lr * mask).sum(1))
    direct = W.sum() ** 2 / (6 * (W**2).sum())
    torch.testing.assert_close(sequence_effective_sample_size(lr, mask), direct, rtol=1e-12, atol=0)
    huge = torch.full((3, 200), 20.0, dtype=D)  # Π ρ = e^4000: only the log-space form survives
    torch.testing.assert_close(
        sequence_effective_sample_size(huge, torch.ones(3, 200, dtype=D)),
        torch.tensor(1.0, dtype=D),
        rtol=1e-12,
        atol=0,
    )


def test_ratio_diagnostics_hand_values():
    rho = torch.tensor([[0.5, 1.0, 4.0, 7.0]], dtype=D)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]], dtype=D)
    lr = torch.log(rho) * mask
    corr = ratio_band_correction(lr, mask, 0.5, 2.0, lr)
    d = ratio_diagnostics(lr, mask, corr)
    r = torch.tensor([0.5, 1.0, 4.0], dtype=D)
    torch.testing.assert_close(d["correction/chi2"], (r**2).mean() - 1, rtol=0, atol=1e-12)
    torch.testing.assert_close(d["correction/kl_k3"], (r - torch.log(r) - 1).mean(), rtol=0, atol=1e-12)
    torch.testing.assert_close(d["correction/masked_frac_high"], torch.tensor(1 / 3, dtype=D), rtol=0, atol=1e-12)
    torch.testing.assert_close(d["correction/masked_frac_low"], torch.tensor(0.0, dtype=D), rtol=0, atol=0)
    torch.testing.assert_close(d["correction/ratio_max"], torch.tensor(4.0, dtype=D), rtol=0, atol=1e-12)
    torch.testing.assert_close(d["correction/ratio_mean"], r.mean(), rtol=0, atol=1e-12)
    torch.testing.assert_close(d["correction/ratio_p99"], torch.quantile(r, 0.99), rtol=0, atol=1e-12)
    torch.testing.assert_close(d["correction/ess"], r.sum() ** 2 / (3 * (r**2).sum()), rtol=0, atol=1e-12)
    # applied weights: 0.5 and 1.0 kept → (1.5)² / (2 · 1.25) = 0.9
    torch.testing.assert_close(d["correction/ess_applied"], torch.tensor(0.9, dtype=D), rtol=0, atol=1e-12)


def test_trace_diagnostics():
    rho = torch.tensor([[0.25, 1.0, 3.0]], dtype=D)
    mask = torch.ones(1, 3, dtype=D)
    trace = rho.clamp(0.5, 2.0)
    d = trace_diagnostics(torch.log(rho), mask, trace)
    torch.testing.assert_close(d["correction/trace_clip_frac"], torch.tensor(2 / 3, dtype=D), rtol=0, atol=1e-12)
    torch.testing.assert_close(d["correction/trace_mean"], torch.tensor(0.5 * 1.0 * 2.0, dtype=D), rtol=0, atol=1e-12)
    none = trace_diagnostics(torch.log(rho), mask, None)
    assert none["correction/trace_clip_frac"] == 0 and none["correction/trace_mean"] == 1


def test_explained_variance():
    ret = torch.tensor([[1.0, 2.0, 3.0, 99.0]], dtype=D)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]], dtype=D)
    torch.testing.assert_close(explained_variance(ret, ret, mask), torch.tensor(1.0, dtype=D), rtol=0, atol=1e-12)
    zeros = torch.zeros_like(ret)
    torch.testing.assert_close(explained_variance(zeros, ret, mask), torch.tensor(0.0, dtype=D), rtol=0, atol=1e-12)
    # V = v − (1, −1, 0) ⇒ residual variance (2/3) / target variance (2/3) ⇒ 0
    v = ret - torch.tensor([[1.0, -1.0, 0.0, 0.0]], dtype=D)
    torch.testing.assert_close(explained_variance(v, ret, mask), torch.tensor(0.0, dtype=D), rtol=0, atol=1e-12)


def test_on_policy_diagnostics_are_trivial():
    mask = torch.ones(3, 4, dtype=D)
    lr = torch.zeros(3, 4, dtype=D)
    d = ratio_diagnostics(lr, mask, no_correction(lr, mask))
    for key, expected in (
        ("correction/ess", 1.0),
        ("correction/ess_seq", 1.0),
        ("correction/chi2", 0.0),
        ("correction/kl_k3", 0.0),
        ("correction/masked_frac", 0.0),
    ):
        assert math.isclose(float(d[key]), expected, abs_tol=1e-12), key


def test_exact_kl_hand_values_and_masking():
    p = torch.log(torch.tensor([[[0.5, 0.5], [0.9, 0.1], [0.2, 0.8]]], dtype=D))
    q = torch.log(torch.tensor([[[0.25, 0.75], [0.9, 0.1], [0.5, 0.5]]], dtype=D))
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=D)
    # token 0: 0.5 ln 2 + 0.5 ln(2/3); token 1: 0; token 2 is an environment token
    expected = (0.5 * math.log(2) + 0.5 * math.log(0.5 / 0.75)) / 2
    torch.testing.assert_close(exact_kl(p, q, mask), torch.tensor(expected, dtype=D), rtol=0, atol=1e-15)
    torch.testing.assert_close(exact_kl(p, p, torch.ones(1, 3, dtype=D)), torch.tensor(0.0, dtype=D), rtol=0, atol=0)


def test_behavior_kl_per_token_and_per_sequence():
    rho = torch.tensor([[2.0, 0.5, 9.0], [1.0, 4.0, 1.0]], dtype=D)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], dtype=D)
    lr = torch.log(rho) * mask
    k3 = lambda r: r - 1 - math.log(r)  # noqa: E731
    out = behavior_kl(lr, mask)
    per_token = (k3(2) + k3(0.5) + k3(1) + k3(4) + k3(1)) / 5
    per_sequence = ((k3(2) + k3(0.5)) + (k3(1) + k3(4) + k3(1))) / 2
    torch.testing.assert_close(out["staleness/kl_behavior"], torch.tensor(per_token, dtype=D), rtol=0, atol=1e-14)
    torch.testing.assert_close(
        out["staleness/kl_behavior_seq"], torch.tensor(per_sequence, dtype=D), rtol=0, atol=1e-14
    )


def test_behavior_ratio_band_share_and_quantiles_over_policy_tokens_only():
    # policy tokens ρ = 0.5, 0.8, 1.0, 1.25, 2.0 (two inside the band edges count as inside); a masked 100 ignored
    rho = torch.tensor([[0.5, 0.8, 1.0], [1.25, 2.0, 100.0]], dtype=D)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=D)
    out = behavior_kl(torch.log(rho) * mask, mask)
    assert out["staleness/ratio_in_band"].item() == pytest.approx(3 / 5, abs=1e-12)
    # torch.quantile interpolates linearly between order statistics: q = 0.01 · (5 − 1) = 0.04 of the way
    logs = sorted(math.log(r) for r in (0.5, 0.8, 1.0, 1.25, 2.0))
    assert out["staleness/log_ratio_p01"].item() == pytest.approx(logs[0] + 0.04 * (logs[1] - logs[0]), abs=1e-12)
    assert out["staleness/log_ratio_p99"].item() == pytest.approx(logs[3] + 0.96 * (logs[4] - logs[3]), abs=1e-12)
