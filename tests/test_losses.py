import pytest
import torch

from copc_core.rl.losses import cispo_actor_loss, clipped_value_loss, ppo_actor_loss

D = torch.float64


def one(x):
    return torch.tensor([[x]], dtype=D)


def actor(logp, anchor, adv, weight=1.0, keep=1.0, mask=1.0, dual=None, by_kept=False):
    return ppo_actor_loss(one(logp), one(anchor), one(adv), one(weight), one(keep), one(mask), 0.2, 0.2, dual, by_kept)


def test_hand_derived_clipped_surrogate():
    import math

    # r = 1.5, Â = +1: min(1.5, 1.2) = 1.2 → loss −1.2·w
    out = actor(math.log(1.5), 0.0, 1.0, weight=0.5)
    torch.testing.assert_close(out.loss, torch.tensor(-0.6, dtype=D), rtol=0, atol=1e-12)
    assert out.clipfrac == 1.0
    # r = 1.5, Â = −1: min(−1.5, −1.2) = −1.5 → loss 1.5
    torch.testing.assert_close(actor(math.log(1.5), 0.0, -1.0).loss, torch.tensor(1.5, dtype=D), rtol=0, atol=1e-12)
    # dual clip c = 3 caps the negative-advantage loss: r = 10, Â = −1 → min(10, 3) = 3
    torch.testing.assert_close(
        actor(math.log(10.0), 0.0, -1.0, dual=3.0).loss, torch.tensor(3.0, dtype=D), rtol=0, atol=1e-12
    )


def test_matches_loop_reference_and_denominators():
    g = torch.Generator().manual_seed(0)
    B, T = 3, 8
    logp = torch.randn(B, T, generator=g, dtype=D) * 0.3
    anchor = torch.randn(B, T, generator=g, dtype=D) * 0.3
    adv = torch.randn(B, T, generator=g, dtype=D)
    weight = torch.rand(B, T, generator=g, dtype=D) * 2
    mask = (torch.rand(B, T, generator=g) > 0.2).to(D)
    keep = mask * (torch.rand(B, T, generator=g) > 0.3).to(D)
    total, n_mask, n_keep = 0.0, 0, 0
    for i in range(B):
        for t in range(T):
            n_mask += int(mask[i, t])
            if keep[i, t] == 0:
                continue
            n_keep += 1
            r = float(torch.exp(logp[i, t] - anchor[i, t]))
            a = float(adv[i, t])
            total += -float(weight[i, t]) * min(r * a, min(max(r, 0.8), 1.2) * a)
    for by_kept, n in ((False, n_mask), (True, n_keep)):
        out = ppo_actor_loss(logp, anchor, adv, weight * keep, keep, mask, 0.2, 0.2, None, by_kept)
        torch.testing.assert_close(out.loss, torch.tensor(total / n, dtype=D), rtol=0, atol=1e-12)


def test_ratio_of_exp_89_gives_finite_loss_and_gradient():
    logp = torch.tensor([[89.0, 0.0, -89.0]], dtype=torch.float32, requires_grad=True)
    anchor = torch.zeros(1, 3)
    adv = torch.tensor([[1.0, 1.0, -1.0]])
    ones = torch.ones(1, 3)
    for dual in (None, 3.0):
        out = ppo_actor_loss(logp, anchor, adv, ones, ones, ones, 0.2, 0.2, dual, False)
        (grad,) = torch.autograd.grad(out.loss, logp)
        assert torch.isfinite(out.loss) and torch.isfinite(grad).all()
        assert grad[0, 0] == 0  # clamped and clipped: no push from an absurd ratio


