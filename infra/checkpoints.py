"""Checkpoints and the warm-start cache on disk: atomic writes, integrity-checked, pickle-free loads.

A checkpoint `X.pt` is written with its SHA-256 beside it (`X.pt.sha256`), both atomically (temp file
+ rename), and the checkpoint it replaces is kept as `X.prev.pt` (with its digest). Loading checks the
digest and reads with `torch.load(weights_only=True)`: tensors, numbers, strings, lists and dicts only,
never code. A file that fails its digest or does not load is reported, and the previous checkpoint is
used instead with a warning; when neither is usable, `CheckpointError` names both files and why.
The warm-start cache is a cache: a damaged entry is recomputed, with a warning.
"""

from __future__ import annotations

import errno
import hashlib
import os
import pathlib
import tempfile
import warnings
from collections.abc import Callable

import torch

from copc_core.config import RunConfig
from copc_core.train.warmstart import warm_start, warm_start_key


class CheckpointError(RuntimeError):
    """No usable checkpoint: the message names each file tried and what was wrong with it."""


def digest_path(path: pathlib.Path) -> pathlib.Path:
    return path.with_name(path.name + ".sha256")


def previous_path(path: pathlib.Path) -> pathlib.Path:
    return path.with_name(f"{path.stem}.prev{path.suffix}")


def _sha256(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_atomically(path: pathlib.Path, write: Callable[[str], None]) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def save_checkpoint(path: pathlib.Path, state: dict, keep_previous: bool = True) -> None:
    """Write `state` and its digest atomically; the checkpoint it replaces becomes `*.prev.pt`.

    A crash at any point leaves a complete, verifiable checkpoint: the new one, or the previous one.
    """
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    os.close(fd)
    try:
        try:
            torch.save(state, tmp)
        except RuntimeError as err:  # torch reports a refused write (disk full, read-only) without its OS error
            raise OSError(errno.EIO, f"torch.save could not write it ({str(err).strip()})", str(path)) from err
        digest = _sha256(pathlib.Path(tmp))
        if keep_previous and path.exists() and digest_path(path).exists():
            os.replace(path, previous_path(path))
            os.replace(digest_path(path), digest_path(previous_path(path)))
        _write_atomically(digest_path(path), lambda t: pathlib.Path(t).write_text(digest + "\n"))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _read_verified(path: pathlib.Path) -> dict:
    """The state in `path` if its digest matches and it loads without pickled code; raises ValueError why not."""
    if not path.exists():
        raise ValueError("missing")
    digest = digest_path(path)
    if not digest.exists():
        raise ValueError(f"no digest file {digest.name} (written by an older version, or the write was cut short)")
    expected = digest.read_text().strip()
    if _sha256(path) != expected:
        raise ValueError(f"its SHA-256 does not match {digest.name}: the file was changed or damaged after writing")
    try:
        return torch.load(path, weights_only=True)
    except Exception as err:  # any failure to read is reported with its cause, never swallowed
        raise ValueError(
            f"does not load: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        ) from err


def has_checkpoint(path: pathlib.Path) -> bool:
    """Whether there is anything to resume from at `path`: the checkpoint, or the one it replaced (`*.prev.pt`, which
    `load_checkpoint` falls back to with a warning when the newer one is missing or damaged)."""
    return pathlib.Path(path).exists() or previous_path(pathlib.Path(path)).exists()


def load_checkpoint(path: pathlib.Path) -> dict:
    """The newest verified checkpoint at `path`, falling back to `*.prev.pt` with a warning."""
    path = pathlib.Path(path)
    problems = []
    for candidate in (path, previous_path(path)):
        try:
            state = _read_verified(candidate)
        except ValueError as why:
            problems.append(f"{candidate}: {why}")
            continue
        if candidate != path:
            warnings.warn(
                f"checkpoint {path} is unusable ({problems[0].split(': ', 1)[1]}); resuming from the "
                f"previous one, {candidate}",
                RuntimeWarning,
                stacklevel=2,
            )
        return state
    raise CheckpointError(
        "no usable checkpoint:\n  "
        + "\n  ".join(problems)
        + "\n(delete the run folder, or pass --no-resume, to start the run afresh)"
    )


def warm_start_path(cache_dir: pathlib.Path, config: RunConfig) -> pathlib.Path:
    """Where `cached_warm_start` keeps the warm start of `config` (one file per warm-start key)."""
    return pathlib.Path(cache_dir) / f"warmstart-{warm_start_key(config)}.pt"


def cached_warm_start(
    config: RunConfig, cache_dir: pathlib.Path, progress: Callable[[int, int, float], None] | None = None
) -> dict[str, torch.Tensor]:
    """Warm-start weights for `config`, computed once per (model, task, warm_start) hash.

    Computed on one torch thread, whatever the calling process uses: the cache is shared by every
    entry point (`copc train`, the sweep flow, the Ray driver), and its floats must be a function of
    the key alone, not of which process got there first (a CPU reduction split over two threads
    rounds differently). A damaged cache entry is recomputed.
    """
    path = warm_start_path(cache_dir, config)
    if path.exists():
        try:
            return _read_verified(path)
        except ValueError as why:
            warnings.warn(
                f"warm-start cache {path} is unusable ({why}); computing it again", RuntimeWarning, stacklevel=2
            )
    caller_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        state = warm_start(config, progress)
    finally:
        torch.set_num_threads(caller_threads)
    save_checkpoint(path, state, keep_previous=False)
    return state
