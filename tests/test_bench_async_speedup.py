"""The async bench's arithmetic on made-up medians, derived by hand."""

import pytest

from bench.async_speedup import ratios


def test_ratios_by_hand():
    run = lambda step, rollout, train, per_pos: {
        "time/step_s": step,
        "time/rollout_s": rollout,
        "time/train_s": train,
        "train_s_per_position": per_pos,
    }
    results = {
        "sync_ppo k=0": run(0.20, 0.06, 0.10, 1.0),
        "async_ppo k=2": run(0.11, 0.07, 0.10, 2.0),
        "copc k=2": run(0.125, 0.08, 0.11, 2.1),
    }
    q = ratios(results, 2)
    assert q["bound"] == pytest.approx(0.16 / 0.10)  # (gen + train) / max(gen, train) of the sync run
    assert q["speedup"] == pytest.approx(0.20 / 0.125)
    assert q["share"] == pytest.approx((0.20 / 0.125) / 1.6)  # 1.6 / 1.6 = 1
    assert q["overhead"] == pytest.approx(0.11 / 0.10)
    assert q["overhead_per_position"] == pytest.approx(2.1 / 2.0)
    assert q["overlap"] == pytest.approx(0.11 / 0.125)
