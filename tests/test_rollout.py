import torch

from copc_core.engines.backends import build_model
from copc_core.engines.rollout import EpisodeLimits, TorchSampler, TrajectoryBatch
from copc_core.tasks.tool_math import CALL_CLOSE, CALL_OPEN, RESULT_END, VOCAB, ToolMathTask, calculator, make_problems
from copc_core.train.learner import response_logprobs
from tests.conftest import tiny_config


def sampler_and_batch(tiny_warm_state, n=24, seed=0, version=3):
    cfg = tiny_config()
    model = build_model(cfg, 0)
    model.load_state_dict(tiny_warm_state)
    sampler = TorchSampler(
        model, ToolMathTask(cfg.task), EpisodeLimits(cfg.task.max_response_tokens, cfg.task.max_tool_calls, 1.0, 0.0)
    )
    problems = make_problems(n, cfg.task.operand_digits, cfg.task.ops, seed)
    return cfg, sampler, sampler.sample(problems, version, torch.Generator().manual_seed(seed))


def test_environment_tokens_are_tool_output_with_mask_zero(tiny_warm_state):
    _, _, batch = sampler_and_batch(tiny_warm_state)
    n_calls = 0
    for i, response in enumerate(batch.responses):
        ids = batch.response_ids[i, : len(response)].tolist()
        assert "".join(VOCAB[t] for t in ids) == response
        mask = batch.mask[i, : len(response)].tolist()
        # every environment span directly follows a policy `]` and is calculator(call) + ';'
        j = 0
        while j < len(response):
            if mask[j] == 0:
                k = response.index(RESULT_END, j)
                call_start = response.rfind(CALL_OPEN, 0, j)
                assert response[j - 1] == CALL_CLOSE and mask[j - 1] == 1
                expected = calculator(response[call_start + 1 : j - 1]) if call_start >= 0 else "?"
                assert response[j:k] in (expected, "?")
                assert all(m == 0 for m in mask[j : k + 1])
                n_calls += 1
                j = k + 1
            else:
                j += 1
        assert torch.all(batch.mask[i, len(response) :] == 0)
    assert n_calls > 0  # the warm-started policy does call the tool
    assert torch.all(batch.logp_behavior[batch.mask == 0] == 0)
    assert torch.all(batch.logp_behavior[batch.mask == 1] <= 0)


def test_versions_and_rewards_layout(tiny_warm_state):
    _, _, batch = sampler_and_batch(tiny_warm_state, version=7)
    assert torch.all(batch.version == 7)
    for i in range(batch.size):
        nz = batch.rewards[i].nonzero()
        if len(nz):
            last_policy = batch.mask[i].nonzero().max()
            assert nz.item() == last_policy.item()
    batch.validate()


def test_behavior_logprobs_equal_the_learner_recompute_on_policy(tiny_warm_state):
    """μ = π_old exactly when the same weights sample and recompute: ρ = 1 up to float error."""
    _, sampler, batch = sampler_and_batch(tiny_warm_state)
    with torch.no_grad():
        logp, _, _ = response_logprobs(sampler.model, batch, 1.0)
    torch.testing.assert_close(logp * batch.mask, batch.logp_behavior, rtol=0, atol=2e-5)


def test_same_generator_same_batch(tiny_warm_state):
    _, _, a = sampler_and_batch(tiny_warm_state, seed=5)
    _, _, b = sampler_and_batch(tiny_warm_state, seed=5)
    assert a.responses == b.responses and torch.equal(a.logp_behavior, b.logp_behavior)


def test_concat_and_select_round_trip(tiny_warm_state):
    _, _, batch = sampler_and_batch(tiny_warm_state, n=8)
    halves = [batch.select(torch.arange(0, 4)), batch.select(torch.arange(4, 8))]
    joined = TrajectoryBatch.concat(halves)
    T = batch.response_ids.shape[1]
    assert joined.responses == batch.responses
    assert torch.equal(joined.mask[:, :T], batch.mask) and torch.equal(joined.rewards[:, :T], batch.rewards)
