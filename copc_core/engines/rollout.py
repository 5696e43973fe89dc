"""Rollouts: the `TrajectoryBatch` record and the batched torch sampler with the tool environment.

The sampler is the embedded rollout engine: a KV-cached loop over response positions for the
whole batch at once. At each position a sequence either samples a policy token (mask 1, its
log-probability recorded as `logp_behavior` with the policy version) or receives the next queued
environment token (tool output, mask 0). The Ray runtime wraps `TorchSampler` in actors; the
vLLM engine implements the same `sample` signature.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

import torch
from torch import Tensor

from copc_core.rl.tensors import NonFiniteError
from copc_core.tasks.base import (
    CALL_CLOSE,
    CALL_OPEN,
    ERROR,
    PAD_ID,
    RESULT_END,
    CharCodec,
    Codec,
    Task,
    count_tool_calls,
)


@dataclass
class TrajectoryBatch:
    """A batch of sampled episodes, response-only layout [B, T] after a shared prompt length P."""

    prompt_ids: Tensor  # [B, P] long
    response_ids: Tensor  # [B, T] long (PAD after the end)
    mask: Tensor  # [B, T] float: 1 = policy token, 0 = environment token or padding
    logp_behavior: Tensor  # [B, T] float: log μ(y_t) at policy tokens, 0 elsewhere
    version: Tensor  # [B, T] long: policy version that sampled each token
    rewards: Tensor  # [B, T] float: outcome reward on the last policy token
    problems: list  # the task's problem records
    responses: list[str]
    truncated: Tensor  # [B] bool: hit max_response_tokens without an answer
    pad_id: int = PAD_ID  # the codec's padding token (prompts are left-padded with it)

    @property
    def size(self) -> int:
        return self.prompt_ids.shape[0]

    def validate(self) -> None:
        """Shapes agree and every float field is finite (the learner relies on it)."""
        B, T = self.response_ids.shape
        for name in ("mask", "logp_behavior", "version", "rewards"):
            if getattr(self, name).shape != (B, T):
                raise ValueError(f"{name} has shape {tuple(getattr(self, name).shape)}, expected {(B, T)}")
        for name in ("logp_behavior", "rewards"):
            if not torch.isfinite(getattr(self, name)).all():
                raise NonFiniteBatchError(f"non-finite values in {name}")

    def to(self, device: torch.device | str) -> TrajectoryBatch:
        """The tensors on `device` (the same object when they are there already)."""
        if self.mask.device == torch.device(device):
            return self
        move = [
            getattr(self, n).to(device)
            for n in ("prompt_ids", "response_ids", "mask", "logp_behavior", "version", "rewards")
        ]
        return TrajectoryBatch(*move, self.problems, self.responses, self.truncated.to(device), self.pad_id)

    def select(self, index: Tensor) -> TrajectoryBatch:
        idx = index.tolist()
        return TrajectoryBatch(
            self.prompt_ids[index],
            self.response_ids[index],
            self.mask[index],
            self.logp_behavior[index],
            self.version[index],
            self.rewards[index],
            [self.problems[i] for i in idx],
            [self.responses[i] for i in idx],
            self.truncated[index],
            self.pad_id,
        )

    def head(self, width: int) -> TrajectoryBatch:
        """The first `width` response positions of every episode (prompts, records and flags unchanged)."""
        cut = [getattr(self, n)[:, :width] for n in ("response_ids", "mask", "logp_behavior", "version", "rewards")]
        return TrajectoryBatch(self.prompt_ids, *cut, self.problems, self.responses, self.truncated, self.pad_id)

    @staticmethod
    def concat(batches: list[TrajectoryBatch]) -> TrajectoryBatch:
        T = max(b.response_ids.shape[1] for b in batches)
        P = max(b.prompt_ids.shape[1] for b in batches)
        pad_id = batches[0].pad_id

        def pad(x: Tensor, value) -> Tensor:
            return torch.nn.functional.pad(x, (0, T - x.shape[1]), value=value)

        return TrajectoryBatch(
            torch.cat(
                [torch.nn.functional.pad(b.prompt_ids, (P - b.prompt_ids.shape[1], 0), value=pad_id) for b in batches]
            ),
            torch.cat([pad(b.response_ids, pad_id) for b in batches]),
            torch.cat([pad(b.mask, 0.0) for b in batches]),
            torch.cat([pad(b.logp_behavior, 0.0) for b in batches]),
            torch.cat([pad(b.version, -1) for b in batches]),
            torch.cat([pad(b.rewards, 0.0) for b in batches]),
            [p for b in batches for p in b.problems],
            [r for b in batches for r in b.responses],
            torch.cat([b.truncated for b in batches]),
            pad_id,
        )


def policy_widths(mask: Tensor) -> Tensor:
    """[B] long: response positions up to and including each episode's last policy token (0 without
    one). Past it come only padding, or tool output that no policy token follows: mask 0."""
    T = mask.shape[1]
    return (mask * torch.arange(1, T + 1, device=mask.device)).amax(dim=1).long()


class NonFiniteBatchError(NonFiniteError):
    """A rollout produced NaN/inf log-probabilities or rewards."""


class ActorCritic(Protocol):
    """What the sampler and the learner need from a model (TinyGPT, copc_core.engines.hf.HFActorCritic).

    forward(idx [B, T]) → (logits [B, T, V], values [B, T]); `policy_step` continues a cache.
    """

    max_length: int
    policy_trunk: torch.nn.Module  # the policy's transformer (a separate critic trunk may start as its copy)
    critic_trunk: torch.nn.Module | None

    def __call__(self, idx: Tensor) -> tuple[Tensor, Tensor]: ...

    def policy_step(self, idx: Tensor, cache) -> Tensor: ...

    def new_cache(self, batch: int): ...


class RolloutEngine(Protocol):
    def sample(
        self, problems: list, version: int, generator: torch.Generator, greedy: bool = False
    ) -> TrajectoryBatch: ...

    def load_weights(self, state: dict[str, Tensor], version: int) -> None: ...


class ToolEpisodes:
    """Per-sequence environment state: response ids and text, tool-call budget, queued tool output."""

    def __init__(self, n: int, task: Task, codec: Codec, max_tool_calls: int):
        self.task = task
        self.codec = codec
        self.ids: list[list[int]] = [[] for _ in range(n)]
        self.text: list[list[str]] = [[] for _ in range(n)]
        self.queue: list[list[int]] = [[] for _ in range(n)]
        self.max_tool_calls = max_tool_calls
        self.calls = [0] * n

    def batch(
        self,
        problems: list,
        prompt_ids: Tensor,
        tokens: Tensor,
        mask: Tensor,
        logp: Tensor,
        version: int,
        ended: list[bool],
        format_reward: float,
    ) -> TrajectoryBatch:
        """The finished episodes as a batch (any engine): the task's rewards, every token stamped with
        `version`, an episode truncated unless it `ended` with an answer (or EOS)."""
        responses = ["".join(text) for text in self.text]
        return TrajectoryBatch(
            prompt_ids,
            tokens,
            mask,
            logp,
            torch.full(tokens.shape, version, dtype=torch.long),
            outcome_rewards(self.task, problems, responses, mask, format_reward),
            list(problems),
            responses,
            torch.tensor([not e for e in ended]),
            self.codec.pad_id,
        )

    def _append(self, i: int, token: int) -> str:
        piece = self.codec.piece(self.ids[i], token)
        self.ids[i].append(token)
        self.text[i].append(piece)
        return piece

    def on_policy_token(self, i: int, token: int) -> str:
        """Record a policy token; a `]` in it closes a tool call and queues the tool's output."""
        piece = self._append(i, token)
        if CALL_CLOSE not in piece:
            return piece
        body = "".join(self.text[i])
        close = body.rfind(CALL_CLOSE)
        start = body.rfind(CALL_OPEN, 0, close)
        self.calls[i] += 1
        if start < 0 or body.rfind(RESULT_END, 0, close) > start or self.calls[i] > self.max_tool_calls:
            result = ERROR
        else:
            result = self.task.tool(body[start + 1 : close])
        self.queue[i] = self.codec.env_ids(result + RESULT_END)
        return piece

    def on_env_token(self, i: int, token: int) -> None:
        self._append(i, token)


