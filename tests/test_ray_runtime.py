"""The Ray runtime on a real local Ray (2 CPUs), against the in-process trainer."""

import pytest
import ray
import torch

from copc_core.config import with_overrides
from infra.packed_weights import unpack
from infra.ray_runtime import LearnerActor, RayTrainer, RuntimeTimeoutError
from tests.conftest import in_process, tiny_config

pytestmark = pytest.mark.slow
HALF = {
    "resources.rollout_workers": 1,
    "resources.rollout_cpus": 0.5,
    "resources.learner_cpus": 0.5,
    # an actor's first call imports torch and builds its model: past 120 s once on a slow 2-core machine under the
    # six-worker run (a first critic warm-up call); the limit is for hangs, not speed
    "resources.timeout_s": 600,
}


def sized(cfg, resources=HALF):
    """`cfg` with its Ray actors sized for a 2-core test machine."""
    return with_overrides(cfg, resources)


@pytest.fixture(autouse=True)
def _ray(local_ray):
    """The session's Ray (tests/conftest.py)."""


def strip_times(records):
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in records]


@pytest.mark.parametrize("k", [0, 2])
def test_controlled_lag_matches_the_in_process_trainer(tiny_warm_state, k):
    cfg = tiny_config(method="copc", staleness=k, steps=4)
    reference = in_process(cfg, tiny_warm_state)
    rt = RayTrainer(sized(cfg), tiny_warm_state)
    try:
        rt.run()
    finally:
        rt.shutdown()
    assert strip_times(rt.history) == strip_times(reference.history)
    assert rt.evals == reference.evals
    assert rt.counters.requests_completed == 4 and rt.counters.episodes_consumed == 4 * cfg.train.batch_size
    assert max(rt.counters.lag_histogram) == k


def test_uniform_lag_and_critic_warmup_match_the_in_process_trainer(tiny_warm_state):
    """The behaviour version of each step, the warm-up batches and the value-only updates are the in-process
    trainer's, float for float; warm-up spends no version."""
    from copc_core.config import with_overrides

    cfg = with_overrides(
        tiny_config(method="copc", staleness=2, steps=5),
        {"train.lag": "uniform", "train.critic_warmup_steps": 2, "model.separate_critic": True},
    )
    warm = {**tiny_warm_state, **_critic_trunk(cfg)}
    reference = in_process(cfg, warm)
    rt = RayTrainer(sized(cfg), warm)
    try:
        rt.run()
    finally:
        rt.shutdown()
    assert rt.warmup == reference.warmup and len(rt.warmup) == 2
    assert strip_times(rt.history) == strip_times(reference.history)
    assert rt.evals == reference.evals
    assert [h["staleness/mean"] for h in rt.history] == [h["staleness/mean"] for h in reference.history]


def _critic_trunk(cfg):
    """The initial critic trunk of a separate-critic model (the SFT warm start trains the policy only)."""
    from copc_core.engines.backends import build_model

    return {k: v for k, v in build_model(cfg, cfg.warm_start.seed).state_dict().items() if k.startswith("critic_trunk")}


def test_bounded_staleness_through_the_front_door(tiny_warm_state, tmp_path):
    """`train.eta` in the config runs the free-running schedule from train_on_ray, with its files."""
    import json

    from copc_core.config import with_overrides
    from infra.local_run import train_on_ray

    cfg = with_overrides(
        tiny_config(method="copc", steps=4),
        {
            "train.eta": 1,
            "train.eta_chunk": 8,
            "resources.rollout_cpus": 0.5,
            "resources.learner_cpus": 0.5,
            "resources.timeout_s": HALF["resources.timeout_s"],
        },
    )
    summary = train_on_ray(cfg, tmp_path / "run", tmp_path / "cache", checkpoint_every=2)
    assert summary.steps_completed == 4 and summary.staleness_max <= 1
    on_disk = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert on_disk["steps_completed"] == 4
    # rerun: resumes from the final checkpoint, nothing left to do, same summary
    again = train_on_ray(cfg, tmp_path / "run", tmp_path / "cache", checkpoint_every=2)
    assert again.steps_completed == 4 and again.final_accuracy == summary.final_accuracy


