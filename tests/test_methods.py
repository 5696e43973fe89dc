"""Contract suite: every registry entry goes through the same checks."""

import math

import pytest
import torch
from pydantic import ValidationError

from copc_core.config import MethodConfig, with_overrides
from copc_core.rl.losses import clipped_value_loss
from copc_core.rl.methods import (
    COPC_READING,
    METHODS,
    PolicySide,
    UnknownMethodError,
    actor_loss,
    describe,
    estimate_advantages,
    method_spec,
    policy_terms,
    step_size_scale,
)

ALL = sorted(METHODS)


def stale_batch(seed=0, B=6, T=24):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(B, T, generator=g) > 0.25).float()
    logp_behavior = -torch.rand(B, T, generator=g) * 3
    logp_old = logp_behavior + torch.randn(B, T, generator=g) * 1.5  # strongly off-policy
    rewards = torch.zeros(B, T)
    rewards[:, -1] = (torch.rand(B, generator=g) > 0.5).float()
    mask[:, -1] = 1.0
    return rewards, mask, logp_behavior, logp_old


def lags(mask, k=3):
    return torch.full(mask.shape, k, dtype=torch.long)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("anchor", [None, "behavior", "recomputed", "interpolated"])
def test_contract_every_preset(name, anchor):
    """Every registry row, in every reading: finite; zero where masked; no gradient through targets."""
    rewards, mask, logp_behavior, logp_old = stale_batch()
    spec = MethodConfig(name=name, anchor=anchor).spec()
    values = torch.randn(*mask.shape, requires_grad=True)
    logits = torch.randn(*mask.shape, requires_grad=True)
    logp = logp_old + 0.1 * logits  # a differentiable stand-in for log π_θ
    terms = policy_terms(spec.policy, logp_old, logp_behavior, mask, lags(mask))
    correction = terms.correction
    est = estimate_advantages(spec.advantage, rewards, values, mask, terms.log_ratio, 1.0, 0.95)
    adv, ret = est.output
    for t in (correction.weight, correction.keep, adv, ret, terms.anchor, terms.weight_log_ratio):
        assert torch.isfinite(t).all()
    env = mask == 0
    assert torch.all(adv[env] == 0) and torch.all(ret[env] == 0)
    assert torch.all(correction.weight[env] == 0) and torch.all(correction.keep[env] == 0)
    assert not adv.requires_grad and not ret.requires_grad and not correction.weight.requires_grad
    assert not terms.anchor.requires_grad
    assert torch.all((correction.keep == 0) | (correction.keep == 1))
    assert torch.all(correction.weight >= 0) and torch.all(correction.weight[correction.keep == 0] == 0)
    scale = step_size_scale(spec.policy, terms.log_ratio, mask)
    assert 0 < float(scale) <= 1
    actor = actor_loss(spec.policy, logp, terms.anchor, adv, correction, mask, 0.2, 0.2, 3.0)
    critic = clipped_value_loss(values, values.detach(), ret, mask, 0.2)
    (actor.loss + critic.loss).backward()
    assert torch.isfinite(actor.loss) and torch.isfinite(critic.loss)
    assert torch.isfinite(logits.grad).all() and torch.isfinite(values.grad).all()
    assert torch.all(logits.grad[env] == 0) and torch.all(values.grad[env] == 0)
    assert torch.all(logits.grad[(correction.keep == 0)] == 0)  # a dropped token contributes nothing


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("anchor", [None, "behavior", "recomputed", "interpolated"])
def test_contract_on_policy_batch_is_the_on_policy_update(name, anchor):
    """With μ = π_old every correction is inert (w = 1, nothing dropped, step size 1), every anchor is
    π_old, and every estimator is GAE: each preset takes its own loss's on-policy update."""
    rewards, mask, logp_behavior, _ = stale_batch(seed=1)
    spec = MethodConfig(name=name, anchor=anchor).spec()
    values = torch.randn(*mask.shape)
    terms = policy_terms(spec.policy, logp_behavior, logp_behavior, mask, lags(mask))
    torch.testing.assert_close(terms.correction.keep, mask, rtol=0, atol=0)
    torch.testing.assert_close(terms.correction.weight, mask, rtol=0, atol=0)
    assert torch.equal(terms.anchor, logp_behavior)
    assert float(step_size_scale(spec.policy, terms.log_ratio, mask)) == 1.0
    gae = estimate_advantages(
        METHODS["sync_ppo"].build(None, None)[1], rewards, values, mask, terms.log_ratio, 1.0, 0.95
    )
    est = estimate_advantages(spec.advantage, rewards, values, mask, terms.log_ratio, 1.0, 0.95)
    torch.testing.assert_close(est.output.advantages, gae.output.advantages, rtol=0, atol=1e-6)
    torch.testing.assert_close(est.output.returns, gae.output.returns, rtol=0, atol=1e-6)


