"""The learner step against a plain reference, and the width cut of its forward passes.

The learner saves work in two ways that must change no number: the first minibatch's forward pass
serves both log π_old / V and that minibatch's update, and every forward pass stops at the last
policy token of its longest episode. The reference below does neither (one full-width no-grad pass
over the whole batch, then a full-width forward per minibatch); in float64 both must agree.
"""

import copy
import math

import pytest
import torch

from copc_core.config import with_overrides
from copc_core.engines.backends import build_model, make_engine
from copc_core.engines.rollout import policy_widths
from copc_core.rl.advantages import masked_whiten
from copc_core.rl.corrections import behavior_log_ratio
from copc_core.rl.diagnostics import sequence_effective_sample_size
from copc_core.rl.losses import clipped_value_loss, ppo_actor_loss
from copc_core.rl.methods import correct_policy, estimate_advantages
from copc_core.rl.tensors import masked_mean
from copc_core.train.learner import CRITIC_PARAMETERS, Learner, response_distributions, response_logprobs, rows_logprobs
from copc_core.train.trainer import ProblemStream, sampling_generator
from tests.conftest import tiny_config


@pytest.fixture(scope="module")
def batch_and_model(tiny_warm_state):
    """A sampled batch (direct guesses are short, tool use is long) and the warm-started model in float64."""
    cfg = tiny_config(method="copc", staleness=2, tau_policy=1.5, tau_advantage=2.0)
    sampler = make_engine(cfg)
    sampler.load_weights(tiny_warm_state, 0)
    batch = sampler.sample(ProblemStream(cfg, 0).batch(0, 32), 0, sampling_generator(0, 0))
    # a behaviour policy that is not the learner's: the corrections and traces have work to do
    batch.logp_behavior = torch.where(
        batch.mask > 0,
        batch.logp_behavior + 0.4 * torch.randn(batch.mask.shape, generator=torch.Generator().manual_seed(3)),
        0.0,
    )
    model = build_model(cfg, 0)
    model.load_state_dict(tiny_warm_state)
    return cfg, batch, model.double()


def test_the_batch_has_episodes_of_different_widths(batch_and_model):
    _, batch, _ = batch_and_model
    widths = policy_widths(batch.mask)
    assert widths.min() < widths.max() < batch.mask.shape[1] + 1
    # the width is the last policy token, by a loop
    for i in range(batch.size):
        policy = [t for t in range(batch.mask.shape[1]) if batch.mask[i, t] > 0]
        assert widths[i] == (policy[-1] + 1 if policy else 0)


def test_rows_logprobs_equal_the_full_forward_up_to_the_width_and_zero_after(batch_and_model):
    _, batch, model = batch_and_model
    rows = policy_widths(batch.mask).argsort()[:8]  # the shortest episodes: the cut is real
    with torch.no_grad():
        cut = rows_logprobs(model, batch, rows, 1.0)
        full = response_logprobs(model, batch.select(rows), 1.0)
    width = int(policy_widths(batch.mask[rows]).max())
    assert width < batch.mask.shape[1]
    for c, f in zip(cut, full):
        assert c.shape == f.shape
        torch.testing.assert_close(c[:, :width], f[:, :width], rtol=0, atol=1e-12)
        assert (c[:, width:] == 0).all()


