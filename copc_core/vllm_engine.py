"""A vLLM rollout engine behind the `RolloutEngine` interface (GPU only; the `gpu` extra installs vLLM).

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

vLLM is imported lazily; `vllm_unavailable_reason()` says why the engine cannot run here (no CUDA
GPU, vLLM not installed) — the `gpu` tests skip on it.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import os

import torch
from torch import Tensor

from copc_core.rollout import EpisodeLimits, ToolEpisodes, TrajectoryBatch, left_pad, outcome_rewards
from copc_core.tasks.base import CALL_CLOSE, Codec, Task


class WeightSyncTimeout(TimeoutError):
    """A weight update did not finish within its timeout; the engine keeps its previous version."""


def vllm_unavailable_reason() -> str | None:
    """None when vLLM can run here; otherwise why not (the `gpu` test marker skips with it)."""
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed (pip install '.[gpu]' on a CUDA machine)"
    if not torch.cuda.is_available():
        return "no CUDA GPU"
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
        device = next(self.model_runner.model.parameters()).device
        loaded = self.model_runner.model.load_weights(weights=((k, v.to(device)) for k, v in weights.items()))
        return len(loaded) if loaded is not None else len(weights)


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
        **engine_kwargs,
    ):
        reason = vllm_unavailable_reason()
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
        responses = ["".join(text) for text in env.text]
        for i, ids in enumerate(env.ids):
            n = len(ids)
            tokens[i, :n] = torch.tensor(ids, dtype=torch.long)
            mask_t[i, :n] = torch.tensor(mask[i])
            logp_t[i, :n] = torch.tensor(logp[i])
        rewards = outcome_rewards(self.task, problems, responses, mask_t, self.limits.format_reward)
        return TrajectoryBatch(
            left_pad(prompts, codec),
            tokens,
            mask_t,
            logp_t,
            torch.full((B, steps), version, dtype=torch.long),
            rewards,
            list(problems),
            responses,
            torch.tensor([not e for e in ended]),
            codec.pad_id,
        )
