"""The PPO learner step: one method from the registry, any policy-side correction, any estimator.

    1. recompute log π_old and V with the weights at the start of the step (no grad)
    2. channel 1 = policy_terms(...): log ρ = clamp(log π_old − log μ), the anchor of the PPO ratio
       and the correction; channel 2 = estimate_advantages(...) (the critic's target with its own λ)
    3. PPO epochs over shuffled minibatches: the preset's actor loss × w, clipped value loss,
       entropy bonus; the policy's step size × the preset's factor (VCPO: √(ESS/N))
    4. gradient clipping; a non-finite loss or gradient skips the update and raises NonFiniteUpdateError
    5. `policy/kl_step`: the exact full-vocabulary KL(π_v ‖ π_{v+1}) on `kl_step_rows` episodes

It returns a flat dict of floats with the `group/name` keys of docs/ALGORITHMS.md §5, and
`learner/positions`: the token positions its forward passes read (the work a step did).
`warm_up_critic(batch)` is the value-only update of critic warm-up: the policy is untouched and
no version is spent.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
from torch import Tensor

from copc_core.config import RunConfig
from copc_core.engines.rollout import ActorCritic, TrajectoryBatch, policy_widths
from copc_core.rl.advantages import masked_whiten
from copc_core.rl.corrections import PolicyCorrection, behavior_log_ratio
from copc_core.rl.diagnostics import (
    behavior_kl,
    exact_kl,
    explained_variance,
    ratio_diagnostics,
    trace_diagnostics,
)
from copc_core.rl.losses import clipped_value_loss
from copc_core.rl.methods import (
    AdvantageEstimate,
    MethodSpec,
    PolicyTerms,
    actor_loss,
    correct_policy,
    estimate_advantages,
    policy_terms,
    step_size_scale,
)
from copc_core.rl.tensors import NonFiniteError, masked_mean

CRITIC_PARAMETERS = ("value_head", "critic_trunk")  # parameter-name prefixes of the critic (tiny GPT and HF)


class NonFiniteUpdateError(NonFiniteError):
    """A loss or gradient was NaN/inf; the optimizer step was not taken."""


def response_distributions(model: ActorCritic, batch: TrajectoryBatch, temperature: float) -> tuple[Tensor, Tensor]:
    """log π(·|s_t) over the vocabulary, [B, T, V], and V(s_t), [B, T], at every response position.

    The model reads prompt + response[:-1]; position P−1+t predicts response token t, and its value
    is V of the state before token t.
    """
    P = batch.prompt_ids.shape[1]
    logits, values = model(model_input(batch))
    return torch.log_softmax(logits[:, P - 1 :] / temperature, dim=-1), values[:, P - 1 :]


def model_input(batch: TrajectoryBatch) -> Tensor:
    """What the model reads for every response position: prompt + response[:-1], [B, P + T − 1]."""
    return torch.cat([batch.prompt_ids, batch.response_ids[:, :-1]], dim=1)


def token_statistics(log_probs: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
    """log π(y_t) of the given tokens and the entropy of π(·|s_t). Shapes: [B, T, V], [B, T] → [B, T] twice."""
    logp = log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return logp, -(log_probs.exp() * log_probs).sum(-1)


def response_logprobs(model: ActorCritic, batch: TrajectoryBatch, temperature: float) -> tuple[Tensor, Tensor, Tensor]:
    """log π(y_t), V(s_t) and the entropy of π(·|s_t) at every response position, all [B, T]."""
    log_probs, values = response_distributions(model, batch, temperature)
    logp, entropy = token_statistics(log_probs, batch.response_ids)
    return logp, values, entropy


def _pad(x: Tensor, T: int) -> Tensor:
    return torch.nn.functional.pad(x, (0, T - x.shape[1]))


def rows_logprobs(
    model: ActorCritic, batch: TrajectoryBatch, rows: Tensor, temperature: float
) -> tuple[Tensor, Tensor, Tensor]:
    """`response_logprobs` of the episodes `rows`, [len(rows), T], zero past their longest policy width.

    The forward pass reads only up to the last policy token of the longest of these episodes: the
    positions after it are masked in every loss, estimator and statistic, so they are not computed.
    """
    head, T = _rows_head(batch, rows)
    out = response_logprobs(model, head, temperature)
    return tuple(_pad(x, T) for x in out)  # type: ignore[return-value]


def rows_values(model: ActorCritic, batch: TrajectoryBatch, rows: Tensor) -> Tensor:
    """V(s_t) of the episodes `rows`, [len(rows), T], as `rows_logprobs` reads it, without the policy's pass."""
    head, T = _rows_head(batch, rows)
    values = model.values(model_input(head))
    return _pad(values[:, head.prompt_ids.shape[1] - 1 :], T)


