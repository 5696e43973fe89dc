"""The in-process trainer loop with controlled staleness k.

The batch for learner step v is sampled with the weights of version max(0, v − L_v): L_v = k
exactly (`lag: exact`), or drawn from {0, …, k} per step with a seeded generator (`lag: uniform`,
as a bounded-staleness system sees it); the trainer keeps a ring of the last k + 1 weight
snapshots. k = 0 is synchronous PPO. Before the first policy update, `critic_warmup_steps`
value-only updates run on batches sampled with the warm start (no version spent, policy
untouched). Evaluation on held-out prompts every `eval_every` steps (and at step 0, the warm
start), collapse detection and the `RunSummary` come from copc_core.train.stability. `state_dict()`
holds everything a resumed run needs to continue identically (weights, optimiser, RNG states,
snapshot ring, step, history, critic warm-up).

The Ray runtime (infra) runs the same pieces in actors and overlaps sampling with training;
bounded staleness η (free-running workers) exists only there.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import torch

from copc_core.config import RunConfig
from copc_core.engines.backends import build_model, make_engine, snapshot
from copc_core.engines.rollout import RolloutEngine, episode_stats
from copc_core.rl.tensors import NonFiniteError
from copc_core.tasks import make_task
from copc_core.train.learner import Learner
from copc_core.train.stability import RunSummary, summarise

WARMUP_KEY_OFFSET = 20_000_000  # problem/sampling keys of critic warm-up batches never meet those of steps


def step_seed(seed: int, step: int, stream: int) -> int:
    """A distinct, reproducible seed per (run seed, step, stream): sampling can run anywhere."""
    return (seed * 1_000_003 + step) * 7 + stream


class ProblemStream:
    """Training problems from a seeded generator, never drawn from the held-out eval set.

    The problems of step v depend only on (seed, v), so any process can produce them.
    """

    def __init__(self, config: RunConfig, seed: int):
        self.task = make_task(config.task)
        self.seed = seed
        self.eval_problems = self.task.eval_problems()
        self._held_out = {p.key for p in self.eval_problems}

    def batch(self, step: int, n: int) -> list:
        rng = random.Random(step_seed(self.seed, step, 0))
        out: list = []
        while len(out) < n:
            out += [p for p in self.task.sample(2 * n, rng.randrange(2**31)) if p.key not in self._held_out]
        return out[:n]


def sampling_generator(seed: int, step: int) -> torch.Generator:
    return torch.Generator().manual_seed(step_seed(seed, step, 1))


def behavior_version(config: RunConfig, step: int) -> int:
    """The weights version that samples the batch of learner step `step` under controlled lag."""
    t = config.train
    lag = t.staleness if t.lag == "exact" else random.Random(step_seed(t.seed, step, 2)).randint(0, t.staleness)
    return max(0, step - lag)


class BoundedStalenessNeedsRayError(ValueError):
    """`train.eta` (free-running sampling) was given to the in-process trainer."""


def evaluate(sampler: RolloutEngine, problems: list, config: RunConfig, step: int) -> dict[str, float]:
    """Held-out accuracy of the sampler's current weights: temperature-1 samples, and greedy (at every
    evaluation, or at step 0 and the last step only: `train.greedy_eval`). The sampled accuracy draws from
    its own generator, so whether greedy ran beside it does not change it."""
    sampled = sampler.sample(problems, step, torch.Generator().manual_seed(config.task.eval_seed + step))
    sampled_acc = float(sampled.rewards.sum(1).eq(1.0).float().mean())
    record = {
        "step": float(step),
        "eval/accuracy": sampled_acc,  # the policy being trained: temperature-1 samples
        "eval/accuracy_sampled": sampled_acc,
    }
    if config.train.greedy_eval == "every" or step in (0, config.train.steps):
        greedy = sampler.sample(problems, step, None, greedy=True)
        record["eval/accuracy_greedy"] = float(greedy.rewards.sum(1).eq(1.0).float().mean())
    return record


class Trainer:
    def __init__(self, config: RunConfig, warm_state: dict[str, torch.Tensor]):
        t = config.train
        if t.eta is not None:
            raise BoundedStalenessNeedsRayError(
                "bounded staleness (train.eta) samples with free-running workers: it "
                "runs on the Ray runtime only (copc train --runtime ray)"
            )
        self.config = config
        self.model = build_model(config, t.seed)
        self.model.load_state_dict(warm_state)
        self.sampler = make_engine(config)
        self.learner = Learner(self.model, config, torch.Generator().manual_seed(2 * t.seed + 1))
        self.problems = ProblemStream(config, t.seed)
        self.step = 0
        self.ring: dict[int, dict[str, torch.Tensor]] = {0: snapshot(self.model)}
        self.history: list[dict[str, float]] = []
        self.evals: list[dict[str, float]] = []
        self.non_finite_step: int | None = None
        self.warmup: list[dict[str, float]] = []  # critic warm-up records

    @property
    def done(self) -> bool:
        return self.step >= self.config.train.steps or self.non_finite_step is not None

    def behavior_version(self, step: int) -> int:
        return behavior_version(self.config, step)

    def warm_up_critic(self, progress: Callable[[int, int, dict[str, float]], None] | None = None) -> bool:
        """The critic warm-up steps not yet taken, each on a fresh batch sampled with the warm start.

        Returns whether any ran (the caller may then checkpoint). A non-finite value update raises.
        """
        total = self.config.train.critic_warmup_steps
        if self.learner.critic_warmup_steps >= total:
            return False
        self.sampler.load_weights(self.ring[0], 0)
        while self.learner.critic_warmup_steps < total:
            key = WARMUP_KEY_OFFSET + self.learner.critic_warmup_steps
            problems = self.problems.batch(key, self.config.train.batch_size)
            batch = self.sampler.sample(problems, 0, sampling_generator(self.config.train.seed, key))
            record = self.learner.warm_up_critic(batch)
            self.warmup.append(record)
            if progress is not None:
                progress(self.learner.critic_warmup_steps, total, record)
        return True

    def evaluate(self) -> dict[str, float]:
        """Greedy and sampled accuracy of the current weights on the held-out prompts."""
        self.sampler.load_weights(snapshot(self.model), self.step)
        record = evaluate(self.sampler, self.problems.eval_problems, self.config, self.step)
        self.evals.append(record)
        return record

    def run_step(self) -> dict[str, float]:
        """One learner step on a batch sampled with version max(0, v − k)."""
        if not self.evals:
            self.evaluate()  # the warm start's accuracy, at step 0
        start = time.perf_counter()
        version = self.behavior_version(self.step)
        self.sampler.load_weights(self.ring[version], version)
        problems = self.problems.batch(self.step, self.config.train.batch_size)
        batch = self.sampler.sample(problems, version, sampling_generator(self.config.train.seed, self.step))
        rollout_s = time.perf_counter() - start
        metrics = self.learner.step(batch)
        self.step += 1
        self.ring[self.step] = snapshot(self.model)
        for v in [v for v in self.ring if v < self.behavior_version(self.step)]:
            del self.ring[v]
        step_s = time.perf_counter() - start
        metrics |= episode_stats(batch)
        metrics |= {
            "step": float(self.step),
            "time/rollout_s": rollout_s,
            "time/step_s": step_s,
            "time/idle_frac": rollout_s / step_s,
        }
        self.history.append(metrics)
        if self.step % self.config.train.eval_every == 0 or self.step == self.config.train.steps:
            return metrics | self.evaluate()
        return metrics

    def run(self, on_step: Callable[[Trainer, dict[str, float]], None] | None = None) -> RunSummary:
        self.warm_up_critic()
        while not self.done:
            try:
                metrics = self.run_step()
            except NonFiniteError:  # nothing was applied: the weights stay those of this step
                self.non_finite_step = self.step
                break
            if on_step is not None:
                on_step(self, metrics)
        return self.summary()

    def summary(self) -> RunSummary:
        return summarise(self.evals, self.history, self.non_finite_step, self.warmup)

    def state_dict(self) -> dict:
        return {
            "config": self.config.model_dump(mode="json"),
            "step": self.step,
            "learner": self.learner.state_dict(),
            "ring": {v: dict(w) for v, w in self.ring.items()},
            "history": list(self.history),
            "evals": list(self.evals),
            "non_finite_step": self.non_finite_step,
            "warmup": list(self.warmup),
        }

    def load_state_dict(self, state: dict) -> None:
        if state["config"] != self.config.model_dump(mode="json"):
            raise ValueError("checkpoint was written by a different RunConfig")
        self.step = state["step"]
        self.learner.load_state_dict(state["learner"])
        self.ring = {int(v): dict(w) for v, w in state["ring"].items()}
        self.history = list(state["history"])
        self.evals = list(state["evals"])
        self.non_finite_step = state["non_finite_step"]
        self.warmup = list(state["warmup"])