def reference_step(model, config, batch, generator) -> dict[str, float]:
    """One PPO step the plain way (the learner's own loss and estimator functions, no shortcuts)."""
    m, t = config.method, config.train
    spec = config.method.spec()
    optimizer = torch.optim.Adam(model.parameters(), lr=t.lr)
    mask, B = batch.mask, batch.size
    mb = B // t.minibatches
    with torch.no_grad():
        logp_old, values_old, _ = response_logprobs(model, batch, t.temperature)
    log_ratio = behavior_log_ratio(logp_old, batch.logp_behavior, mask)
    assert (
        spec.policy.anchor == "recomputed" and spec.policy.loss == "ppo_clip"
    )  # the reading this reference writes out
    correction = correct_policy(spec.policy, log_ratio, log_ratio, mask)  # w = ρ = π_old/μ inside the band
    advantages, returns = estimate_advantages(
        spec.advantage, batch.rewards, values_old, mask, log_ratio, m.gamma, m.lam
    ).output
    advantages = masked_whiten(advantages, mask)
    anchor = logp_old
    losses = []
    for _ in range(t.epochs):
        order = torch.randperm(B, generator=generator)
        for j in range(t.minibatches):
            idx = order[j * mb : (j + 1) * mb]
            logp, values, entropy = response_logprobs(model, batch.select(idx), t.temperature)
            actor = ppo_actor_loss(
                logp,
                anchor[idx],
                advantages[idx],
                correction.weight[idx],
                correction.keep[idx],
                mask[idx],
                m.clip_low,
                m.clip_high,
                m.dual_clip,
                spec.policy.loss_denominator == "kept",
            )
            critic = clipped_value_loss(values, values_old[idx], returns[idx], mask[idx], m.value_clip)
            loss = actor.loss + t.value_coef * critic.loss - t.entropy_coef * masked_mean(entropy, mask[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), t.max_grad_norm)
            optimizer.step()
            losses.append((float(actor.loss.detach()), float(critic.loss.detach())))
    return {
        "actor/loss": sum(a for a, _ in losses) / len(losses),
        "critic/value_loss": sum(c for _, c in losses) / len(losses),
    }


@pytest.mark.parametrize("epochs", [1, 2])
def test_a_learner_step_equals_the_plain_reference(batch_and_model, epochs):
    cfg, batch, model = batch_and_model
    cfg = with_overrides(cfg, {"train.epochs": epochs, "train.minibatches": 4, "method.anchor": "recomputed"})
    ours, theirs = copy.deepcopy(model), copy.deepcopy(model)
    metrics = Learner(ours, cfg, torch.Generator().manual_seed(5)).step(batch)
    reference = reference_step(theirs, cfg, batch, torch.Generator().manual_seed(5))
    for key, value in reference.items():
        assert math.isclose(metrics[key], value, rel_tol=1e-9, abs_tol=1e-12), key
    for (name, a), (_, b) in zip(ours.named_parameters(), theirs.named_parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-9, msg=name)


def test_learner_positions_count_the_tokens_the_model_read(batch_and_model):
    cfg, batch, model = batch_and_model
    model = copy.deepcopy(model)
    read: list[int] = []
    forward = model.forward
    model.forward = lambda idx: (read.append(idx.numel()), forward(idx))[1]
    out = Learner(model, cfg, torch.Generator().manual_seed(0)).step(copy.deepcopy(batch))
    assert out["learner/positions"] == sum(read)
    B, P, T = batch.size, batch.prompt_ids.shape[1], batch.mask.shape[1]
    mb = B // cfg.train.minibatches
    kl_rows = min(cfg.train.kl_step_rows, mb)  # read once more after the update: policy/kl_step
    passes = B + (cfg.train.epochs * cfg.train.minibatches - 1) * mb + kl_rows  # all once, every update but the first
    assert sum(read) < passes * (P + T - 1)  # the width cut saved work
    assert sum(read) >= passes * (P - 1 + int(policy_widths(batch.mask).min()))


# ---- the diagnostics of a step, against independent computations ----