def test_a_killed_rollout_actor_is_replaced_and_nothing_is_lost_or_doubled(tiny_warm_state):
    cfg = tiny_config(method="copc", staleness=1, steps=5)
    clean = RayTrainer(sized(cfg), tiny_warm_state)
    clean.run()
    clean.shutdown()
    faulty = RayTrainer(sized(cfg), tiny_warm_state)
    killed = []

    def kill_at_step_2(rt):
        if rt.step == 2 and not killed:
            ray.kill(rt.workers[0], no_restart=True)
            killed.append(True)

    faulty.fault_hook = kill_at_step_2
    try:
        summary = faulty.run()
    finally:
        faulty.shutdown()
    c = faulty.counters
    assert killed and c.workers_replaced == 1 and c.requests_reissued >= 1
    assert summary.steps_completed == 5
    assert c.requests_completed == 5 and c.episodes_consumed == 5 * cfg.train.batch_size
    assert sum(c.lag_histogram.values()) == sum(clean.counters.lag_histogram.values())
    # the re-issued request used the same seed: the run is the one without a fault
    assert strip_times(faulty.history) == strip_times(clean.history)


@pytest.mark.parametrize("eta", [0, 1, 2])
def test_bounded_staleness_never_exceeds_eta(tiny_warm_state, eta):
    cfg = tiny_config(method="copc", steps=6)
    rt = RayTrainer(sized(cfg, {**HALF, "resources.rollout_workers": 2}), tiny_warm_state)
    try:
        summary = rt.run_bounded(eta=eta, chunk_size=4)
    finally:
        rt.shutdown()
    c = rt.counters
    assert summary.steps_completed == 6 and c.episodes_consumed == 6 * cfg.train.batch_size
    assert max(c.lag_histogram) <= eta and summary.staleness_max <= eta
    if eta > 0:
        assert max(c.lag_histogram) >= 1  # free-running sampling does get ahead of the learner
    # admission: never more than (η + v + 1)·B episodes started
    assert c.episodes_started <= (eta + 6 + 1) * cfg.train.batch_size


def test_waits_time_out_with_a_clear_error(tiny_warm_state):
    cfg = tiny_config(steps=2)
    # a worker that can never be scheduled: the first wait must fail loudly, not hang
    rt = RayTrainer(
        sized(cfg, {"resources.rollout_cpus": 64, "resources.learner_cpus": 0.5, "resources.timeout_s": 3}),
        tiny_warm_state,
    )
    try:
        with pytest.raises(RuntimeTimeoutError, match="no answer within 3 s while waiting for evaluation"):
            rt.run()
    finally:
        rt.shutdown()


class _Stop(Exception):
    pass


def stop_at(step: int):
    """An `on_step` hook that interrupts the run once it has done `step` steps."""

    def hook(trainer, metrics):
        if trainer.step == step:
            raise _Stop

    return hook


def test_resume_restores_weights_history_and_counters(tiny_warm_state):
    cfg = tiny_config(method="copc", staleness=1, steps=5)
    straight = RayTrainer(sized(cfg), tiny_warm_state)
    try:
        straight.run()
    finally:
        straight.shutdown()
    first = RayTrainer(sized(cfg), tiny_warm_state)
    try:
        with pytest.raises(_Stop):
            first.run(stop_at(3), barrier_every=3)  # at step 3 nothing is queued behind: a consistent state
        state = first.state_dict()
    finally:
        first.shutdown()
    assert state["step"] == 3 and state["learner"]["version"] == 3
    assert state["counters"]["episodes_consumed"] == 3 * cfg.train.batch_size
    resumed = RayTrainer(sized(cfg), tiny_warm_state)
    try:
        resumed.load_state_dict(state)
        resumed.run()
    finally:
        resumed.shutdown()
    assert strip_times(resumed.history) == strip_times(straight.history)
    assert resumed.evals == straight.evals
    assert resumed.counters.episodes_consumed == straight.counters.episodes_consumed == 5 * cfg.train.batch_size
    assert resumed.counters.lag_histogram == straight.counters.lag_histogram


def test_state_is_refused_while_a_learner_step_is_queued(tiny_warm_state):
    """Between barriers (k ≥ 1) step v + 1 is already queued on the learner when step v returns: a
    state taken then would pair the learner of one step with the history of another."""
    cfg = tiny_config(method="copc", staleness=1, steps=5)
    rt = RayTrainer(sized(cfg), tiny_warm_state)
    try:
        with pytest.raises(_Stop):
            rt.run(stop_at(2))
        with pytest.raises(RuntimeError, match=r"learner step\(s\) \[2\] in flight"):
            rt.state_dict()
    finally:
        rt.shutdown()


