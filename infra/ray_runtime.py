"""The Ray async runtime: rollout-worker actors, a learner actor, versioned weights, overlap.

Actors are thin shells around copc_core objects (`TorchSampler`, `Learner`). Weights travel as
object-store references to one packed byte buffer (`infra/packed_weights.py`): the learner returns
its new weights from `step`, the driver hands the reference to workers, nobody copies them through
the driver. Batches likewise: under controlled
lag the learner step is called with the worker's result reference and Ray moves the batch from
worker to learner directly (the learner reports episodes and token lags back for the counters).

Two schedules:
- **controlled lag k** (`RayTrainer.run`): the batch of step v is sampled with version max(0, v − k),
  exactly as the in-process `Trainer` does, with the same per-step seeds, so the numbers agree.
  For k ≥ 1 the sample for step v + 1 is submitted before step v trains: sampling and training
  overlap; and learner step v + 1 is queued on the learner before step v's result is back, so the
  learner goes from one step to the next without a round trip through the driver (a learner call
  names the version it expects to update and is skipped, untouched, when the learner is elsewhere).
  Steps that are multiples of `barrier_every` are taken without a step queued behind them, so a
  checkpoint written there is consistent. k = 0 runs synchronously.
- **bounded staleness η** (`RayTrainer.run_bounded`): workers sample continuously in chunks with the
  newest weights; AReaL's admission rule lets a chunk start only while
  accepted + running < (η + v + 1) · batch_size, and batches are consumed in start order, so no
  consumed token is more than η versions old.

Faults: a rollout worker that dies is replaced and its request re-issued with the same seed (a
request is consumed exactly once: `counters` track it); every wait has a timeout that raises
`RuntimeTimeoutError` naming what it waited for.
"""

from __future__ import annotations

import collections
import os
import pathlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import ray
import torch
from ray.exceptions import GetTimeoutError, RayActorError

from copc_core.config import RunConfig
from copc_core.engines.backends import build_model, make_engine, snapshot
from copc_core.engines.rollout import TrajectoryBatch, episode_stats
from copc_core.rl.tensors import NonFiniteError
from copc_core.train.learner import Learner
from copc_core.train.stability import RunSummary, summarise
from copc_core.train.trainer import WARMUP_KEY_OFFSET, ProblemStream, behavior_version, evaluate, sampling_generator
from infra.packed_weights import PackedWeights, pack, unpack

CHUNK_KEY_OFFSET = 10_000_000  # seed keys of free-running chunks never meet those of lag-k steps


class RuntimeTimeoutError(TimeoutError):
    """A Ray call did not answer in time (weight sync, sampling, a learner step)."""


def init_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Join a cluster at `address` (else at $RAY_ADDRESS, Ray's own convention: what `ray job submit` sets for the
    command it runs), or start a local Ray with its node address 127.0.0.1 (no dashboard).

    What a local Ray 2.60 listens on (measured with `ss -ltn`, docs/RELIABILITY.md): its GCS, raylet and
    worker gRPC servers on all interfaces whatever the node address, guarded by Ray's token
    authentication (on by default since Ray 2.5x); the dashboard agent on the machine's address too.
    Ray offers no option to bind them to loopback. What this function can do, it does: the auth token
    file is made readable by its owner only.
    """
    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS", "").strip()
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                # address="local": always a fresh local instance, never a cluster `ray start` left on this machine
                ray.init(
                    address="local",
                    num_cpus=num_cpus,
                    include_dashboard=False,
                    log_to_driver=False,
                    _node_ip_address="127.0.0.1",
                )
                break
            except Exception as err:  # Ray gives its raylet a fixed 30 s to register; a loaded machine can miss it
                if "timed out during startup" not in str(err) or attempt == START_ATTEMPTS:
                    raise
                ray.shutdown()
                time.sleep(2 * attempt)
    restrict_auth_token()


START_ATTEMPTS = 3  # local Ray starts tried before its startup timeout is reported


def restrict_auth_token() -> pathlib.Path | None:
    """Make Ray's auth token file (RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token) mode 0600; its path, if any."""
    path = pathlib.Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or pathlib.Path.home() / ".ray" / "auth_token")
    if path.is_file() and path.stat().st_mode & 0o077:
        os.chmod(path, 0o600)
    return path if path.is_file() else None


