"""Contract suite: every registry entry goes through the same checks."""

import math

import pytest
import torch

from copc_core.config import MethodConfig, with_overrides
from copc_core.losses import clipped_value_loss, ppo_actor_loss
from copc_core.methods import (
    METHODS,
    UnknownMethodError,
    correct_policy,
    estimate_advantages,
    method_spec,
)
from copc_core.corrections import behavior_log_ratio

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


@pytest.mark.parametrize("name", ALL)
def test_contract_every_preset(name):
    rewards, mask, logp_behavior, logp_old = stale_batch()
    spec = MethodConfig(name=name).spec()
    values = torch.randn(*mask.shape, requires_grad=True)
    logits = torch.randn(*mask.shape, requires_grad=True)
    logp = logp_old + 0.1 * logits  # a differentiable stand-in for log π_θ
    log_ratio = behavior_log_ratio(logp_old, logp_behavior, mask)
    correction = correct_policy(spec.policy, log_ratio, mask)
    est = estimate_advantages(spec.advantage, rewards, values, mask, log_ratio, 1.0, 0.95)
    adv, ret = est.output
    # finite; zero where masked; no gradient through targets
    for t in (correction.weight, correction.keep, adv, ret):
        assert torch.isfinite(t).all()
    env = mask == 0
    assert torch.all(adv[env] == 0) and torch.all(ret[env] == 0)
    assert torch.all(correction.weight[env] == 0) and torch.all(correction.keep[env] == 0)
    assert not adv.requires_grad and not ret.requires_grad and not correction.weight.requires_grad
    assert torch.all((correction.keep == 0) | (correction.keep == 1))
    anchor = logp_behavior if spec.policy.anchor == "behavior" else logp_old
    actor = ppo_actor_loss(logp, anchor, adv, correction.weight, correction.keep, mask, 0.2, 0.2, 3.0,
                           spec.policy.loss_denominator == "kept")
    critic = clipped_value_loss(values, values.detach(), ret, mask, 0.2)
    (actor.loss + critic.loss).backward()
    assert torch.isfinite(actor.loss) and torch.isfinite(critic.loss)
    assert torch.isfinite(logits.grad).all() and torch.isfinite(values.grad).all()
    assert torch.all(logits.grad[env] == 0) and torch.all(values.grad[env] == 0)


@pytest.mark.parametrize("name", ALL)
def test_contract_on_policy_batch_is_plain_ppo(name):
    """With μ = π_old every correction is inert and every estimator is GAE."""
    rewards, mask, logp_behavior, _ = stale_batch(seed=1)
    spec = MethodConfig(name=name).spec()
    values = torch.randn(*mask.shape)
    log_ratio = behavior_log_ratio(logp_behavior, logp_behavior, mask)
    correction = correct_policy(spec.policy, log_ratio, mask)
    torch.testing.assert_close(correction.keep, mask, rtol=0, atol=0)
    torch.testing.assert_close(correction.weight, mask, rtol=0, atol=0)
    gae = estimate_advantages(METHODS["sync_ppo"].build(None, None)[1], rewards, values, mask, log_ratio, 1.0, 0.95)
    est = estimate_advantages(spec.advantage, rewards, values, mask, log_ratio, 1.0, 0.95)
    torch.testing.assert_close(est.output.advantages, gae.output.advantages, rtol=0, atol=1e-6)
    torch.testing.assert_close(est.output.returns, gae.output.returns, rtol=0, atol=1e-6)


def test_registry_holds_every_preset_of_the_spec():
    assert set(METHODS) == {"sync_ppo", "async_ppo", "async_ppo_recompute", "decoupled_ppo", "tis", "icepop",
                            "m2po", "vtrace", "copc_policy_only", "copc_advantage_only", "copc"}
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
    cfg = MethodConfig(name="copc", policy_weight="one", loss_denominator="kept", return_target="gae",
                       advantage_clip="one_sided")
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
    with pytest.raises(Exception):
        cfg.name = "tis"
    with pytest.raises(ValueError):
        MethodConfig(tau_p=2.0)