# ---- the three readings of the anchor, by hand ----

D = torch.float64


def _reading_batch():
    """One sequence, three policy tokens and an environment token; log ρ = log π_old − log μ = ln 2, −ln 4, 0."""
    logp_mu = torch.log(torch.tensor([[0.25, 0.4, 0.9, 0.5]], dtype=D))
    logp_old = torch.log(torch.tensor([[0.5, 0.1, 0.3, 0.5]], dtype=D))
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0]], dtype=D)
    return logp_old, logp_mu, mask


def test_readings_by_hand():
    logp_old, logp_mu, mask = _reading_batch()
    lag = torch.full((1, 4), 3)  # α = 3/4 under A-3PO's rule
    side = lambda anchor, **kw: PolicySide(kind="ratio_band", low=0.0, high=3.0, anchor=anchor, **kw)  # noqa: E731
    # ρ = 2, 1/4, (env), 1: the band [0, 3] keeps every policy token
    behavior = policy_terms(side("behavior"), logp_old, logp_mu, mask, lag)
    assert torch.equal(behavior.anchor, logp_mu)
    torch.testing.assert_close(behavior.correction.weight, mask, rtol=0, atol=0)  # w = 1: the IS weight is inside r
    recomputed = policy_terms(side("recomputed"), logp_old, logp_mu, mask, lag)
    assert torch.equal(recomputed.anchor, logp_old)
    torch.testing.assert_close(
        recomputed.correction.weight, torch.tensor([[2.0, 0.25, 0.0, 1.0]], dtype=D), rtol=0, atol=1e-12
    )
    inter = policy_terms(side("interpolated"), logp_old, logp_mu, mask, lag)
    # w = π_prox/μ = ρ^α = 2^0.75, 0.25^0.75, 1
    torch.testing.assert_close(
        inter.correction.weight, torch.tensor([[2**0.75, 0.25**0.75, 0.0, 1.0]], dtype=D), rtol=0, atol=1e-12
    )
    torch.testing.assert_close(
        inter.anchor[mask > 0], (logp_mu + 0.75 * (logp_old - logp_mu))[mask > 0], rtol=0, atol=1e-12
    )
    fixed = policy_terms(side("interpolated", alpha=0.5), logp_old, logp_mu, mask, lag)
    torch.testing.assert_close(
        fixed.correction.weight, torch.tensor([[2**0.5, 0.5, 0.0, 1.0]], dtype=D), rtol=0, atol=1e-12
    )
    # the mask is on ρ = π_old/μ in every reading: a band [1/3, 3] drops the token with ρ = 1/4 in all three
    for anchor in ("behavior", "recomputed", "interpolated"):
        band = PolicySide(kind="ratio_band", low=1 / 3, high=3.0, anchor=anchor)
        kept = policy_terms(band, logp_old, logp_mu, mask, lag).correction
        torch.testing.assert_close(kept.keep, torch.tensor([[1.0, 0.0, 0.0, 1.0]], dtype=D), rtol=0, atol=0)
        torch.testing.assert_close(kept.dropped_low, torch.tensor([[0.0, 1.0, 0.0, 0.0]], dtype=D), rtol=0, atol=0)