POISONED = 2


class _PoisonedLearner(LearnerActor.__ray_actor_class__):
    """The learner actor, with NaN put into one reward of the batch of learner step POISONED."""

    @ray.method(num_returns=3)
    def step(self, version, *parts):
        if version == POISONED == self.learner.version:
            parts[0][0].rewards[0, -1] = float("nan")
        return super().step(version, *parts)


def test_a_non_finite_step_stops_the_run_and_the_step_queued_behind_it_changes_nothing(tiny_warm_state):
    cfg = tiny_config(method="copc", staleness=1, steps=6)
    rt = RayTrainer(sized(cfg), tiny_warm_state)
    ray.kill(rt.learner)
    rt.learner = (
        ray.remote(_PoisonedLearner).options(num_cpus=0.5).remote(rt.config.model_dump_json(), tiny_warm_state, 1)
    )
    try:
        summary = rt.run()
        learner_weights = ray.get(rt.learner.weights.remote())
        last_weights = unpack(ray.get(rt.versions[rt.step]))
        state = rt.state_dict()  # nothing left in flight
    finally:
        rt.shutdown()
    assert summary.collapse_reason == "non_finite" and summary.steps_completed == POISONED
    assert rt.non_finite_step == POISONED and state["learner"]["version"] == POISONED
    # step POISONED + 1 was queued before step POISONED failed; the learner skipped it
    assert all(torch.equal(learner_weights[k], last_weights[k]) for k in last_weights)
    # the poisoned batch was delivered (and refused); the skipped call consumed nothing
    c = rt.counters
    assert c.requests_completed == POISONED + 1 and c.episodes_consumed == (POISONED + 1) * cfg.train.batch_size


def test_the_ray_auth_token_is_readable_by_its_owner_only():
    from infra.ray_runtime import restrict_auth_token

    path = restrict_auth_token()  # the session's Ray is up: init_ray ran it already
    assert path is not None and path.stat().st_mode & 0o777 == 0o600


def test_a_local_ray_that_times_out_at_startup_is_started_again(monkeypatch):
    """Ray gives its raylet a fixed 30 s to register with the GCS; on a loaded machine the first start can
    miss it. init_ray tries again (and reports the error after its last attempt)."""
    import infra.ray_runtime as runtime

    calls = []

    def flaky_init(**kwargs):
        calls.append(kwargs)
        if len(calls) == 1:
            raise Exception("The current node timed out during startup. This could happen because ...")

    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # a local Ray, not one that $RAY_ADDRESS names
    monkeypatch.setattr(runtime.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(runtime.ray, "init", flaky_init)
    monkeypatch.setattr(runtime.ray, "shutdown", lambda: calls.append("shutdown"))
    monkeypatch.setattr(runtime.time, "sleep", lambda s: None)
    runtime.init_ray(num_cpus=2)
    assert len([c for c in calls if c != "shutdown"]) == 2 and "shutdown" in calls
    calls.clear()
    monkeypatch.setattr(runtime.ray, "init", lambda **kw: (_ for _ in ()).throw(Exception("timed out during startup")))
    with pytest.raises(Exception, match="timed out during startup"):
        runtime.init_ray(num_cpus=2)


def test_ray_address_in_the_environment_is_joined_as_ray_init_would(monkeypatch):
    """$RAY_ADDRESS (what `ray job submit` sets for its command) is joined, not a local Ray started beside it; an
    address given outright wins over it."""
    import infra.ray_runtime as runtime

    calls = []
    monkeypatch.setattr(runtime.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(runtime.ray, "init", lambda **kw: calls.append(kw))
    monkeypatch.setattr(runtime, "restrict_auth_token", lambda: None)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    runtime.init_ray(num_cpus=2)
    runtime.init_ray("10.0.0.6:6379")
    monkeypatch.setenv("RAY_ADDRESS", " ")
    runtime.init_ray(num_cpus=2)
    assert [c["address"] for c in calls] == ["10.0.0.5:6379", "10.0.0.6:6379", "local"], calls
