"""Weights on the wire: a state dict packed into one contiguous byte buffer.

Ray pickles a dict of torch tensors tensor by tensor and copies each on both ends; a single numpy
byte buffer goes through its object store as one out-of-band block (written once, mapped by the
reader). For the embedded model (31 tensors, 0.4 MB) that takes ~2 ms off every learner step's
`put` and every worker's `get` (`python -m bench.weight_transport` measures it side by side).

The buffer a reader gets from Ray is read-only shared memory; `unpack` copies it once, so the
tensors it returns are ordinary writable tensors that share nothing with other readers. Any dtype
travels (bfloat16 included: the bytes are copied, not converted), and tensors on a GPU are copied
to the host as they are packed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

ALIGN = 64  # every tensor starts on a 64-byte boundary, so a dtype view of the buffer is always aligned


@dataclass(frozen=True)
class PackedWeights:
    buffer: np.ndarray  # uint8, every tensor's bytes
    layout: tuple[tuple[str, torch.dtype, tuple[int, ...], int], ...]  # (name, dtype, shape, byte offset)

    @property
    def nbytes(self) -> int:
        return int(self.buffer.nbytes)


def pack(state: dict[str, Tensor]) -> PackedWeights:
    """One buffer holding a copy of every tensor of `state` (detached, on the host)."""
    layout, offset = [], 0
    for name, tensor in state.items():
        if not isinstance(tensor, Tensor):
            raise TypeError(f"state entry {name!r} is a {type(tensor).__name__}, not a tensor")
        layout.append((name, tensor.dtype, tuple(tensor.shape), offset))
        offset += -(-tensor.numel() * tensor.element_size() // ALIGN) * ALIGN
    buffer = np.empty(offset, dtype=np.uint8)
    flat = torch.from_numpy(buffer)
    for (_name, _dtype, _shape, start), tensor in zip(layout, state.values()):
        nbytes = tensor.numel() * tensor.element_size()
        if nbytes:
            flat[start : start + nbytes].copy_(tensor.detach().reshape(-1).view(torch.uint8))
    return PackedWeights(buffer, tuple(layout))


def unpack(packed: PackedWeights) -> dict[str, Tensor]:
    """The state dict back, as writable host tensors (views of one private copy of the buffer)."""
    flat = torch.from_numpy(packed.buffer.copy())
    state = {}
    for name, dtype, shape, start in packed.layout:
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        state[name] = flat[start : start + nbytes].view(dtype).view(shape)
    return state