def left_pad(prompts: list[list[int]], codec: Codec) -> Tensor:
    """Prompt ids [B, P], shorter prompts padded on the left (only where the model masks padding)."""
    P = max(len(p) for p in prompts)
    if any(len(p) != P for p in prompts) and not codec.supports_padding:
        raise ValueError("all prompts of a batch must have the same length")
    return torch.tensor([[codec.pad_id] * (P - len(p)) + p for p in prompts], dtype=torch.long)


class EpisodeLimits(NamedTuple):
    """How every engine samples and scores an episode (from `RunConfig.task` and `train.temperature`)."""

    max_response_tokens: int
    max_tool_calls: int
    temperature: float
    format_reward: float

    @classmethod
    def from_config(cls, config) -> EpisodeLimits:
        task = config.task
        return cls(task.max_response_tokens, task.max_tool_calls, config.train.temperature, task.format_reward)


class TorchSampler:
    """The torch rollout engine: a model's KV cache + the task's tool environment, batched.

    Runs the tiny GPT (embedded default) or a Hugging Face model (copc_core.engines.hf) on CPU or GPU;
    the codec turns the task's text into the model's tokens.
    """

    def __init__(self, model: ActorCritic, task: Task, limits: EpisodeLimits, codec: Codec | None = None):
        self.model = model
        self.task = task
        self.codec = codec if codec is not None else CharCodec(task.vocab)
        self.limits = limits
        self.version = 0

    def load_weights(self, state: dict[str, Tensor], version: int) -> None:
        self.model.load_state_dict(state)
        self.version = version

    @torch.no_grad()
    def sample(
        self, problems: list, version: int | None = None, generator: torch.Generator | None = None, greedy: bool = False
    ) -> TrajectoryBatch:
        version = self.version if version is None else version
        codec = self.codec
        prompt_ids = left_pad([codec.prompt_ids(p) for p in problems], codec)
        (B, P), T = prompt_ids.shape, self.limits.max_response_tokens
        if P + T > self.model.max_length:
            raise ValueError(f"prompt {P} + response {T} tokens exceed the model's {self.model.max_length}")
        tokens = torch.full((B, T), codec.pad_id, dtype=torch.long)
        mask = torch.zeros(B, T)
        logp = torch.zeros(B, T)
        env = ToolEpisodes(B, self.task, codec, self.limits.max_tool_calls)
        done = [False] * B
        was_model = self.model.training
        self.model.eval()
        device = next(self.model.parameters()).device
        cache = self.model.new_cache(B)
        logits = self.model.policy_step(prompt_ids.to(device), cache).float().cpu()  # prefill: [B, V]
        steps = 0
        for t in range(T):
            steps = t + 1
            logp_all = torch.log_softmax(logits / self.limits.temperature, dim=-1)  # [B, V]
            if greedy:
                sampled = logp_all.argmax(dim=-1)
            else:
                sampled = torch.multinomial(logp_all.exp(), 1, generator=generator).squeeze(1)
            sampled_list = sampled.tolist()
            next_ids, is_policy = [], []
            for i in range(B):
                if done[i]:
                    next_ids.append(codec.pad_id)
                    is_policy.append(False)
                elif env.queue[i]:
                    tok = env.queue[i].pop(0)
                    env.on_env_token(i, tok)
                    next_ids.append(tok)
                    is_policy.append(False)
                else:
                    tok = sampled_list[i]
                    piece = env.on_policy_token(i, tok)
                    next_ids.append(tok)
                    is_policy.append(True)
                    done[i] = codec.ends(tok, piece)
            next_tok = torch.tensor(next_ids, dtype=torch.long)
            policy = torch.tensor(is_policy)
            tokens[:, t] = next_tok
            mask[:, t] = policy.float()
            logp[:, t] = torch.where(policy, logp_all.gather(1, sampled[:, None]).squeeze(1), 0.0)
            if all(done) or t == T - 1:
                break
            logits = self.model.policy_step(next_tok[:, None].to(device), cache).float().cpu()
        self.model.train(was_model)
        tokens, mask, logp = tokens[:, :steps], mask[:, :steps], logp[:, :steps]
        return env.batch(problems, prompt_ids, tokens, mask, logp, version, done, self.limits.format_reward)


def outcome_rewards(task: Task, problems: list, responses: list[str], mask: Tensor, format_reward: float) -> Tensor:
    """Rewards [B, T]: each episode's task reward on its last policy token (none without policy tokens)."""
    B, T = mask.shape
    rewards = torch.zeros(B, T)
    last_policy = (policy_widths(mask) - 1).clamp(min=0)  # index of the last policy token
    scores = torch.tensor([task.reward(p, r, format_reward) for p, r in zip(problems, responses)])
    rewards[torch.arange(B), last_policy] = scores * (mask.sum(1) > 0)
    return rewards


def episode_stats(batch: TrajectoryBatch) -> dict[str, float]:
    """reward/mean, response/length_mean, tool/calls_mean, response/truncated_frac."""
    lengths = [len(r) for r in batch.responses]
    return {
        "reward/mean": float(batch.rewards.sum(1).mean()),
        "response/length_mean": sum(lengths) / len(lengths),
        "tool/calls_mean": sum(count_tool_calls(r) for r in batch.responses) / len(lengths),
        "response/truncated_frac": float(batch.truncated.float().mean()),
    }
