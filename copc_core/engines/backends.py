"""Model backends behind one table: the built-in tiny GPT and any Hugging Face causal LM.

A backend builds the actor–critic (`forward(idx) → (logits, values)`, `policy_step`, `new_cache`,
`max_length`) and the codec that turns a task's text into its tokens. The sampler, the warm start,
the learner, the trainer and the Ray runtime look the backend up here once and are otherwise the
same for both. The rollout engine (torch sampler or vLLM) is chosen from a second table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from copc_core.config import RunConfig
from copc_core.engines.models import GPTShape, TinyGPT
from copc_core.engines.rollout import ActorCritic, EpisodeLimits, RolloutEngine, TorchSampler
from copc_core.tasks import make_task
from copc_core.tasks.base import CharCodec, Codec


@dataclass(frozen=True)
class Backend:
    build: Callable[[RunConfig, int], ActorCritic]  # (config, seed) → a model (weights: init or pretrained)
    codec: Callable[[RunConfig], Codec]


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A CPU copy of the weights (travels through Ray's object store and checkpoints as is)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def model_shape(config: RunConfig) -> GPTShape:
    task = make_task(config.task)
    return GPTShape(
        vocab_size=len(task.vocab),
        block_size=task.prompt_width + config.task.max_response_tokens,
        n_layer=config.model.n_layer,
        n_head=config.model.n_head,
        n_embd=config.model.n_embd,
        separate_critic=config.model.separate_critic,
    )


def _tiny(config: RunConfig, seed: int) -> TinyGPT:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return TinyGPT(model_shape(config))


def _hf(config: RunConfig, seed: int) -> ActorCritic:
    from copc_core.engines.hf import load_actor_critic

    m = config.model
    return load_actor_critic(m.hf_model, m.separate_critic, m.hf_dtype, m.hf_attn_implementation, seed)


def _hf_codec(config: RunConfig) -> Codec:
    from copc_core.engines.hf import HFCodec, load_tokenizer

    return HFCodec(load_tokenizer(config.model.hf_model), config.model.system_prompt)


BACKENDS: dict[str, Backend] = {
    "tiny": Backend(_tiny, lambda config: CharCodec(make_task(config.task).vocab)),
    "hf": Backend(_hf, _hf_codec),
}


def backend(config: RunConfig) -> Backend:
    return BACKENDS[config.model.backend]


def device(config: RunConfig) -> torch.device:
    wanted = config.model.device
    if wanted == "auto":
        wanted = "cuda" if torch.cuda.is_available() else "cpu"
    if wanted == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("model.device is 'cuda' but torch sees no CUDA device")
    return torch.device(wanted)


def build_model(config: RunConfig, seed: int) -> ActorCritic:
    """A model of the configured backend on its device; initialisation uses a private RNG."""
    return backend(config).build(config, seed).to(device(config))


def make_codec(config: RunConfig) -> Codec:
    return backend(config).codec(config)


def _torch_engine(config: RunConfig) -> RolloutEngine:
    t, task = config.train, config.task
    return TorchSampler(
        build_model(config, t.seed), make_task(task), EpisodeLimits.from_config(config), make_codec(config)
    )


def _vllm_engine(config: RunConfig) -> RolloutEngine:
    from copc_core.engines.vllm_engine import VLLMEngine

    m, t, task = config.model, config.train, config.task
    return VLLMEngine(
        m.hf_model,
        make_task(task),
        make_codec(config),
        EpisodeLimits.from_config(config),
        seed=t.seed,
        device=m.device,
        dtype=m.hf_dtype if m.vllm_dtype == "auto" else m.vllm_dtype,
        gpu_memory_utilization=m.vllm_gpu_memory_utilization,
        kv_cache_memory_bytes=None if m.vllm_kv_cache_gib is None else int(m.vllm_kv_cache_gib * 2**30),
        enforce_eager=m.vllm_enforce_eager,
    )


def _vllm_problem(config: RunConfig) -> str | None:
    from copc_core.engines.vllm_engine import vllm_unavailable_reason

    reason = vllm_unavailable_reason(config.model.device)
    return None if reason is None else f"the vLLM rollout engine cannot run here: {reason}"


@dataclass(frozen=True)
class Engine:
    """A rollout engine: how to build it, and why it could not run here (checked before a run starts)."""

    build: Callable[[RunConfig], RolloutEngine]
    problem: Callable[[RunConfig], str | None] = lambda config: None


ENGINES: dict[str, Engine] = {"torch": Engine(_torch_engine), "vllm": Engine(_vllm_engine, _vllm_problem)}


def engine_problem(config: RunConfig) -> str | None:
    """Why the configured rollout engine could not run here (None when it can); cheap, imports nothing heavy."""
    return ENGINES[config.model.rollout_engine].problem(config)


def make_engine(config: RunConfig) -> RolloutEngine:
    """The configured rollout engine (sample / load_weights), with the run's initial weights."""
    return ENGINES[config.model.rollout_engine].build(config)