def test_interpolated_reduces_to_the_other_two_at_alpha_0_and_1():
    rewards, mask, logp_behavior, logp_old = stale_batch(seed=3)
    lag = lags(mask)
    for kind in ("ratio_band", "truncate", "seq_truncate", "seq_band", "m2po"):
        for alpha, other in ((0.0, "behavior"), (1.0, "recomputed")):
            inter = policy_terms(
                PolicySide(kind=kind, low=0.2, high=4.0, cap=2.0, anchor="interpolated", alpha=alpha),
                logp_old,
                logp_behavior,
                mask,
                lag,
            )
            ref = policy_terms(
                PolicySide(kind=kind, low=0.2, high=4.0, cap=2.0, anchor=other), logp_old, logp_behavior, mask, lag
            )
            assert torch.equal(inter.anchor, ref.anchor), (kind, alpha)
            for a, b in zip(inter.correction, ref.correction):
                assert torch.equal(a, b), (kind, alpha)


def test_readings_coincide_when_behavior_equals_old():
    _, mask, logp_behavior, _ = stale_batch(seed=4)
    g = torch.Generator().manual_seed(0)
    logp_new = logp_behavior + 0.05 * torch.randn(*mask.shape, generator=g)
    adv = torch.randn(*mask.shape, generator=g)
    losses = []
    for anchor in ("behavior", "recomputed", "interpolated"):
        side = PolicySide(kind="ratio_band", low=0.5, high=2.0, anchor=anchor)
        terms = policy_terms(side, logp_behavior, logp_behavior, mask, lags(mask))
        losses.append(actor_loss(side, logp_new, terms.anchor, adv, terms.correction, mask, 0.2, 0.2, None).loss)
    assert losses[0] == losses[1] == losses[2]


def test_step_size_follows_the_sequence_ess():
    """VCPO: lr × √(ESS/N), ESS of the sequence weights Π_t ρ_t; by hand for weights 2 and 1/2, 1, 1."""
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0]], dtype=D)
    log_ratio = torch.log(torch.tensor([[2.0, 1.0], [0.5, 1.0], [1.0, 1.0]], dtype=D)) * mask
    side = method_spec("vcpo").policy
    # W = 2, 1/2, 1: (Σ W)² / (N Σ W²) = 3.5² / (3 · 5.25) = 0.7777…
    expected = math.sqrt(3.5**2 / (3 * 5.25))
    assert float(step_size_scale(side, log_ratio, mask)) == pytest.approx(expected, rel=1e-12)
    assert float(step_size_scale(method_spec("copc").policy, log_ratio, mask)) == 1.0


def test_registry_holds_every_preset_of_the_spec():
    assert set(METHODS) == {
        "sync_ppo",
        "async_ppo",
        "async_ppo_recompute",
        "decoupled_ppo",
        "tis",
        "icepop",
        "m2po",
        "vtrace",
        "copc_policy_only",
        "copc_advantage_only",
        "copc",
        "seq_tis",
        "seq_mis",
        "geo_rs",
        "cispo",
        "vcpo",
        "a3po",
    }
    assert METHODS["sync_ppo"].on_policy and not METHODS["copc"].on_policy


def test_unknown_method_lists_valid_names():
    with pytest.raises(UnknownMethodError) as err:
        method_spec("ppo2")
    for name in ALL:
        assert name in str(err.value)
    with pytest.raises(ValueError, match="valid methods"):
        MethodConfig(name="nope")


def test_copc_bands_follow_the_taus():
    spec = MethodConfig(name="copc", tau_policy=4.0, tau_advantage=1.5).spec()
    assert (spec.policy.low, spec.policy.high) == (0.25, 4.0)
    assert spec.advantage.tau == 1.5 and spec.advantage.clip == "two_sided"
    unbounded = MethodConfig(name="copc", tau_policy=math.inf).spec()
    assert unbounded.policy.low == 0.0 and unbounded.policy.high == math.inf


def test_taus_and_options_a_method_does_not_read_are_errors():
    with pytest.raises(ValueError, match="has no tau_policy"):
        MethodConfig(name="tis", tau_policy=2.0)
    with pytest.raises(ValueError, match="has no tau_advantage"):
        MethodConfig(name="copc_policy_only", tau_advantage=2.0)
    with pytest.raises(ValueError, match="no effect"):
        MethodConfig(name="async_ppo", return_target="gae")
    with pytest.raises(ValueError):
        MethodConfig(name="copc", tau_policy=0.5)
    with pytest.raises(ValueError):
        MethodConfig(name="copc", tau_advantage=float("nan"))


