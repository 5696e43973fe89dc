"""Weights packed into one byte buffer for Ray come back bit for bit, writable, and private."""

import pytest
import ray
import torch

from copc_core.engines.backends import build_model
from infra.packed_weights import ALIGN, pack, unpack
from tests.conftest import tiny_config


def _mixed_state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "w": torch.randn(3, 5, generator=g),
        "transposed": torch.randn(4, 6, generator=g).t(),  # not contiguous
        "scalar": torch.tensor(2.5, dtype=torch.float64),
        "half": torch.randn(7, generator=g).to(torch.bfloat16),
        "ids": torch.arange(5, dtype=torch.long),
        "flags": torch.tensor([True, False, True]),
        "empty": torch.empty(0, 4),
    }


def test_round_trip_is_exact_for_every_dtype_and_layout():
    state = _mixed_state()
    back = unpack(pack(state))
    assert list(back) == list(state)
    for name, tensor in state.items():
        assert back[name].dtype == tensor.dtype and back[name].shape == tensor.shape, name
        assert torch.equal(back[name], tensor), name


def test_tensors_start_aligned_and_the_buffer_is_a_copy():
    state = _mixed_state()
    packed = pack(state)
    assert all(offset % ALIGN == 0 for *_, offset in packed.layout)
    state["w"].add_(1.0)  # the packed copy does not follow the source
    assert not torch.equal(unpack(packed)["w"], state["w"])


def test_unpacked_tensors_are_writable_and_do_not_touch_the_buffer():
    packed = pack({"w": torch.ones(4)})
    packed.buffer.setflags(write=False)  # what a reader gets from Ray's object store
    w = unpack(packed)["w"]
    w.mul_(3.0)
    assert torch.equal(unpack(packed)["w"], torch.ones(4))


def test_a_non_tensor_entry_is_refused_by_name():
    with pytest.raises(TypeError, match="'step'"):
        pack({"w": torch.ones(2), "step": 3})


@pytest.mark.slow
def test_a_model_loads_the_weights_after_a_trip_through_ray(local_ray):
    model = build_model(tiny_config(), 0)
    received = ray.get(ray.put(pack(model.state_dict())))
    assert not received.buffer.flags.writeable  # Ray hands out shared memory, so unpack must copy
    other = build_model(tiny_config(), 1)
    other.load_state_dict(unpack(received))
    for (name, a), b in zip(model.state_dict().items(), other.state_dict().values()):
        assert torch.equal(a, b), name
    assert received.nbytes >= sum(t.numel() * t.element_size() for t in model.state_dict().values())
