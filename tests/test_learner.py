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

from copc_core.advantages import masked_whiten
from copc_core.config import with_overrides
from copc_core.corrections import behavior_log_ratio
from copc_core.learner import Learner, response_logprobs, rows_logprobs
from copc_core.losses import clipped_value_loss, ppo_actor_loss
from copc_core.methods import correct_policy, estimate_advantages
from copc_core.rollout import policy_widths
from copc_core.tensors import masked_mean
from copc_core.trainer import ProblemStream, make_sampler, sampling_generator
from copc_core.warmstart import build_model
from tests.conftest import tiny_config


@pytest.fixture(scope="module")
def batch_and_model(tiny_warm_state):
    """A sampled batch (direct guesses are short, tool use is long) and the warm-started model in float64."""
    cfg = tiny_config(method="copc", staleness=2, tau_policy=1.5, tau_advantage=2.0)
    sampler = make_sampler(cfg)
    sampler.load_weights(tiny_warm_state, 0)
    batch = sampler.sample(ProblemStream(cfg, 0).batch(0, 32), 0, sampling_generator(0, 0))
    # a behaviour policy that is not the learner's: the corrections and traces have work to do
    batch.logp_behavior = torch.where(batch.mask > 0, batch.logp_behavior + 0.4 * torch.randn(
        batch.mask.shape, generator=torch.Generator().manual_seed(3)), 0.0)
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
    correction = correct_policy(spec.policy, log_ratio, mask)
    advantages, returns = estimate_advantages(spec.advantage, batch.rewards, values_old, mask, log_ratio, m.gamma,
                                              m.lam).output
    advantages = masked_whiten(advantages, mask)
    anchor = batch.logp_behavior if spec.policy.anchor == "behavior" else logp_old
    losses = []
    for _ in range(t.epochs):
        order = torch.randperm(B, generator=generator)
        for j in range(t.minibatches):
            idx = order[j * mb : (j + 1) * mb]
            logp, values, entropy = response_logprobs(model, batch.select(idx), t.temperature)
            actor = ppo_actor_loss(logp, anchor[idx], advantages[idx], correction.weight[idx], correction.keep[idx],
                                   mask[idx], m.clip_low, m.clip_high, m.dual_clip, spec.policy.loss_denominator == "kept")
            critic = clipped_value_loss(values, values_old[idx], returns[idx], mask[idx], m.value_clip)
            loss = actor.loss + t.value_coef * critic.loss - t.entropy_coef * masked_mean(entropy, mask[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), t.max_grad_norm)
            optimizer.step()
            losses.append((float(actor.loss.detach()), float(critic.loss.detach())))
    return {"actor/loss": sum(a for a, _ in losses) / len(losses), "critic/value_loss": sum(c for _, c in losses) / len(losses)}


@pytest.mark.parametrize("epochs", [1, 2])
def test_a_learner_step_equals_the_plain_reference(batch_and_model, epochs):
    cfg, batch, model = batch_and_model
    cfg = with_overrides(cfg, {"train.epochs": epochs, "train.minibatches": 4})
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
    passes = B + (cfg.train.epochs * cfg.train.minibatches - 1) * mb  # rows read: all once, then every update but the first
    assert sum(read) < passes * (P + T - 1)  # the width cut saved work
    assert sum(read) >= passes * (P - 1 + int(policy_widths(batch.mask).min()))
