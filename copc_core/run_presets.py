"""Named run presets: whole `RunConfig`s for `copc train --preset NAME` (flags still override them).

The scale-out presets are the recipe of README §Scale-out: an instruct model from the Hugging Face
Hub, vLLM rollout workers with one GPU each and a learner on its own GPU, on an existing Ray
cluster (`--ray-address`). The model learns the task's tool grammar from a short SFT warm start in
its chat template, then COPC runs at staleness k = 4. `--rollout-workers N` sets N rollout GPUs;
the learner takes one more (N + 1 GPUs in all).
"""

from __future__ import annotations

from copc_core.config import (
    MethodConfig,
    ModelConfig,
    ResourcesConfig,
    RunConfig,
    SearchTaskConfig,
    ToolMathTaskConfig,
    TrainConfig,
    WarmStartConfig,
)
from copc_core.tasks.base import TOOL_GRAMMAR_PROMPT


def _scale_out(hf_model: str, task, lr: float, rollout_workers: int) -> RunConfig:
    return RunConfig(
        method=MethodConfig(name="copc", tau_policy=2.0, tau_advantage=2.0),
        model=ModelConfig(
            backend="hf",
            hf_model=hf_model,
            hf_dtype="float32",
            device="cuda",
            rollout_engine="vllm",
            vllm_dtype="bfloat16",
            vllm_gpu_memory_utilization=0.85,
            system_prompt=TOOL_GRAMMAR_PROMPT,
        ),
        task=task,
        warm_start=WarmStartConfig(steps=200, batch_size=64, lr=1e-5),
        train=TrainConfig(steps=300, batch_size=256, minibatches=8, lr=lr, staleness=4, eval_every=20, torch_threads=4),
        resources=ResourcesConfig(
            rollout_workers=rollout_workers,
            rollout_cpus=4,
            rollout_gpus=1,
            learner_cpus=8,
            learner_gpus=1,
            timeout_s=1800,
        ),
    )


RUN_PRESETS: dict[str, RunConfig] = {
    "embedded-default": RunConfig(),
    "embedded-search": RunConfig(task=SearchTaskConfig()),
    "scale-out-qwen2.5-0.5b": _scale_out(
        "Qwen/Qwen2.5-0.5B-Instruct", ToolMathTaskConfig(max_response_tokens=64, n_eval=512), lr=2e-6, rollout_workers=3
    ),
    "scale-out-qwen2.5-1.5b-search": _scale_out(
        "Qwen/Qwen2.5-1.5B-Instruct",
        SearchTaskConfig(max_response_tokens=96, n_people=600, n_companies=60, n_cities=30, n_held_out=100, n_eval=400),
        lr=1e-6,
        rollout_workers=7,
    ),
}


def run_preset(name: str) -> RunConfig:
    if name not in RUN_PRESETS:
        raise ValueError(f"unknown run preset {name!r}; presets: {', '.join(RUN_PRESETS)}")
    return RUN_PRESETS[name]
