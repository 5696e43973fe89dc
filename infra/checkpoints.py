"""Checkpoints and the warm-start cache on disk: atomic writes, config-checked loads."""

from __future__ import annotations

import os
import pathlib
import tempfile
from collections.abc import Callable

import torch

from copc_core.config import RunConfig
from copc_core.warmstart import warm_start, warm_start_key


def save_checkpoint(path: pathlib.Path, state: dict) -> None:
    """Write `state` to `path` atomically (temp file + rename): a crash never leaves half a file."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    os.close(fd)
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load_checkpoint(path: pathlib.Path) -> dict:
    return torch.load(pathlib.Path(path), weights_only=False)


def cached_warm_start(config: RunConfig, cache_dir: pathlib.Path,
                      progress: Callable[[int, int, float], None] | None = None) -> dict[str, torch.Tensor]:
    """Warm-start weights for `config`, computed once per (model, task, warm_start) hash.

    Computed on one torch thread, whatever the calling process uses: the cache is shared by every
    entry point (`copc train`, the sweep flow, the Ray driver), and its floats must be a function of
    the key alone, not of which process got there first (a CPU reduction split over two threads
    rounds differently).
    """
    path = pathlib.Path(cache_dir) / f"warmstart-{warm_start_key(config)}.pt"
    if path.exists():
        return torch.load(path, weights_only=True)
    caller_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        state = warm_start(config, progress)
    finally:
        torch.set_num_threads(caller_threads)
    save_checkpoint(path, state)
    return state
