import math

import pytest
import torch

from copc_core.config import with_overrides
from copc_core.train.stability import area_under_curve, collapse_step, drops, spikes, sustained_collapse_step
from copc_core.train.trainer import BoundedStalenessNeedsRayError, Trainer, behavior_version
from tests.conftest import tiny_config

TIMING = ("time/",)


def strip_times(records):
    return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in records]


def test_same_seed_same_metrics_at_k0(tiny_warm_state):
    cfg = tiny_config(method="sync_ppo", steps=3)
    a, b = Trainer(cfg, tiny_warm_state), Trainer(cfg, tiny_warm_state)
    a.run(), b.run()
    assert strip_times(a.history) == strip_times(b.history)
    assert a.evals == b.evals
    for (k, v), (_, w) in zip(a.model.state_dict().items(), b.model.state_dict().items()):
        assert torch.equal(v, w), k


def test_different_seed_different_run(tiny_warm_state):
    a = Trainer(tiny_config(steps=2, seed=0), tiny_warm_state)
    b = Trainer(tiny_config(steps=2, seed=1), tiny_warm_state)
    a.run(), b.run()
    assert strip_times(a.history) != strip_times(b.history)


@pytest.mark.parametrize("k", [0, 2])
def test_resume_continues_identically(tiny_warm_state, k):
    cfg = tiny_config(method="copc", staleness=k, steps=6)
    straight = Trainer(cfg, tiny_warm_state)
    straight.run()
    first = Trainer(cfg, tiny_warm_state)
    while first.step < 3:
        first.run_step()
    state = first.state_dict()
    torch.save(state, "/dev/null")  # the state is serialisable
    resumed = Trainer(cfg, tiny_warm_state)
    resumed.load_state_dict(state)
    resumed.run()
    assert strip_times(resumed.history) == strip_times(straight.history)
    assert resumed.evals == straight.evals


def test_checkpoint_from_another_config_is_refused(tiny_warm_state):
    state = Trainer(tiny_config(steps=2), tiny_warm_state).state_dict()
    with pytest.raises(ValueError, match="different RunConfig"):
        Trainer(tiny_config(steps=3), tiny_warm_state).load_state_dict(state)


def test_controlled_staleness_is_exact(tiny_warm_state):
    k = 2
    tr = Trainer(tiny_config(method="copc", staleness=k, steps=5), tiny_warm_state)
    tr.run()
    # the batch of step v (0-based) is sampled with version max(0, v − k): lag min(v, k)
    assert [h["staleness/mean"] for h in tr.history] == [min(v, k) for v in range(5)]
    assert [h["staleness/max"] for h in tr.history] == [min(v, k) for v in range(5)]
    assert sorted(tr.ring) == [3, 4, 5]  # only the versions still needed (v − k … v)
    # off-policy from the first lagged step on: ρ ≠ 1 somewhere
    assert tr.history[0]["correction/ratio_max"] == pytest.approx(1.0, abs=1e-4)
    assert tr.history[3]["correction/ratio_max"] > 1.0


def test_summary_fields(tiny_warm_state):
    tr = Trainer(tiny_config(steps=4), tiny_warm_state)
    s = tr.run()
    assert s.steps_completed == 4 and [e["step"] for e in tr.evals] == [0, 2, 4]
    assert s.warm_start_accuracy == tr.evals[0]["eval/accuracy"]
    assert s.final_accuracy == tr.evals[-1]["eval/accuracy"]
    assert s.peak_accuracy == max(e["eval/accuracy"] for e in tr.evals)
    assert 0 <= s.auc_accuracy <= 1 and s.mean_step_s > 0


def test_non_finite_update_stops_the_run_and_is_reported(tiny_warm_state, monkeypatch):
    tr = Trainer(tiny_config(steps=4), tiny_warm_state)
    original = tr.sampler.sample

    def poisoned(*args, **kwargs):
        batch = original(*args, **kwargs)
        if tr.step == 2:
            batch.rewards[0, 0] = math.nan
        return batch

    monkeypatch.setattr(tr.sampler, "sample", poisoned)
    before = {k: v.clone() for k, v in tr.model.state_dict().items()}
    s = tr.run()
    assert s.collapsed and s.collapse_reason == "non_finite" and s.collapse_step == 2 and s.steps_completed == 2
    assert all(torch.isfinite(v).all() for v in tr.state_dict()["learner"]["model"].values())
    assert any(not torch.equal(before[k], v) for k, v in tr.model.state_dict().items())


