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


# ---- integrity and safety of checkpoints (docs/RELIABILITY.md, "Checkpoints") ----

import hashlib  # noqa: E402
import os  # noqa: E402
import pickle  # noqa: E402

from infra.checkpoints import CheckpointError, digest_path, load_checkpoint, previous_path, save_checkpoint  # noqa: E402


def _state(tag: float) -> dict:
    return {"step": int(tag), "weights": {"w": torch.full((64, 64), tag)}, "history": [{"loss": tag}]}


def _flip(path, offset_fraction=0.5, size=4096):
    data = bytearray(path.read_bytes())
    start = int(len(data) * offset_fraction)
    for i in range(start, min(start + size, len(data))):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def test_save_writes_a_digest_and_keeps_the_previous_checkpoint(tmp_path):
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, _state(1.0))
    assert digest_path(path).read_text().strip() == hashlib.sha256(path.read_bytes()).hexdigest()
    assert not previous_path(path).exists()
    save_checkpoint(path, _state(2.0))
    assert load_checkpoint(path)["step"] == 2
    assert torch.load(previous_path(path), weights_only=True)["step"] == 1
    assert (
        digest_path(previous_path(path)).read_text().strip()
        == hashlib.sha256(previous_path(path).read_bytes()).hexdigest()
    )


@pytest.mark.parametrize("damage", ["flip 4 KB", "truncate", "empty", "no digest"])
def test_a_damaged_checkpoint_falls_back_to_the_previous_one_with_a_warning(tmp_path, damage):
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, _state(1.0))
    save_checkpoint(path, _state(2.0))
    if damage == "flip 4 KB":
        _flip(path)
    elif damage == "truncate":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif damage == "empty":
        path.write_bytes(b"")
    else:
        digest_path(path).unlink()
    with pytest.warns(RuntimeWarning, match="unusable.*previous one"):
        state = load_checkpoint(path)
    assert state["step"] == 1 and torch.equal(state["weights"]["w"], torch.full((64, 64), 1.0))


def test_no_usable_checkpoint_is_a_clear_error_naming_both_files(tmp_path):
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, _state(1.0))
    save_checkpoint(path, _state(2.0))
    _flip(path)
    path_prev = previous_path(path)
    path_prev.write_bytes(b"")
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path)
    message = str(err.value)
    assert str(path) in message and str(path_prev) in message and "SHA-256 does not match" in message


class _Payload:
    def __reduce__(self):
        return (os.system, (f"touch {_Payload.marker}",))


def test_a_planted_pickle_with_code_is_never_run_even_with_a_matching_digest(tmp_path):
    """An attacker who can write the run folder can also write the digest: the load itself must refuse code."""
    marker = tmp_path / "pwned"
    _Payload.marker = marker
    path = tmp_path / "checkpoint.pt"
    torch.save({"step": 1, "evil": _Payload()}, path)
    digest_path(path).write_text(hashlib.sha256(path.read_bytes()).hexdigest())
    with pytest.raises(CheckpointError, match="does not load"):
        load_checkpoint(path)
    raw = tmp_path / "raw.pt"  # a plain pickle, no torch container
    raw.write_bytes(pickle.dumps({"x": _Payload()}))
    digest_path(raw).write_text(hashlib.sha256(raw.read_bytes()).hexdigest())
    with pytest.raises(CheckpointError):
        load_checkpoint(raw)
    assert not marker.exists()


def test_a_damaged_warm_start_cache_is_recomputed(tmp_path):
    cfg = tiny_config()
    first = cached_warm_start(cfg, tmp_path)
    (entry,) = tmp_path.glob("warmstart-*.pt")
    _flip(entry, 0.6, 2048)
    with pytest.warns(RuntimeWarning, match="computing it again"):
        again = cached_warm_start(cfg, tmp_path)
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert cached_warm_start(cfg, tmp_path).keys() == first.keys()  # and the repaired entry loads quietly