def test_options_reach_the_spec_and_overrides_revalidate():
    cfg = MethodConfig(
        name="copc", policy_weight="one", loss_denominator="kept", return_target="gae", advantage_clip="one_sided"
    )
    spec = cfg.spec()
    assert spec.policy.weight == "one" and spec.policy.loss_denominator == "kept"
    assert spec.advantage.return_target == "gae" and spec.advantage.clip == "one_sided"
    assert with_overrides(cfg, {"tau_policy": 3.0}).spec().policy.high == 3.0
    with pytest.raises(ValueError):
        with_overrides(cfg, {"tau_policy": -1.0})
    with pytest.raises(KeyError):
        with_overrides(cfg, {"tau_polcy": 3.0})


def test_config_round_trips_through_json_with_infinite_tau():
    cfg = MethodConfig(name="copc", tau_policy=math.inf, tau_advantage=2.0)
    again = MethodConfig.model_validate_json(cfg.model_dump_json())
    assert again == cfg


def test_config_is_frozen_and_strict():
    cfg = MethodConfig()
    with pytest.raises(ValidationError):
        cfg.name = "tis"
    with pytest.raises(ValueError):
        MethodConfig(tau_p=2.0)


def test_defaults_checked_against_their_sources():
    """The values `copc methods` cites: verl rollout_corr, SkyRL/ScaleRL CISPO, AReaL M2PO and A-3PO."""
    assert method_spec("seq_tis").policy.cap == 2.0
    assert (method_spec("seq_mis").policy.low, method_spec("seq_mis").policy.high) == (0.0, 2.0)
    assert (method_spec("geo_rs").policy.low, method_spec("geo_rs").policy.high) == (0.999, 1.001)
    cispo = method_spec("cispo").policy
    assert (cispo.loss, cispo.anchor, 1 - cispo.is_clip_low, 1 + cispo.is_clip_high) == ("cispo", "behavior", 0.0, 5.0)
    assert method_spec("m2po").policy.loss == "unclipped" and method_spec("m2po").policy.m2_threshold == 0.04
    a3po = method_spec("a3po").policy
    assert (a3po.anchor, a3po.alpha, a3po.high) == ("interpolated", None, 5.0)
    assert method_spec("vcpo").policy.step_size == "ess"
    for name in ALL:  # every row says what it runs and where it comes from
        assert METHODS[name].source and describe(method_spec(name))


def test_reading_options_are_validated():
    assert MethodConfig(name="copc", anchor="behavior").spec().policy.anchor == "behavior"
    assert MethodConfig(name="copc", anchor="interpolated", anchor_alpha=0.3).spec().policy.alpha == 0.3
    with pytest.raises(ValueError, match="interpolated"):
        MethodConfig(name="copc", anchor="recomputed", anchor_alpha=0.3)  # α without the interpolated anchor
    with pytest.raises(ValueError, match="interpolated"):
        MethodConfig(name="tis", anchor_alpha=0.3)  # tis's own anchor is recomputed
    with pytest.raises(ValueError, match="interpolated"):
        MethodConfig(name="copc", anchor_alpha=0.3)  # copc's default reading is not the interpolated one
    with pytest.raises(ValueError, match="no effect"):
        MethodConfig(name="tis", mask_ratio="live")  # no band to test live
    with pytest.raises(ValueError):
        MethodConfig(name="copc", anchor="proximal")
    assert MethodConfig(name="copc", mask_ratio="live").spec().policy.mask_ratio == "live"


def test_copc_and_its_ablations_share_the_default_reading():
    """Each ablation drops one channel of COPC and keeps the trust region's reading; the reading is one option away."""
    assert {method_spec(m).policy.anchor for m in ("copc", "copc_policy_only", "copc_advantage_only")} == {COPC_READING}
    assert COPC_READING == "recomputed"  # docs/journal/2026-12-05-4-evening.md: the rule and the fresh seeds
    for reading in ("behavior", "interpolated"):
        assert MethodConfig(name="copc", anchor=reading).spec().policy.anchor == reading
    copc, policy_only = method_spec("copc", 2.0, 2.0), method_spec("copc_policy_only", 2.0)
    assert copc.policy == policy_only.policy and policy_only.advantage.kind == "gae"
    assert method_spec("copc_advantage_only", None, 2.0).advantage == copc.advantage
    assert method_spec("copc_advantage_only", None, 2.0).policy.kind == "none"