def _rows_head(batch: TrajectoryBatch, rows: Tensor) -> tuple[TrajectoryBatch, int]:
    """The episodes `rows`, cut at their forward width, and the batch's response length T (to pad back to)."""
    sub = batch.select(rows)
    T = sub.response_ids.shape[1]
    width = forward_width(sub.mask)
    return (sub.head(width) if width < T else sub), T


def rows_distributions(
    model: ActorCritic, batch: TrajectoryBatch, rows: Tensor, temperature: float, keep: int
) -> tuple[tuple[Tensor, Tensor, Tensor], Tensor]:
    """`rows_logprobs` of `rows`, and the full log π(·|s_t) of the first `keep` of them, detached,
    [keep, width, V] (width: the forward width of `rows`)."""
    head, T = _rows_head(batch, rows)
    log_probs, values = response_distributions(model, head, temperature)
    logp, entropy = token_statistics(log_probs, head.response_ids)
    return (_pad(logp, T), _pad(values, T), _pad(entropy, T)), log_probs[:keep].detach()


def forward_width(mask: Tensor) -> int:
    """Response positions a forward pass over these episodes computes: up to the longest one's last policy token."""
    return max(1, int(policy_widths(mask).max()))


def _select(correction: PolicyCorrection, idx: Tensor) -> PolicyCorrection:
    return PolicyCorrection(*(x[idx] for x in correction))


_UPDATE_STATS = (
    "actor/loss",
    "actor/pg_clipfrac",
    "actor/approx_kl",
    "actor/entropy",
    "actor/grad_norm",
    "critic/value_loss",
    "critic/clipfrac",
    "critic/grad_norm",
)


