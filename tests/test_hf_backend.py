"""The Hugging Face backend: a tiny Llama + BPE tokenizer built from a config (no download), run by
the same sampler, learner, trainer and Ray runtime as the tiny GPT."""

import os

import pytest
import torch
from pydantic import ValidationError

from copc_core.config import ModelConfig, RunConfig, ToolMathTaskConfig, TrainConfig, WarmStartConfig, with_overrides
from copc_core.engines.backends import build_model, make_engine
from copc_core.engines.hf import CHAT_TEMPLATE, HFCodec, load_tokenizer, save_tiny_model, segments
from copc_core.engines.rollout import ToolEpisodes
from copc_core.tasks import make_task
from copc_core.tasks.base import TOOL_GRAMMAR_PROMPT
from copc_core.tasks.tool_math import calculator
from copc_core.train.learner import response_logprobs
from copc_core.train.trainer import Trainer, sampling_generator
from copc_core.train.warmstart import warm_start


@pytest.fixture(scope="module", autouse=True)
def offline():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("TRANSFORMERS_OFFLINE", "1")
        yield


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """One torch thread, as the Ray actors run: fixed reductions, so two warm starts of one config (and the actors'
    floats) agree bit for bit. At two threads they did not on CI's machine (the vLLM lane keeps torch's default
    count), though they did here."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, offline):
    return save_tiny_model(
        tmp_path_factory.mktemp("hf") / "tiny-llama", make_task(ToolMathTaskConfig()), hidden=32, heads=4
    )


def hf_config(path, staleness=0, steps=3, **model) -> RunConfig:
    return RunConfig(
        model=ModelConfig(backend="hf", hf_model=str(path), **model),
        task=ToolMathTaskConfig(n_eval=16),
        warm_start=WarmStartConfig(steps=20, batch_size=16),
        train=TrainConfig(steps=steps, batch_size=16, minibatches=2, eval_every=2, staleness=staleness),
    )


@pytest.fixture(scope="module")
def hf_warm(tiny_dir):
    return warm_start(hf_config(tiny_dir))


def test_config_names_the_backend_fields():
    for bad, field in (
        ({"backend": "hf"}, "hf_model"),
        ({"hf_model": "x"}, "hf_model"),
        ({"rollout_engine": "vllm"}, "rollout_engine"),
        ({"system_prompt": "hi"}, "system_prompt"),
        ({"backend": "hf", "hf_model": "x", "device": "tpu"}, "device"),
    ):
        with pytest.raises(ValidationError, match=field):
            ModelConfig(**bad)


def test_the_saved_model_loads_offline_with_a_chat_template(tiny_dir):
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    tokenizer = load_tokenizer(str(tiny_dir))
    assert tokenizer.chat_template == CHAT_TEMPLATE
    problem = make_task(ToolMathTaskConfig()).sample(1, 0)[0]
    assert tokenizer.decode(HFCodec(tokenizer).prompt_ids(problem)) == f"<|user|>{problem.prompt}<|assistant|>"
    text = tokenizer.decode(HFCodec(tokenizer, TOOL_GRAMMAR_PROMPT).prompt_ids(problem))
    assert text == f"<|system|>{TOOL_GRAMMAR_PROMPT}<|user|>{problem.prompt}<|assistant|>"
    tokenizer.chat_template = None  # no template: the problem's text, plainly encoded
    assert tokenizer.decode(HFCodec(tokenizer).prompt_ids(problem)) == problem.prompt


def test_demonstrations_tokenize_policy_text_and_tool_output_apart(tiny_dir):
    codec = HFCodec(load_tokenizer(str(tiny_dir)))
    task = make_task(ToolMathTaskConfig())
    import random

    rng = random.Random(0)
    for problem in task.sample(20, 1):
        response = task.demonstration(problem, "correct", rng)
        ids, mask = codec.response_ids(response)
        assert codec.tokenizer.decode(ids) == response
        env_text = "".join(t for t, m in segments(response) if m == 0)  # e.g. "232;255;"
        assert codec.tokenizer.decode([i for i, m in zip(ids, mask) if m == 0]) == env_text
        assert env_text and env_text.endswith(";")


def test_tool_calls_fire_on_subword_tokens(tiny_dir):
    codec = HFCodec(load_tokenizer(str(tiny_dir)))
    env = ToolEpisodes(1, make_task(ToolMathTaskConfig()), codec, max_tool_calls=2)
    call = codec.env_ids("[58*4]")
    assert len(call) < len("[58*4]")  # BPE merges: fewer tokens than characters
    for token in call[:-1]:
        env.on_policy_token(0, token)
        assert env.queue[0] == []
    env.on_policy_token(0, call[-1])
    assert env.queue[0] == codec.env_ids(calculator("58*4") + ";") and calculator("58*4") == "232"
    for token in list(env.queue[0]):
        env.on_env_token(0, token)
    assert "".join(env.text[0]) == "[58*4]232;"


def test_left_padding_changes_nothing(tiny_dir):
    model = build_model(hf_config(tiny_dir), 0).eval()
    pad = model.pad_id
    row = torch.tensor([[7, 31, 12, 55, 9, 3]])
    padded = torch.cat([torch.full((1, 3), pad), row], dim=1)
    with torch.no_grad():
        logits, values = model(row)
        logits_p, values_p = model(padded)
    torch.testing.assert_close(logits_p[:, 3:], logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(values_p[:, 3:], values, rtol=0, atol=1e-5)
    with torch.no_grad():  # the values alone (the critic warm-up's pass): forward's, bit for bit
        assert torch.equal(model.values(padded), values_p)


def test_sampler_log_probs_equal_the_learner_recompute_on_policy(tiny_dir, hf_warm):
    """Left-padded prompts of different lengths, KV-cached sampling vs. one full forward: ρ = 1."""
    cfg = hf_config(tiny_dir)
    sampler = make_engine(cfg)
    sampler.load_weights(hf_warm, 0)
    problems = make_task(cfg.task).sample(16, 3)
    lengths = {len(sampler.codec.prompt_ids(p)) for p in problems}
    assert len(lengths) > 1  # the padding path is exercised
    batch = sampler.sample(problems, 0, sampling_generator(0, 0))
    assert (batch.mask.sum(1) > 0).all() and (batch.mask == 0).any()  # policy tokens and tool output
    with torch.no_grad():
        logp, _, _ = response_logprobs(sampler.model, batch, 1.0)
    on = batch.mask > 0
    torch.testing.assert_close(logp[on], batch.logp_behavior[on], rtol=0, atol=1e-5)


@pytest.mark.parametrize("separate_critic", [False, True])
def test_a_few_copc_steps_with_stale_rollouts(tiny_dir, hf_warm, separate_critic):
    cfg = hf_config(tiny_dir, staleness=1, steps=3, separate_critic=separate_critic)
    warm = hf_warm if not separate_critic else warm_start(cfg)
    trainer = Trainer(cfg, warm)
    summary = trainer.run()
    assert summary.steps_completed == 3 and trainer.non_finite_step is None
    assert [h["staleness/max"] for h in trainer.history] == [0.0, 1.0, 1.0]
    for record in trainer.history:
        assert all(torch.isfinite(torch.tensor(v)) for v in record.values())
        assert 0.0 < record["correction/ess"] <= 1.0
        assert record["critic/grad_norm"] > 0.0
    moved = [k for k, v in trainer.model.state_dict().items() if not torch.equal(v, warm[k])]
    assert any(k.startswith("policy.") for k in moved) and any(k.startswith("value_head") for k in moved)
    assert any(k.startswith("critic_trunk") for k in moved) == separate_critic


@pytest.mark.slow
def test_the_ray_runtime_runs_the_hf_backend_like_the_in_process_trainer(tiny_dir, hf_warm, local_ray):
    from infra.ray_runtime import RayTrainer

    cfg = with_overrides(hf_config(tiny_dir, staleness=1, steps=3), {"train.eval_every": 3})
    reference = Trainer(cfg, hf_warm)  # at one thread (one_torch_thread), the actors' setting: same floats
    reference.run()
    # an actor's first call imports transformers and builds the model: minutes on a loaded 2-core machine
    rt = RayTrainer(
        with_overrides(cfg, {"resources.rollout_cpus": 0.5, "resources.learner_cpus": 0.5, "resources.timeout_s": 600}),
        hf_warm,
    )
    try:
        rt.run()
    finally:
        rt.shutdown()
    strip = lambda records: [{k: v for k, v in r.items() if not k.startswith("time/")} for r in records]  # noqa: E731
    assert strip(rt.history) == strip(reference.history)
    assert rt.evals == reference.evals


def test_search_prompts_lose_their_character_padding(tiny_dir):
    from copc_core.config import SearchTaskConfig

    codec = HFCodec(load_tokenizer(str(tiny_dir)), system_prompt="Answer.")
    question = next(q for q in make_task(SearchTaskConfig()).sample(50, 0) if q.prompt.startswith("_"))
    text = codec.tokenizer.decode(codec.prompt_ids(question))
    assert text == f"<|system|>Answer.<|user|>{question.prompt.lstrip('_')}<|assistant|>"


def test_a_separate_hf_critic_can_start_as_a_copy_of_the_warm_started_policy(tiny_dir, hf_warm):
    """model.critic_init = policy: the critic trunk (a second copy of the base model) starts from the SFT
    policy's base model, as LLM PPO initialises its critic from the SFT model; `own` keeps the pretrained one."""
    copied = warm_start(hf_config(tiny_dir, separate_critic=True, critic_init="policy"))
    own = warm_start(hf_config(tiny_dir, separate_critic=True))
    base = {k[len("policy.model.") :]: v for k, v in copied.items() if k.startswith("policy.model.")}
    assert base and all(torch.equal(copied[f"critic_trunk.{k}"], v) for k, v in base.items())
    assert not all(torch.equal(own[f"critic_trunk.{k}"], v) for k, v in base.items())
    for k, v in hf_warm.items():  # the warm-started policy does not depend on the critic's layout
        if k.startswith("policy."):
            assert torch.equal(copied[k], v), k