@ray.remote
class RolloutWorker:
    """Samples episodes for a given step with given weights (thin shell over `TorchSampler`)."""

    def __init__(self, config_json: str, torch_threads: int):
        torch.set_num_threads(torch_threads)
        self.config = RunConfig.model_validate_json(config_json)
        self.sampler = make_engine(self.config)
        self.problems = ProblemStream(self.config, self.config.train.seed)
        self.loaded = -1

    def _load(self, weights: PackedWeights, version: int) -> None:
        if version != self.loaded:
            self.sampler.load_weights(unpack(weights), version)
            self.loaded = version

    def sample(self, weights: PackedWeights, version: int, key: int, n: int) -> tuple[TrajectoryBatch, float]:
        """n episodes with `version`; problems and sampling seeds depend only on (run seed, key).

        The controlled-lag schedule uses key = step, like the in-process trainer.
        """
        start = time.perf_counter()
        self._load(weights, version)
        problems = self.problems.batch(key, n)
        batch = self.sampler.sample(problems, version, sampling_generator(self.config.train.seed, key))
        return batch, time.perf_counter() - start

    def evaluate(self, weights: PackedWeights, version: int) -> dict[str, float]:
        self._load(weights, version)
        return evaluate(self.sampler, self.problems.eval_problems, self.config, version)

    def pid(self) -> int:
        import os

        return os.getpid()


@ray.remote
class LearnerActor:
    """Holds the trainable model and optimiser (thin shell over `Learner`)."""

    def __init__(self, config_json: str, warm_state: dict, torch_threads: int):
        torch.set_num_threads(torch_threads)
        self.config = RunConfig.model_validate_json(config_json)
        model = build_model(self.config, self.config.train.seed)
        model.load_state_dict(warm_state)
        self.learner = Learner(model, self.config, torch.Generator().manual_seed(2 * self.config.train.seed + 1))

    @ray.method(num_returns=3)
    def step(self, version: int, *parts: tuple[TrajectoryBatch, float]) -> tuple[dict, dict, PackedWeights | None]:
        """One update on the concatenated parts; returns (metrics, accounting, new weights) as three objects.

        `version` is the learner version the driver means this step to update; a call that finds the
        learner elsewhere (a step before it failed or was submitted again) changes nothing and
        answers {"skipped": ...}. A part is a worker's `sample` result, or the reference to it: Ray
        hands the learner the object straight from the worker, and a part whose worker died fails
        this call before it runs. Accounting = episodes consumed and the realised lag of every policy
        token (learner version − sampling version).
        """
        if version != self.learner.version:
            return {"skipped": f"called for version {version}, the learner is at {self.learner.version}"}, {}, None
        batch = parts[0][0] if len(parts) == 1 else TrajectoryBatch.concat([b for b, _ in parts])
        lags = (self.learner.version - batch.version)[batch.mask > 0]
        accounting = {
            "episodes": batch.size,
            "lags": {int(lag): int(n) for lag, n in zip(*torch.unique(lags, return_counts=True))},
        }
        try:
            metrics = self.learner.step(batch)
        except NonFiniteError as err:
            return {"error": str(err)}, accounting, None
        metrics |= episode_stats(batch)
        metrics["time/rollout_s"] = max(seconds for _, seconds in parts)
        return metrics, accounting, pack(self.learner.model.state_dict())

    def warm_up_critic(self, part: tuple[TrajectoryBatch, float]) -> dict:
        """One value-only update (critic warm-up) on a worker's batch; the policy and the version stay."""
        return self.learner.warm_up_critic(part[0])

    def weights(self) -> dict:
        return snapshot(self.learner.model)

    def state_dict(self) -> dict:
        return self.learner.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.learner.load_state_dict(state)


@dataclass
class Counters:
    """Exact bookkeeping of rollout requests and episodes (survives resume)."""

    requests_submitted: int = 0
    requests_completed: int = 0
    requests_reissued: int = 0
    workers_replaced: int = 0
    episodes_consumed: int = 0
    episodes_started: int = 0  # bounded staleness: episodes admitted (accepted + running)
    lag_histogram: dict[int, int] = field(default_factory=dict)  # realised per-token lag → count


def get_within(ref, timeout_s: float, what: str):
    """`ray.get` with the run's call timeout, raising `RuntimeTimeoutError` that names what was awaited."""
    try:
        return ray.get(ref, timeout=timeout_s)
    except GetTimeoutError:
        raise RuntimeTimeoutError(f"no answer within {timeout_s:.0f} s while waiting for {what}") from None