class _Reader:
    """Forward passes over rows of one batch, counting the token positions they read (the step's unit of work)."""

    def __init__(self, model: ActorCritic, batch: TrajectoryBatch, temperature: float):
        self.model, self.batch, self.temperature = model, batch, temperature
        self.prompt = batch.prompt_ids.shape[1]
        self.positions = 0

    def count(self, rows: Tensor) -> None:
        self.positions += len(rows) * (self.prompt - 1 + forward_width(self.batch.mask[rows]))

    def forward(self, rows: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        self.count(rows)
        return rows_logprobs(self.model, self.batch, rows, self.temperature)


@dataclass
class _Old:
    """What the step reads with the weights it starts from."""

    logp: Tensor  # log π_old [B, T]
    values: Tensor  # V [B, T]
    first_out: tuple[Tensor, Tensor, Tensor]  # the first minibatch's pass, its graph kept for its update
    kl_rows: Tensor  # episodes whose full distributions policy/kl_step starts from
    kl_before: Tensor | None


@dataclass
class _Targets:
    """The two channels' outputs for the step."""

    lag: Tensor
    terms: PolicyTerms
    estimate: AdvantageEstimate
    advantages: Tensor
    returns: Tensor
    lr_scale: float


class Learner:
    """Holds the trainable model and its optimiser; `step(batch)` performs one PPO update.

    The optimiser has two parameter groups: the policy (the trunk, the LM head) at `lr`, the critic
    (value head, and the critic trunk when separate) at `lr × critic_lr_scale`.
    """

    def __init__(self, model: ActorCritic, config: RunConfig, generator: torch.Generator):
        self.model = model
        self.config = config
        self.spec: MethodSpec = config.method.spec()  # looked up once
        self.generator = generator
        t = config.train
        named = list(model.named_parameters())
        self._critic_params = [p for n, p in named if n.startswith(CRITIC_PARAMETERS)]
        self._policy_params = [p for n, p in named if not n.startswith(CRITIC_PARAMETERS)]
        self.optimizer = torch.optim.Adam(
            [
                {"params": self._policy_params, "lr": t.lr},
                {"params": self._critic_params, "lr": t.lr * t.critic_lr_scale},
            ],
            lr=t.lr,
            fused=True,
        )  # one kernel per step
        self.version = 0
        self.critic_warmup_steps = 0  # value-only updates taken (critic warm-up)

    def _prepare(self, batch: TrajectoryBatch) -> TrajectoryBatch:
        batch.validate()
        return batch.to(next(self.model.parameters()).device)

    def _critic_targets(self, rewards: Tensor, values: Tensor, mask: Tensor, log_ratio: Tensor, estimate) -> Tensor:
        """The critic's target: the estimator's, with the critic's own λ when it differs from the actor's."""
        m = self.config.method
        if m.critic_lam is None or m.critic_lam == m.lam:
            return estimate.output.returns
        return estimate_advantages(
            self.spec.advantage, rewards, values, mask, log_ratio, m.gamma, m.critic_lam
        ).output.returns

    def step(self, batch: TrajectoryBatch) -> dict[str, float]:
        """One PPO step of the method on `batch`: recompute log π_old and V → the corrections and advantages → the
        minibatch updates of every epoch → the step's diagnostics."""
        start = time.perf_counter()
        batch = self._prepare(batch)
        t = self.config.train
        orders = [torch.randperm(batch.size, generator=self.generator) for _ in range(t.epochs)]  # per epoch
        reader = _Reader(self.model, batch, t.temperature)
        old = self._recompute_old(batch, orders, reader)
        targets = self._targets(batch, old)
        stats, dropped = self._update(batch, orders, old, targets, reader)
        out = self._diagnostics(batch, old, targets, stats, dropped, reader)
        out["time/train_s"] = time.perf_counter() - start
        return out

    def _recompute_old(self, batch: TrajectoryBatch, orders: list[Tensor], reader: _Reader) -> _Old:
        """log π_old and V with the weights at the start of the step. The first minibatch's forward pass keeps its
        graph and serves that minibatch's update too (and, for the first `kl_rows` of its episodes, the full
        distributions policy/kl_step starts from); the other episodes go without grad, in chunks of episodes of
        similar length (each cut at its longest), ~20 % faster per row on a CPU than all at once."""
        t = self.config.train
        B = batch.size
        mb = B // t.minibatches
        first = orders[0][:mb]
        kl_rows = first[: min(t.kl_step_rows, mb)]
        kl_before = None
        if len(kl_rows):
            reader.count(first)
            first_out, kl_before = rows_distributions(self.model, batch, first, t.temperature, len(kl_rows))
        else:
            first_out = reader.forward(first)
        logp_old, values_old = (x.new_empty(B, x.shape[1]) for x in first_out[:2])
        with torch.no_grad():
            logp_old[first], values_old[first] = first_out[0], first_out[1]
            rest = orders[0][mb:]
            rest = rest[policy_widths(batch.mask[rest]).argsort(stable=True)]
            for rows in rest.split(mb) if len(rest) else ():  # one minibatch: the first pass read them all
                logp_old[rows], values_old[rows], _ = reader.forward(rows)
            if not (torch.isfinite(logp_old * batch.mask).all() and torch.isfinite(values_old).all()):
                raise NonFiniteUpdateError("non-finite log-probabilities or values from the learner's forward pass")
        return _Old(logp_old, values_old, first_out, kl_rows, kl_before)

    def _targets(self, batch: TrajectoryBatch, old: _Old) -> _Targets:
        """Channel 1 (the policy terms: anchor, mask statistic, weights) and channel 2 (the advantages and the
        critic's returns), and the step size the method scales the learning rate by."""
        m, side, mask = self.config.method, self.spec.policy, batch.mask
        lag = torch.where(mask > 0, self.version - batch.version, 0)
        terms = policy_terms(side, old.logp, batch.logp_behavior, mask, lag)
        estimate = estimate_advantages(
            self.spec.advantage, batch.rewards, old.values, mask, terms.log_ratio, m.gamma, m.lam
        )
        advantages = estimate.output.advantages
        returns = self._critic_targets(batch.rewards, old.values, mask, terms.log_ratio, estimate)
        if m.normalize_advantages:
            advantages = masked_whiten(advantages, mask)
        lr_scale = float(step_size_scale(side, terms.log_ratio, mask))
        return _Targets(lag, terms, estimate, advantages, returns, lr_scale)

    def _update(
        self, batch: TrajectoryBatch, orders: list[Tensor], old: _Old, targets: _Targets, reader: _Reader
    ) -> tuple[dict[str, list[float]], list[float]]:
        """The minibatch updates of every epoch at the method's scaled learning rate: per-minibatch statistics, and
        the policy tokens a live mask dropped (low, high)."""
        m, t, side, mask = self.config.method, self.config.train, self.spec.policy, batch.mask
        mb = batch.size // t.minibatches
        terms = targets.terms
        self.optimizer.param_groups[0]["lr"] = t.lr * targets.lr_scale
        live = side.mask_ratio == "live"
        stats: dict[str, list[float]] = {k: [] for k in _UPDATE_STATS}
        dropped = [0.0, 0.0]  # live mask: policy tokens dropped low / high over every minibatch
        for epoch, order in enumerate(orders):
            for j in range(t.minibatches):
                idx = order[j * mb : (j + 1) * mb]
                logp, values, entropy = old.first_out if epoch == j == 0 else reader.forward(idx)
                sub_mask = mask[idx]
                if live:  # the band tested on π_θ/μ as the loss sees it
                    live_ratio = behavior_log_ratio(logp.detach(), batch.logp_behavior[idx], sub_mask)
                    correction = correct_policy(side, live_ratio, terms.weight_log_ratio[idx], sub_mask)
                    dropped[0] += float(correction.dropped_low.sum())
                    dropped[1] += float(correction.dropped_high.sum())
                else:
                    correction = _select(terms.correction, idx)
                actor = actor_loss(
                    side,
                    logp,
                    terms.anchor[idx],
                    targets.advantages[idx],
                    correction,
                    sub_mask,
                    m.clip_low,
                    m.clip_high,
                    m.dual_clip,
                )
                critic = clipped_value_loss(values, old.values[idx], targets.returns[idx], sub_mask, m.value_clip)
                mean_entropy = masked_mean(entropy, sub_mask)
                loss = actor.loss + t.value_coef * critic.loss - t.entropy_coef * mean_entropy
                if not torch.isfinite(loss):
                    raise NonFiniteUpdateError(f"non-finite loss {loss.item()} at version {self.version}")
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                critic_norm = _grad_norm(self._critic_params)
                grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), t.max_grad_norm))
                if not math.isfinite(grad_norm):
                    self.optimizer.zero_grad(set_to_none=True)
                    raise NonFiniteUpdateError(f"non-finite gradient norm at version {self.version}")
                self.optimizer.step()
                drift = logp.detach() - old.logp[idx]  # π_θ against π_old as this minibatch read it
                if epoch or j or len(orders) * t.minibatches == 1:  # the first one's drift is 0 by construction
                    stats["actor/approx_kl"].append(float(masked_mean(torch.expm1(-drift) + drift, sub_mask)))
                for key, value in (
                    ("actor/loss", actor.loss),
                    ("actor/pg_clipfrac", actor.clipfrac),
                    ("actor/entropy", mean_entropy),
                    ("critic/value_loss", critic.loss),
                    ("critic/clipfrac", critic.clipfrac),
                ):
                    stats[key].append(float(value.detach()))
                stats["actor/grad_norm"].append(grad_norm)
                stats["critic/grad_norm"].append(critic_norm)
        self.optimizer.param_groups[0]["lr"] = t.lr
        self.version += 1
        return stats, dropped

    def _diagnostics(
        self,
        batch: TrajectoryBatch,
        old: _Old,
        targets: _Targets,
        stats: dict[str, list[float]],
        dropped: list[float],
        reader: _Reader,
    ) -> dict[str, float]:
        """The step's flat `group/name` record (docs/ALGORITHMS.md §5): the updates' means, the corrections, the
        policy's change over the step, the critic, the lag."""
        t, mask, terms = self.config.train, batch.mask, targets.terms
        log_ratio = terms.log_ratio
        out = {k: sum(v) / len(v) for k, v in stats.items()}
        diagnostics = (
            ratio_diagnostics(log_ratio, mask, terms.correction)
            | behavior_kl(log_ratio, mask)
            | trace_diagnostics(log_ratio, mask, targets.estimate.trace)
        )
        out |= {k: float(v) for k, v in diagnostics.items()}
        if self.spec.policy.mask_ratio == "live":
            n = float(mask.sum()) * t.epochs
            out |= {
                "correction/masked_frac_low": dropped[0] / n,
                "correction/masked_frac_high": dropped[1] / n,
                "correction/masked_frac": sum(dropped) / n,
            }
        kl_rows = old.kl_rows
        if len(kl_rows):
            with torch.no_grad():
                reader.count(kl_rows)
                width = old.kl_before.shape[1]
                after, _ = response_distributions(self.model, batch.select(kl_rows).head(width), t.temperature)
                kl_mask = mask[kl_rows][:, :width]
                out["policy/kl_step"] = float(exact_kl(old.kl_before, after, kl_mask))
                drift = (
                    token_statistics(after, batch.response_ids[kl_rows][:, :width])[0] - old.logp[kl_rows][:, :width]
                )
                out["policy/kl_step_k3"] = float(masked_mean(torch.expm1(-drift) + drift, kl_mask))
        out["actor/lr_scale"] = targets.lr_scale
        out["critic/explained_var"] = float(explained_variance(old.values, targets.returns, mask))
        out["critic/return_mean"] = float(masked_mean(targets.returns, mask))
        staleness = targets.lag.float()
        out["staleness/mean"] = float(masked_mean(staleness, mask))
        out["staleness/max"] = float(torch.where(mask > 0, staleness, 0.0).max())
        out["staleness/updates"] = out["staleness/mean"] * t.updates_per_version
        out["learner/positions"] = float(reader.positions)
        return out

    def warm_up_critic(self, batch: TrajectoryBatch) -> dict[str, float]:
        """One value-only update on `batch` (critic warm-up, verl's `trainer.critic_warmup`).

        The critic's target is the method's own (its λ, its estimator); minibatches and epochs as in
        a policy step, the gradient reaches only the critic's parameters (value head, and the critic
        trunk when separate: with a shared trunk only the head learns), so the policy is untouched and
        `version` does not move. `critic/explained_var` is measured before the update, on this batch.
        """
        batch = self._prepare(batch)
        m, t = self.config.method, self.config.train
        mask, B = batch.mask, batch.size
        mb = B // t.minibatches
        with torch.no_grad():
            logp_old, values_old, _ = rows_logprobs(self.model, batch, torch.arange(B), t.temperature)
            if not (torch.isfinite(logp_old * mask).all() and torch.isfinite(values_old).all()):
                raise NonFiniteUpdateError("non-finite log-probabilities or values in critic warm-up")
        lag = torch.where(mask > 0, self.version - batch.version, 0)
        log_ratio = policy_terms(self.spec.policy, logp_old, batch.logp_behavior, mask, lag).log_ratio
        estimate = estimate_advantages(self.spec.advantage, batch.rewards, values_old, mask, log_ratio, m.gamma, m.lam)
        returns = self._critic_targets(batch.rewards, values_old, mask, log_ratio, estimate)
        losses = []
        for _ in range(t.epochs):
            order = torch.randperm(B, generator=self.generator)
            for j in range(t.minibatches):
                idx = order[j * mb : (j + 1) * mb]
                values = rows_values(self.model, batch, idx)
                critic = clipped_value_loss(values, values_old[idx], returns[idx], mask[idx], m.value_clip)
                loss = t.value_coef * critic.loss
                if not torch.isfinite(loss):
                    raise NonFiniteUpdateError(
                        f"non-finite value loss in critic warm-up step {self.critic_warmup_steps}"
                    )
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                for p in self._policy_params:  # the policy stays exactly as it is
                    p.grad = None
                grad_norm = float(torch.nn.utils.clip_grad_norm_(self._critic_params, t.max_grad_norm))
                if not math.isfinite(grad_norm):
                    self.optimizer.zero_grad(set_to_none=True)
                    raise NonFiniteUpdateError(f"non-finite critic gradient in warm-up step {self.critic_warmup_steps}")
                self.optimizer.step()
                losses.append(float(critic.loss.detach()))
        self.critic_warmup_steps += 1
        return {
            "warmup/step": float(self.critic_warmup_steps),
            "critic/value_loss": sum(losses) / len(losses),
            "critic/explained_var": float(explained_variance(values_old, returns, mask)),
        }

    def state_dict(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "version": self.version,
            "generator": self.generator.get_state(),
            "critic_warmup_steps": self.critic_warmup_steps,
        }

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.version = state["version"]
        self.generator.set_state(state["generator"])
        self.critic_warmup_steps = state["critic_warmup_steps"]


def _grad_norm(params: list[torch.nn.Parameter]) -> float:
    grads = [p.grad.detach().norm() for p in params if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack(grads))) if grads else 0.0