def test_kl_step_is_the_exact_kl_between_the_weights_before_and_after(batch_and_model):
    cfg, batch, model = batch_and_model
    B = batch.size
    mb = B // cfg.train.minibatches
    cfg = with_overrides(cfg, {"train.kl_step_rows": mb})  # every episode of the first minibatch
    before, ours = copy.deepcopy(model), copy.deepcopy(model)
    out = Learner(ours, cfg, torch.Generator().manual_seed(7)).step(batch)
    rows = torch.randperm(B, generator=torch.Generator().manual_seed(7))[:mb]  # the learner's first draw
    sub = batch.select(rows)
    with torch.no_grad():
        p, _ = response_distributions(before, sub, 1.0)
        q, _ = response_distributions(ours, sub, 1.0)
    kl = 0.0
    for i in range(mb):  # Σ_v p (log p − log q) per policy token, by a loop
        for t in range(sub.mask.shape[1]):
            if sub.mask[i, t] > 0:
                kl += float((p[i, t].exp() * (p[i, t] - q[i, t])).sum())
    expected = kl / float(sub.mask.sum())
    assert expected > 0
    assert out["policy/kl_step"] == pytest.approx(expected, rel=1e-9, abs=1e-15)
    sampled_before = p.gather(-1, sub.response_ids[..., None])[..., 0]
    sampled_after = q.gather(-1, sub.response_ids[..., None])[..., 0]
    x = (sampled_after - sampled_before)[sub.mask > 0]
    assert out["policy/kl_step_k3"] == pytest.approx(float((torch.expm1(-x) + x).mean()), rel=1e-9)


