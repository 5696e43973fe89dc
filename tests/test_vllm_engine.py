"""The vLLM rollout engine. The `gpu` tests run where a CUDA GPU and vLLM are present (the `gpu`
extra); elsewhere they are skipped, and the skip condition itself is tested here on every machine."""

import importlib.util

import pytest
import torch

from copc_core import vllm_engine
from copc_core.config import ModelConfig, RunConfig, ToolMathTaskConfig, TrainConfig, WarmStartConfig, with_overrides
from copc_core.vllm_engine import WeightSyncTimeout, hf_weights, vllm_unavailable_reason


def test_the_skip_condition_names_what_is_missing(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        vllm_engine.importlib.util, "find_spec", lambda name: None if name == "vllm" else real_find_spec(name)
    )
    assert "not installed" in vllm_unavailable_reason()
    monkeypatch.setattr(vllm_engine.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(vllm_engine.torch.cuda, "is_available", lambda: False)
    assert vllm_unavailable_reason() == "no CUDA GPU"
    monkeypatch.setattr(vllm_engine.torch.cuda, "is_available", lambda: True)
    assert vllm_unavailable_reason() is None


def test_gpu_tests_carry_the_skip_exactly_when_the_condition_says(request):
    reason = vllm_unavailable_reason()
    gpu_items = [item for item in request.session.items if "gpu" in item.keywords]
    assert gpu_items  # this module's gpu tests were collected
    for item in gpu_items:
        skips = [m.kwargs.get("reason", "") for m in item.iter_markers("skip")]
        assert (skips == [f"gpu test: {reason}"]) if reason else not skips


def test_only_the_causal_lm_weights_travel_to_vllm():
    state = {
        "policy.model.embed_tokens.weight": torch.zeros(2),
        "policy.lm_head.weight": torch.ones(2),
        "value_head.weight": torch.ones(1),
        "critic_trunk.layers.0.w": torch.ones(1),
    }
    assert set(hf_weights(state)) == {"model.embed_tokens.weight", "lm_head.weight"}


class _Runner:
    """Stands in for a vLLM worker's model runner: records what `load_weights` receives."""

    def __init__(self):
        self.model = torch.nn.Linear(2, 2)
        self.model.load_weights = lambda weights: {name for name, _ in weights}


def test_weight_sync_loads_tensors_and_refuses_a_serialised_payload_by_name():
    worker = vllm_engine.WeightSyncExtension()
    worker.model_runner = _Runner()
    assert worker.copc_load_weights({"a": torch.zeros(2), "b": torch.ones(3)}) == 2
    # what vLLM's multiprocess engine core makes of a tensor argument: [dtype, shape, buffer index]
    with pytest.raises(TypeError, match="arrived as list, not tensors.*VLLM_ENABLE_V1_MULTIPROCESSING=0"):
        worker.copc_load_weights({"a": ["float32", [2], 1]})


def test_the_vllm_engine_is_only_for_hf_models():
    with pytest.raises(ValueError, match="rollout_engine"):
        ModelConfig(rollout_engine="vllm")


# ---- on a GPU with vLLM ----


@pytest.fixture(scope="module")
def gpu_setup(tmp_path_factory):
    from copc_core.hf import save_tiny_model
    from copc_core.tasks import make_task
    from copc_core.warmstart import warm_start

    path = save_tiny_model(tmp_path_factory.mktemp("hf") / "tiny-llama", make_task(ToolMathTaskConfig()))
    cfg = RunConfig(
        model=ModelConfig(
            backend="hf", hf_model=str(path), device="cuda", rollout_engine="vllm", vllm_gpu_memory_utilization=0.2
        ),
        task=ToolMathTaskConfig(n_eval=16),
        warm_start=WarmStartConfig(steps=100, batch_size=32),
        train=TrainConfig(steps=3, batch_size=16, minibatches=2, eval_every=3, staleness=1),
    )
    return cfg, warm_start(cfg)


@pytest.mark.gpu
def test_vllm_samples_tool_episodes_with_the_learners_log_probs(gpu_setup):
    from copc_core.backends import build_model, make_engine
    from copc_core.learner import response_logprobs
    from copc_core.tasks import make_task
    from copc_core.trainer import sampling_generator

    cfg, warm = gpu_setup
    engine = make_engine(cfg)
    engine.load_weights(warm, 5)
    batch = engine.sample(make_task(cfg.task).sample(16, 0), None, sampling_generator(0, 0))
    assert torch.all(batch.version == 5) and (batch.mask == 0).any() and (batch.mask.sum(1) > 0).all()
    model = build_model(cfg, 0)
    model.load_state_dict(warm)
    with torch.no_grad():
        logp, _, _ = response_logprobs(model, batch.to("cuda"), cfg.train.temperature)
    on = batch.mask > 0
    torch.testing.assert_close(logp.cpu()[on], batch.logp_behavior[on], rtol=0, atol=2e-3)


@pytest.mark.gpu
def test_vllm_weight_sync_has_a_timeout(gpu_setup):
    from copc_core.backends import make_engine

    cfg, warm = gpu_setup
    engine = make_engine(cfg)
    engine.sync_timeout_s = 1e-4
    with pytest.raises(WeightSyncTimeout, match="version 9"):
        engine.load_weights(warm, 9)


@pytest.mark.gpu
def test_a_few_copc_steps_with_vllm_rollouts(gpu_setup):
    from copc_core.trainer import Trainer

    cfg, warm = gpu_setup
    trainer = Trainer(with_overrides(cfg, {"train.staleness": 1}), warm)
    summary = trainer.run()
    assert summary.steps_completed == 3 and trainer.non_finite_step is None
    assert [h["staleness/max"] for h in trainer.history] == [0.0, 1.0, 1.0]
    assert all(0.0 < h["correction/ess"] <= 1.0 for h in trainer.history)