def test_uniform_lag_draws_each_batchs_lag_from_0_to_k(tiny_warm_state):
    cfg = with_overrides(tiny_config(method="copc", staleness=3, steps=40), {"train.lag": "uniform"})
    versions = [behavior_version(cfg, v) for v in range(40)]
    lags = [v - b for v, b in enumerate(versions)]
    assert all(0 <= lag <= min(v, 3) for v, lag in enumerate(lags))
    assert set(lags[3:]) == {0, 1, 2, 3}  # every lag of {0..k} occurs
    assert versions == [behavior_version(cfg, v) for v in range(40)]  # seeded: the same draw every time
    other_seed = with_overrides(cfg, {"train.seed": 1})
    assert [behavior_version(other_seed, v) for v in range(40)] != versions
    exact = tiny_config(method="copc", staleness=3, steps=40)
    assert [behavior_version(exact, v) for v in range(40)] == [max(0, v - 3) for v in range(40)]
    tr = Trainer(with_overrides(cfg, {"train.steps": 6}), tiny_warm_state)
    tr.run()
    assert [h["staleness/mean"] for h in tr.history] == [float(lag) for lag in lags[:6]]


def test_bounded_staleness_is_refused_in_process_by_name(tiny_warm_state):
    cfg = with_overrides(tiny_config(steps=2), {"train.eta": 2, "train.eta_chunk": 8})
    with pytest.raises(BoundedStalenessNeedsRayError, match="Ray runtime"):
        Trainer(cfg, tiny_warm_state)
    with pytest.raises(ValueError, match="two schedules"):
        with_overrides(tiny_config(staleness=2), {"train.eta": 2})


def test_critic_warmup_runs_once_and_resumes(tiny_warm_state):
    cfg = with_overrides(tiny_config(method="copc", staleness=1, steps=3), {"train.critic_warmup_steps": 3})
    straight = Trainer(cfg, tiny_warm_state)
    policy = {k: v.clone() for k, v in straight.model.state_dict().items() if not k.startswith("value_head")}
    calls = []
    assert straight.warm_up_critic(lambda i, n, record: calls.append((i, n)))
    assert calls == [(1, 3), (2, 3), (3, 3)] and straight.learner.version == 0 and straight.step == 0
    assert all(torch.equal(policy[k], v) for k, v in straight.model.state_dict().items() if k in policy)
    assert not straight.warm_up_critic()  # done: nothing more
    s = straight.run()
    assert s.critic_warmup_explained_var == straight.warmup[-1]["critic/explained_var"]
    assert s.critic_explained_var_first == straight.history[0]["critic/explained_var"]
    # interrupted in the middle of the warm-up: the resumed run takes the remaining step and agrees

    class Interrupted(Exception):
        pass

    def interrupt_after_two(i, n, record):
        if i == 2:
            raise Interrupted

    partial = Trainer(cfg, tiny_warm_state)
    with pytest.raises(Interrupted):
        partial.warm_up_critic(interrupt_after_two)
    assert partial.learner.critic_warmup_steps == 2 and len(partial.warmup) == 2
    resumed = Trainer(cfg, tiny_warm_state)
    resumed.load_state_dict(partial.state_dict())
    resumed.run()
    assert strip_times(resumed.history) == strip_times(straight.history)
    assert resumed.warmup == straight.warmup and resumed.evals == straight.evals


def test_training_reward_collapse_is_reported_beside_the_held_out_one(tiny_warm_state):
    tr = Trainer(tiny_config(steps=4), tiny_warm_state)
    s = tr.run()
    rewards = [h["reward/mean"] for h in tr.history]
    assert s.collapse_step_train == sustained_collapse_step([int(h["step"]) for h in tr.history], rewards)
    assert s.kl_step_mean == pytest.approx(sum(h["policy/kl_step"] for h in tr.history) / 4)
    assert s.staleness_updates_mean == 0.0


# ---- stability rules ----


def test_collapse_rule():
    steps = [0, 10, 20, 30, 40]
    assert collapse_step(steps, [0.3, 0.8, 0.9, 0.2, 0.0]) == 30
    assert collapse_step(steps, [0.3, 0.8, 0.9, 0.2, 0.7]) is None  # recovered: not collapsed
    assert collapse_step(steps, [0.3, 0.8, 0.9, 0.46, 0.45]) is None  # exactly half is not "more than 50 %"
    assert collapse_step(steps, [0.3, 0.8, 0.9, 0.44, 0.44]) == 30
    assert collapse_step(steps, [0.0] * 5) is None