def test_kl_step_off_reads_nothing_more(batch_and_model):
    cfg, batch, model = batch_and_model
    on = Learner(copy.deepcopy(model), cfg, torch.Generator().manual_seed(0)).step(batch)
    off = Learner(
        copy.deepcopy(model), with_overrides(cfg, {"train.kl_step_rows": 0}), torch.Generator().manual_seed(0)
    ).step(batch)
    assert "policy/kl_step" not in off
    mb_rows = min(cfg.train.kl_step_rows, batch.size // cfg.train.minibatches)
    assert on["learner/positions"] > off["learner/positions"]
    assert on["actor/loss"] == off["actor/loss"] and on["critic/value_loss"] == off["critic/value_loss"]
    assert mb_rows > 0


def test_staleness_in_versions_and_updates(batch_and_model):
    cfg, batch, model = batch_and_model
    learner = Learner(copy.deepcopy(model), cfg, torch.Generator().manual_seed(0))
    learner.version = 3  # the batch was sampled with version 0: every token is 3 versions old
    out = learner.step(copy.deepcopy(batch))
    assert out["staleness/mean"] == 3.0 and out["staleness/max"] == 3.0
    assert out["staleness/updates"] == 3.0 * cfg.train.minibatches * cfg.train.epochs


def test_behavior_kl_and_lr_scale_from_the_batch(batch_and_model):
    cfg, batch, model = batch_and_model
    vcpo = with_overrides(cfg, {"method.name": "vcpo", "method.tau_policy": None, "method.tau_advantage": None})
    learner = Learner(copy.deepcopy(model), vcpo, torch.Generator().manual_seed(0))
    with torch.no_grad():
        logp_old, _, _ = response_logprobs(model, batch, 1.0)
    log_ratio = behavior_log_ratio(logp_old, batch.logp_behavior, batch.mask)
    out = learner.step(batch)
    scale = math.sqrt(float(sequence_effective_sample_size(log_ratio, batch.mask)))
    assert 0 < scale < 1 and out["actor/lr_scale"] == pytest.approx(scale, rel=1e-9)
    assert learner.optimizer.param_groups[0]["lr"] == vcpo.train.lr  # restored after the step
    mask = batch.mask > 0
    k3 = (torch.expm1(log_ratio) - log_ratio)[mask]
    assert out["staleness/kl_behavior"] == pytest.approx(float(k3.mean()), rel=1e-9)


def test_live_mask_equals_the_old_one_when_one_minibatch_reads_pi_old(batch_and_model):
    """With one minibatch and one epoch, π_θ = π_old at the only forward pass: live = old, to the bit."""
    cfg, batch, model = batch_and_model
    one = with_overrides(cfg, {"train.minibatches": 1})
    results = []
    for mask_ratio in ("old", "live"):
        m = copy.deepcopy(model)
        Learner(m, with_overrides(one, {"method.mask_ratio": mask_ratio}), torch.Generator().manual_seed(0)).step(batch)
        results.append(m)
    for (name, a), (_, b) in zip(results[0].named_parameters(), results[1].named_parameters()):
        assert torch.equal(a, b), name
    several = [
        Learner(
            copy.deepcopy(model),
            with_overrides(cfg, {"train.epochs": 3, "method.mask_ratio": r}),
            torch.Generator().manual_seed(0),
        ).step(batch)
        for r in ("old", "live")
    ]
    assert several[0]["correction/masked_frac"] != several[1]["correction/masked_frac"]


def test_critic_lambda_changes_the_critic_target_only(batch_and_model):
    cfg, batch, model = batch_and_model
    base = Learner(copy.deepcopy(model), cfg, torch.Generator().manual_seed(0)).step(batch)
    decoupled = Learner(
        copy.deepcopy(model), with_overrides(cfg, {"method.critic_lam": 1.0}), torch.Generator().manual_seed(0)
    ).step(batch)
    same = Learner(
        copy.deepcopy(model),
        with_overrides(cfg, {"method.critic_lam": cfg.method.lam}),
        torch.Generator().manual_seed(0),
    ).step(batch)
    assert same["critic/value_loss"] == base["critic/value_loss"] and same["actor/loss"] == base["actor/loss"]
    assert decoupled["critic/return_mean"] != base["critic/return_mean"]
    one = with_overrides(cfg, {"train.minibatches": 1})  # the actor loss is read once, before any update
    actor = [
        Learner(
            copy.deepcopy(model), with_overrides(one, {"method.critic_lam": lam}), torch.Generator().manual_seed(0)
        ).step(batch)
        for lam in (None, 1.0)
    ]
    assert actor[0]["actor/loss"] == actor[1]["actor/loss"]
    assert actor[0]["critic/value_loss"] != actor[1]["critic/value_loss"]


def _split(model):
    critic = {n: p.detach().clone() for n, p in model.named_parameters() if n.startswith(CRITIC_PARAMETERS)}
    policy = {n: p.detach().clone() for n, p in model.named_parameters() if not n.startswith(CRITIC_PARAMETERS)}
    return policy, critic


@pytest.mark.parametrize("separate", [False, True])
def test_critic_warmup_moves_only_the_critic(tiny_warm_state, batch_and_model, separate):
    cfg, batch, _ = batch_and_model
    cfg = with_overrides(cfg, {"model.separate_critic": separate})
    model = build_model(cfg, 0)
    model.load_state_dict(tiny_warm_state, strict=not separate)  # a separate critic trunk starts from its init
    learner = Learner(model, cfg, torch.Generator().manual_seed(0))
    policy_before, critic_before = _split(model)
    record = learner.warm_up_critic(copy.deepcopy(batch))
    policy_after, critic_after = _split(model)
    assert learner.version == 0 and learner.critic_warmup_steps == 1 and record["warmup/step"] == 1.0
    for name in policy_before:  # the policy is untouched, to the bit (a shared trunk included)
        assert torch.equal(policy_before[name], policy_after[name]), name
    moved = [n for n in critic_before if not torch.equal(critic_before[n], critic_after[n])]
    assert "value_head.weight" in moved
    assert any(n.startswith("critic_trunk") for n in moved) == separate
    losses = [learner.warm_up_critic(copy.deepcopy(batch))["critic/value_loss"] for _ in range(20)]
    assert losses[-1] < losses[0]  # it learns the batch's returns


def test_critic_learning_rate_scale_sets_its_parameter_group(batch_and_model):
    cfg, _, model = batch_and_model
    learner = Learner(
        copy.deepcopy(model), with_overrides(cfg, {"train.critic_lr_scale": 10.0}), torch.Generator().manual_seed(0)
    )
    policy, critic = learner.optimizer.param_groups
    assert policy["lr"] == cfg.train.lr and critic["lr"] == pytest.approx(10 * cfg.train.lr)
    names = {id(p): n for n, p in learner.model.named_parameters()}
    assert {names[id(p)] for p in critic["params"]} == {"value_head.weight", "value_head.bias"}
    assert len(policy["params"]) + len(critic["params"]) == len(list(learner.model.parameters()))