class RolloutPool:
    """The rollout actors and their requests: a request names its weights, version, key and size; a dead
    worker is replaced and its requests re-issued with the same seed (`Counters` keeps the books)."""

    def __init__(self, config: RunConfig, counters: Counters):
        self.config_json = config.model_dump_json()
        self.resources = config.resources
        self.threads = config.train.torch_threads
        self.counters = counters
        self.workers = [self._new_worker() for _ in range(self.resources.rollout_workers)]

    def _new_worker(self):
        r = self.resources
        return RolloutWorker.options(num_cpus=r.rollout_cpus, num_gpus=r.rollout_gpus).remote(
            self.config_json, self.threads
        )

    def submit(self, worker_index: int, weights: ray.ObjectRef, version: int, key: int, n: int) -> dict:
        self.counters.requests_submitted += 1
        actor = self.workers[worker_index]
        ref = actor.sample.remote(weights, version, key, n)
        return {
            "ref": ref,
            "worker": worker_index,
            "actor": actor,
            "weights": weights,
            "version": version,
            "key": key,
            "n": n,
        }

    def reissue(self, request: dict) -> None:
        """Send a request whose worker died again, same seed, to that worker's replacement."""
        w = request["worker"]
        if self.workers[w] is request["actor"]:  # not yet replaced for another request it held
            self.workers[w] = self._new_worker()
            self.counters.workers_replaced += 1
        self.counters.requests_reissued += 1
        request["actor"] = self.workers[w]
        request["ref"] = request["actor"].sample.remote(
            request["weights"], request["version"], request["key"], request["n"]
        )

    def died(self, request: dict, what: str) -> bool:
        """Whether the request's worker died (waits for its answer otherwise)."""
        try:
            get_within(request["ref"], self.resources.timeout_s, what)
            return False
        except RayActorError:
            return True

    def collect(self, request: dict, what: str) -> tuple[TrajectoryBatch, float]:
        """The request's result; a dead worker is replaced and the same request re-issued."""
        while True:
            try:
                result = get_within(request["ref"], self.resources.timeout_s, what)
                self.counters.requests_completed += 1
                return result
            except RayActorError:
                self.reissue(request)

    def evaluate(self, weights: ray.ObjectRef, version: int) -> dict[str, float]:
        return get_within(self.workers[0].evaluate.remote(weights, version), self.resources.timeout_s, "evaluation")

    def kill(self) -> None:
        for actor in self.workers:
            ray.kill(actor)


