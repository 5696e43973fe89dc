"""The warm-start cache: its weights do not depend on the process that happens to compute them."""

import pytest
import torch

from infra.checkpoints import cached_warm_start
from tests.conftest import tiny_config


@pytest.mark.parametrize("threads", [1, 2])
def test_the_cached_warm_start_is_the_same_whatever_the_callers_thread_count(tmp_path, threads):
    """`copc train` sets one torch thread before its warm start; the sweep flow and the Ray driver
    keep the machine's default. Whoever computes the cached warm start first, it must be the same
    weights (it is cached by config hash and then shared by both), and the caller's setting survives."""
    cfg = tiny_config()
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        reference = cached_warm_start(cfg, tmp_path / "reference")
        torch.set_num_threads(threads)
        state = cached_warm_start(cfg, tmp_path / f"with-{threads}")
        assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(previous)
    assert reference.keys() == state.keys()
    assert all(torch.equal(reference[k], state[k]) for k in reference)
