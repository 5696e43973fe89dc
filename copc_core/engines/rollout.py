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

    forward(idx [B, T]) → (logits [B, T, V], values [B, T]); `values(idx)` the values alone; `policy_step`
    continues a cache.
    """

    max_length: int
    policy_trunk: torch.nn.Module  # the policy's transformer (a separate critic trunk may start as its copy)
    critic_trunk: torch.nn.Module | None

    def __call__(self, idx: Tensor) -> tuple[Tensor, Tensor]: ...

    def values(self, idx: Tensor) -> Tensor: ...

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

    def step(self, sampled: list[int], done: list[bool]) -> tuple[list[int], list[bool]]:
        """Each episode's next token: padding once it is done, else its next queued tool-output token, else its
        sampled policy token (which may end it: `done` is updated in place). Returns the tokens and which of them
        are the policy's."""
        next_ids, is_policy = [], []
        for i, token in enumerate(sampled):
            if done[i]:
                next_ids.append(self.codec.pad_id)
                is_policy.append(False)
            elif self.queue[i]:
                token = self.queue[i].pop(0)
                self.on_env_token(i, token)
                next_ids.append(token)
                is_policy.append(False)
            else:
                piece = self.on_policy_token(i, token)
                next_ids.append(token)
                is_policy.append(True)
                done[i] = self.codec.ends(token, piece)
        return next_ids, is_policy


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
        prompt_ids = left_pad([self.codec.prompt_ids(p) for p in problems], self.codec)
        if prompt_ids.shape[1] + self.limits.max_response_tokens > self.model.max_length:
            raise ValueError(
                f"prompt {prompt_ids.shape[1]} + response {self.limits.max_response_tokens} tokens exceed the "
                f"model's {self.model.max_length}"
            )
        env = ToolEpisodes(len(problems), self.task, self.codec, self.limits.max_tool_calls)
        was_training = self.model.training
        self.model.eval()
        try:
            tokens, mask, logp, done = self._decode(prompt_ids, env, generator, greedy)
        finally:
            self.model.train(was_training)
        return env.batch(problems, prompt_ids, tokens, mask, logp, version, done, self.limits.format_reward)

    def _decode(
        self, prompt_ids: Tensor, env: ToolEpisodes, generator: torch.Generator | None, greedy: bool
    ) -> tuple[Tensor, Tensor, Tensor, list[bool]]:
        """The KV-cached loop over response positions: sample from the policy → each episode takes its token
        (`ToolEpisodes.step`) → those tokens extend the cache. Returns the response tokens, the policy mask and
        log μ, all [B, steps], and which episodes ended. Per position only what the next one needs is a tensor:
        the tokens and flags stay Python lists until the end (each small tensor op costs ~10 µs on a CPU)."""
        B, T = prompt_ids.shape[0], self.limits.max_response_tokens
        device = next(self.model.parameters()).device
        with torch.inference_mode():
            cache = self.model.new_cache(B)
        logits = self._next_logits(prompt_ids, cache, device)  # prefill: [B, V]
        chosen = torch.zeros(T, B)  # log μ of each position's sampled token
        ids: list[list[int]] = []  # per position, each episode's token
        policy: list[list[bool]] = []  # per position, whether that token is the policy's
        done = [False] * B
        for t in range(T):
            logp_all = torch.log_softmax(logits / self.limits.temperature, dim=-1)  # [B, V]
            if greedy:
                sampled = logp_all.argmax(dim=-1)
            else:
                sampled = torch.multinomial(logp_all.exp(), 1, generator=generator).squeeze(1)
            torch.gather(logp_all, 1, sampled[:, None], out=chosen[t, :, None])
            next_ids, is_policy = env.step(sampled.tolist(), done)
            ids.append(next_ids)
            policy.append(is_policy)
            if all(done) or t == T - 1:
                break
            logits = self._next_logits(torch.tensor(next_ids)[:, None], cache, device)
        tokens = torch.tensor(ids, dtype=torch.long).T.contiguous()
        mask = torch.tensor(policy).T.float().contiguous()
        return tokens, mask, torch.where(mask > 0, chosen[: len(ids)].T, 0.0), done

    def _next_logits(self, idx: Tensor, cache, device: torch.device) -> Tensor:
        """Next-token logits [B, V] on the CPU after idx [B, T] joins the cache. In inference mode (no autograd
        bookkeeping: ~10 % of a sampling call); the batch's own tensors are made outside it, so the learner can use
        them in its graph."""
        with torch.inference_mode():
            return self.model.policy_step(idx.to(device), cache).float().cpu()


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