def test_masked_and_dropped_positions_holding_inf_are_inert():
    logp = torch.tensor([[0.1, float("-inf"), float("nan")]], requires_grad=True)
    anchor = torch.tensor([[0.0, 0.0, float("inf")]])
    adv = torch.tensor([[1.0, 5.0, 5.0]])
    keep = torch.tensor([[1.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    out = ppo_actor_loss(logp, anchor, adv, keep, keep, mask, 0.2, 0.2, None, False)
    (grad,) = torch.autograd.grad(out.loss, logp)
    assert torch.isfinite(out.loss) and torch.isfinite(grad).all()
    assert grad[0, 1] == 0 and grad[0, 2] == 0


def test_bad_clip_arguments():
    with pytest.raises(ValueError):
        ppo_actor_loss(*(torch.zeros(1, 1) for _ in range(6)), 1.5, 0.2, None, False)
    with pytest.raises(ValueError):
        ppo_actor_loss(*(torch.zeros(1, 1) for _ in range(6)), 0.2, 0.2, 0.5, False)


def test_value_loss_hand_derived_and_clipped():
    values = torch.tensor([[1.0, 0.0, 3.0]], dtype=D, requires_grad=True)
    old = torch.tensor([[0.5, 0.0, 0.0]], dtype=D)
    ret = torch.tensor([[2.0, 7.0, 1.0]], dtype=D, requires_grad=True)
    mask = torch.tensor([[1.0, 0.0, 1.0]], dtype=D)
    out = clipped_value_loss(values, old, ret, mask, clip=0.2)
    # token 0: unclipped (1−2)² = 1; clipped V = 0.7 → (0.7−2)² = 1.69 → max 1.69
    # token 2: unclipped (3−1)² = 4; clipped V = 0.2 → (0.2−1)² = 0.64 → max 4
    torch.testing.assert_close(out.loss, torch.tensor(0.5 * (1.69 + 4.0) / 2, dtype=D), rtol=0, atol=1e-12)
    torch.testing.assert_close(out.clipfrac, torch.tensor(0.5, dtype=D), rtol=0, atol=0)
    out.loss.backward()
    assert ret.grad is None  # no gradient through the critic target
    unclipped = clipped_value_loss(values, old, ret, mask, clip=None)
    torch.testing.assert_close(unclipped.loss, torch.tensor(0.5 * (1.0 + 4.0) / 2, dtype=D), rtol=0, atol=1e-12)


def _grad(loss_fn, log_r, adv):
    logp = torch.tensor([[log_r]], dtype=D, requires_grad=True)
    loss = loss_fn(logp, torch.zeros(1, 1, dtype=D), one(adv), one(0.5), one(1.0), one(1.0)).loss
    (grad,) = torch.autograd.grad(loss, logp)
    return float(grad)


@pytest.mark.parametrize("r,adv", [(1.5, 1.0), (1.1, 1.0), (0.5, -1.0), (0.7, 1.0), (1.5, -1.0)])
def test_cispo_gradient_is_the_clipped_ratio_times_the_advantage(r, adv):
    """∂L/∂log π = −w · clip(r, 1 − ε_lo, 1 + ε_hi) · Â: never 0, unlike PPO's clipped branch."""
    import math

    cispo = lambda *a: cispo_actor_loss(*a, 0.2, 0.2, False)  # noqa: E731
    ppo = lambda *a: ppo_actor_loss(*a, 0.2, 0.2, None, False)  # noqa: E731
    w, clipped = 0.5, min(max(r, 0.8), 1.2)
    assert _grad(cispo, math.log(r), adv) == pytest.approx(-w * clipped * adv, rel=1e-12)
    ppo_grad = _grad(ppo, math.log(r), adv)
    if clipped * adv < r * adv:  # PPO's clip is active: its gradient vanishes, CISPO's does not
        assert ppo_grad == 0.0
    else:
        assert ppo_grad == pytest.approx(-w * r * adv, rel=1e-12)


def test_unclipped_surrogate_is_ppo_with_open_bounds():
    """ε_lo = 1, ε_hi = ∞: clip(r, 0, ∞) = r, so the loss is −w·r·Â whatever r is."""
    import math

    for r, adv in ((3.0, 1.0), (0.1, -1.0), (1.0, 2.0)):
        out = ppo_actor_loss(
            one(math.log(r)), one(0.0), one(adv), one(0.5), one(1.0), one(1.0), 1.0, math.inf, None, False
        )
        torch.testing.assert_close(out.loss, torch.tensor(-0.5 * r * adv, dtype=D), rtol=1e-12, atol=0)
        assert out.clipfrac == 0


def test_cispo_inert_at_dropped_and_environment_positions():
    logp = torch.tensor([[0.1, float("-inf"), float("nan")]], requires_grad=True)
    anchor = torch.tensor([[0.0, 0.0, float("inf")]])
    adv = torch.tensor([[1.0, 5.0, 5.0]])
    keep = torch.tensor([[1.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    out = cispo_actor_loss(logp, anchor, adv, keep, keep, mask, 1.0, 4.0, False)
    (grad,) = torch.autograd.grad(out.loss, logp)
    assert torch.isfinite(out.loss) and torch.isfinite(grad).all()
    assert grad[0, 1] == 0 and grad[0, 2] == 0
    assert float(grad[0, 0]) == pytest.approx(-float(torch.exp(torch.tensor(0.1))) / 2, rel=1e-6)  # N = Σ mask = 2