class RayTrainer:
    """Drives one run on Ray; the in-process `Trainer`'s twin with overlap and faults handled."""

    def __init__(self, config: RunConfig, warm_state: dict):
        """Actors as `config.resources` sizes them (CPUs, GPUs, rollout workers, call timeout), each with
        `config.train.torch_threads` torch threads."""
        self.config = config
        self.resources = resources = config.resources
        self.learner = LearnerActor.options(num_cpus=resources.learner_cpus, num_gpus=resources.learner_gpus).remote(
            config.model_dump_json(), warm_state, config.train.torch_threads
        )
        self.counters = Counters()
        self.pool = RolloutPool(config, self.counters)
        self.versions: dict[int, ray.ObjectRef] = {0: ray.put(pack(warm_state))}  # version → PackedWeights
        self.step = 0
        self.history: list[dict[str, float]] = []
        self.evals: list[dict[str, float]] = []
        self.non_finite_step: int | None = None
        self.warmup: list[dict[str, float]] = []  # critic warm-up records
        self._eta = 0  # bounded-staleness η of a run_bounded run (versions older than step − η are dropped)
        self._inflight: dict[int, tuple[tuple, list[dict]]] = {}  # step → (learner call's refs, its requests)
        self.fault_hook: Callable[[RayTrainer], None] | None = None  # tests kill actors from here

    # ---- plumbing ----

    @property
    def workers(self) -> list:
        """The rollout actors (tests kill them)."""
        return self.pool.workers

    def _get(self, ref, what: str):
        return get_within(ref, self.resources.timeout_s, what)

    def _submit(self, worker_index: int, version: int, key: int, n: int) -> dict:
        return self.pool.submit(worker_index, self.versions[version], version, key, n)

    def _submit_learner(self, step: int, requests: list[dict]) -> None:
        """Queue learner step `step` on the requests' result references (the learner runs its calls in order)."""
        refs = self.learner.step.remote(step, *[r["ref"] for r in requests])
        self._inflight[step] = (refs, requests)

    def _learn(self, step: int) -> tuple[dict, ray.ObjectRef]:
        """Wait for learner step `step`; (metrics, weights reference).

        When a worker died, Ray fails the step before the learner runs it: the lost requests are
        re-issued, and this step and every step queued behind it are submitted again, in order (the
        old calls behind it find the learner at the wrong version and are skipped).
        """
        what = f"learner step {step}"
        while True:
            (metrics_ref, accounting_ref, weights_ref), requests = self._inflight[step]
            try:
                metrics = self._get(metrics_ref, what)
                break
            except RayActorError:
                lost = [r for r in requests if self.pool.died(r, what)]
                if not lost:
                    raise  # the learner itself died
                for request in lost:
                    self.pool.reissue(request)
                for s in sorted(self._inflight):
                    self._submit_learner(s, self._inflight[s][1])
        del self._inflight[step]
        if "skipped" in metrics:  # every earlier step was applied before this call was made: a bug if seen
            raise RuntimeError(f"{what} was skipped by the learner: {metrics['skipped']}")
        self.counters.requests_completed += len(requests)
        self._account(self._get(accounting_ref, what))
        return metrics, weights_ref

    def _drain(self) -> None:
        """Wait out the calls queued behind a step that failed: each finds the learner unchanged and is skipped."""
        for step in sorted(self._inflight):
            (metrics_ref, _, _), _ = self._inflight.pop(step)
            self._get(metrics_ref, f"learner step {step} (queued behind a failed step)")

    def _account(self, accounting: dict) -> None:
        self.counters.episodes_consumed += accounting["episodes"]
        for lag, count in accounting["lags"].items():
            self.counters.lag_histogram[lag] = self.counters.lag_histogram.get(lag, 0) + count

    def _evaluate(self) -> None:
        self.evals.append(self.pool.evaluate(self.versions[self.step], self.step))

    def _after_step(self, metrics: dict, weights_ref, wall_start: float) -> bool:
        if "error" in metrics:
            self.non_finite_step = self.step
            return False
        self.step += 1
        self.versions[self.step] = weights_ref
        step_s = time.perf_counter() - wall_start
        metrics |= {
            "step": float(self.step),
            "time/step_s": step_s,
            "time/idle_frac": max(0.0, 1.0 - metrics["time/train_s"] / step_s),
        }
        self.history.append(metrics)
        keep_from = self.step - max(self.config.train.staleness, self._eta)
        for v in [v for v in self.versions if v < keep_from]:
            del self.versions[v]
        if self.step % self.config.train.eval_every == 0 or self.step == self.config.train.steps:
            self._evaluate()
        return True

    def warm_up_critic(self) -> bool:
        """The critic warm-up steps not yet taken (each on a fresh batch of the warm start, sampled by a
        worker with the same keys as in process); True when any ran."""
        t = self.config.train
        if len(self.warmup) >= t.critic_warmup_steps:
            return False
        while len(self.warmup) < t.critic_warmup_steps:
            key = WARMUP_KEY_OFFSET + len(self.warmup)
            request = self._submit(0, 0, key, t.batch_size)
            record = self._get(self.learner.warm_up_critic.remote(request["ref"]), f"critic warm-up step {key}")
            self.counters.requests_completed += 1
            self.warmup.append(record)
        return True

    # ---- controlled lag k ----

    def run(
        self, on_step: Callable[[RayTrainer, dict], None] | None = None, barrier_every: int | None = None
    ) -> RunSummary:
        """Controlled lag k; `on_step(trainer, metrics)` after every step.

        For k ≥ 1 learner step v + 1 is queued before step v's result is back, except when v + 1 is a
        multiple of `barrier_every`: there nothing is in flight while `on_step` runs, and
        `state_dict()` may be taken (a checkpoint).
        """
        t = self.config.train
        self.warm_up_critic()
        if not self.evals:
            self._evaluate()
        samples: dict[int, dict] = {}  # step → its rollout request, submitted ahead of its learner step
        while self.step < t.steps:
            v = self.step
            wall_start = time.perf_counter()
            if v not in self._inflight:
                self._submit_learner(
                    v, [samples.pop(v, None) or self._submit(0, behavior_version(self.config, v), v, t.batch_size)]
                )
            if self.fault_hook is not None:
                self.fault_hook(self)
            ahead = behavior_version(self.config, v + 1)
            if v + 1 < t.steps and ahead <= v:  # overlap: the next batch's weights (version ≤ v) already exist
                samples[v + 1] = self._submit(0, ahead, v + 1, t.batch_size)
                if not (barrier_every and (v + 1) % barrier_every == 0):
                    self._submit_learner(v + 1, [samples.pop(v + 1)])
            metrics, weights_ref = self._learn(v)
            if not self._after_step(metrics, weights_ref, wall_start):
                self._drain()
                break
            if on_step is not None:
                on_step(self, metrics)
        return self.summary()

    # ---- bounded staleness η ----

    def run_bounded(
        self, eta: int, chunk_size: int, on_step: Callable[[RayTrainer, dict], None] | None = None
    ) -> RunSummary:
        """Free-running sampling with AReaL's admission control; batches consumed in start order."""
        t = self.config.train
        if t.batch_size % chunk_size:
            raise ValueError(f"batch_size ({t.batch_size}) must be a multiple of chunk_size ({chunk_size})")
        self._eta = eta
        self.warm_up_critic()
        if not self.evals:
            self._evaluate()
        # chunks in flight when a checkpoint was written were lost with the process: sample them again
        self.counters.episodes_started = self.counters.episodes_consumed
        chunks_per_batch = t.batch_size // chunk_size
        in_flight: collections.OrderedDict[int, dict] = collections.OrderedDict()  # chunk index → request
        done: dict[int, tuple[TrajectoryBatch, float]] = {}
        next_chunk = self.counters.episodes_started // chunk_size
        free = list(range(len(self.workers)))
        busy: dict[int, int] = {}  # chunk → worker
        wall_start = time.perf_counter()
        while self.step < t.steps:
            # admission: start chunks while accepted + running < (η + v + 1) · B and a worker is free
            while free and (self.counters.episodes_started + chunk_size <= (eta + self.step + 1) * t.batch_size):
                w = free.pop(0)
                request = self._submit(w, self.step, CHUNK_KEY_OFFSET + next_chunk, chunk_size)
                in_flight[next_chunk] = request
                busy[next_chunk] = w
                self.counters.episodes_started += chunk_size
                next_chunk += 1
            first = self.step * chunks_per_batch
            wanted = list(range(first, first + chunks_per_batch))
            if all(c in done for c in wanted):
                parts = [done.pop(c) for c in wanted]
                metrics_ref, accounting_ref, weights_ref = self.learner.step.remote(self.step, *parts)
                metrics = self._get(metrics_ref, f"learner step {self.step}")
                self._account(self._get(accounting_ref, f"learner step {self.step}"))
                if not self._after_step(metrics, weights_ref, wall_start):
                    break
                wall_start = time.perf_counter()
                if on_step is not None:
                    on_step(self, metrics)
                continue
            ready, _ = ray.wait([r["ref"] for r in in_flight.values()], num_returns=1, timeout=self.resources.timeout_s)
            if not ready:
                raise RuntimeTimeoutError(f"no rollout chunk finished within {self.resources.timeout_s:.0f} s")
            chunk = next(c for c, r in in_flight.items() if r["ref"] == ready[0])
            request = in_flight.pop(chunk)
            done[chunk] = self.pool.collect(request, f"rollout chunk {chunk}")
            free.append(busy.pop(chunk))
        for request in in_flight.values():  # leave nothing running behind us
            ray.cancel(request["ref"], force=False)
        return self.summary()

    def summary(self) -> RunSummary:
        return summarise(self.evals, self.history, self.non_finite_step, self.warmup)

    def state_dict(self) -> dict:
        if self._inflight:
            raise RuntimeError(
                f"learner step(s) {sorted(self._inflight)} in flight: the state is only consistent at "
                "a barrier step (run(barrier_every=...)) or after the run"
            )
        return {
            "config": self.config.model_dump(mode="json"),
            "step": self.step,
            "learner": self._get(self.learner.state_dict.remote(), "learner state"),
            "versions": {v: unpack(ray.get(ref)) for v, ref in self.versions.items()},
            "history": list(self.history),
            "evals": list(self.evals),
            "counters": self.counters.__dict__.copy(),
            "non_finite_step": self.non_finite_step,
            "warmup": list(self.warmup),
        }

    def load_state_dict(self, state: dict) -> None:
        if state["config"] != self.config.model_dump(mode="json"):
            raise ValueError("checkpoint was written by a different RunConfig")
        self.step = state["step"]
        self._get(self.learner.load_state_dict.remote(state["learner"]), "learner restore")
        self.versions = {int(v): ray.put(pack(w)) for v, w in state["versions"].items()}
        self.history, self.evals = list(state["history"]), list(state["evals"])
        self.counters = self.pool.counters = Counters(**state["counters"])  # one book, the pool's too
        self.non_finite_step = state["non_finite_step"]
        self.warmup = list(state["warmup"])

    def shutdown(self) -> None:
        ray.kill(self.learner)
        self.pool.kill()