def test_the_training_reward_rule_smooths_over_five_steps_and_needs_a_fall_that_lasts():
    """The plain rule on a batch's mean reward flagged steps 19 and 20 of 20-step runs that had not collapsed."""
    steps = list(range(1, 21))
    noisy = [0.2, 0.4, 0.3, 0.5] + [0.3, 0.4] * 7 + [0.2, 0.2]
    assert collapse_step(steps, noisy) == 19  # the plain rule: 0.2 < 0.5 × 0.5 for the last two batches
    assert sustained_collapse_step(steps, noisy) is None  # its 5-step means: 0.30–0.38 from step 4 on, never < 0.19
    # a real fall at step 11: the 5-step means read 0.8, 0.64, 0.48, 0.32 (< 0.4 = half the peak) from step 13 on
    assert sustained_collapse_step(steps, [0.8] * 10 + [0.0] * 10) == 13
    # the same fall at step 17 crosses at step 19: two steps of tail, shorter than the window
    assert collapse_step(steps, [0.8] * 16 + [0.0] * 4) == 17
    assert sustained_collapse_step(steps, [0.8] * 16 + [0.0] * 4) is None
    assert sustained_collapse_step(steps, [0.8] * 14 + [0.0] * 6) is None  # crossing at 17: a tail of 4 steps
    assert sustained_collapse_step(steps, [0.8] * 13 + [0.0] * 7) == 16  # crossing at 16: a tail of 5 steps


def test_warnings_and_auc():
    assert spikes([1, 1, 1, 1, 1, 6, 1], 5.0) == [5]
    assert spikes([1, 1, 1, 1, 1, 5, 1], 5.0) == []
    assert drops([1, 1, 1, 1, 1, 0.4, 1], 0.5) == [5]
    assert area_under_curve([0, 10, 30], [0.0, 1.0, 1.0]) == pytest.approx((5 + 20) / 30)


def test_critic_layouts_share_the_warm_started_policy():
    """The SFT warm start trains the policy only: its weights do not depend on the critic's layout; with
    critic_init "policy" the separate critic trunk starts as a copy of the warm-started policy trunk."""
    from copc_core.train.warmstart import warm_start

    shared = warm_start(tiny_config())
    separate = warm_start(with_overrides(tiny_config(), {"model.separate_critic": True}))
    copied = warm_start(with_overrides(tiny_config(), {"model.separate_critic": True, "model.critic_init": "policy"}))
    for name, value in shared.items():
        if not name.startswith("value_head"):
            assert torch.equal(value, separate[name]) and torch.equal(value, copied[name]), name
    trunk = {k[len("trunk.") :]: v for k, v in shared.items() if k.startswith("trunk.")}
    assert all(torch.equal(copied[f"critic_trunk.{k}"], v) for k, v in trunk.items())
    assert not all(torch.equal(separate[f"critic_trunk.{k}"], v) for k, v in trunk.items())
    with pytest.raises(ValueError, match="separate_critic"):
        with_overrides(tiny_config(), {"model.critic_init": "policy"})


def test_greedy_eval_at_the_ends_only_leaves_the_run_and_its_sampled_accuracy_unchanged(tiny_warm_state):
    """`train.greedy_eval = "final"` skips greedy decoding between step 0 and the last step; the sampled
    accuracy has its own generator and training never reads an evaluation, so both are bit for bit the same."""
    runs = {}
    for mode in ("every", "final"):
        cfg = with_overrides(tiny_config("copc", staleness=2, steps=6), {"train.greedy_eval": mode})
        trainer = Trainer(cfg, tiny_warm_state)
        runs[mode] = (trainer, trainer.run())
    every, final = runs["every"][0], runs["final"][0]
    assert [e["eval/accuracy"] for e in every.evals] == [e["eval/accuracy"] for e in final.evals]
    assert [h["actor/loss"] for h in every.history] == [h["actor/loss"] for h in final.history]
    assert [int(e["step"]) for e in final.evals if "eval/accuracy_greedy" in e] == [0, 6]
    assert all("eval/accuracy_greedy" in e for e in every.evals) and len(every.evals) == 4
    assert runs["final"][1].final_accuracy_greedy == runs["every"][1].final_accuracy_greedy
    assert runs["final"][1].auc_accuracy == runs["every"][1].auc_accuracy
