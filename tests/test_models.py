import pytest
import torch

from copc_core.engines.models import GPTShape, TinyGPT, count_parameters


def model(separate_critic=False):
    torch.manual_seed(0)
    return TinyGPT(
        GPTShape(vocab_size=20, block_size=24, n_layer=2, n_head=4, n_embd=32, separate_critic=separate_critic)
    )


def test_kv_cache_steps_match_the_full_forward():
    m = model().eval()
    idx = torch.randint(0, 20, (3, 15), generator=torch.Generator().manual_seed(1))
    full_logits, _ = m(idx)
    cache = m.new_cache(3)
    step_logits = [m.policy_step(idx[:, :5], cache)]  # prefill 5 tokens, then one at a time
    for t in range(5, 15):
        step_logits.append(m.policy_step(idx[:, t : t + 1], cache))
    torch.testing.assert_close(torch.stack(step_logits, 1), full_logits[:, 4:], rtol=1e-5, atol=1e-5)


def test_outputs_are_causal():
    m = model().eval()
    idx = torch.randint(0, 20, (2, 10), generator=torch.Generator().manual_seed(2))
    changed = idx.clone()
    changed[:, 7:] = (changed[:, 7:] + 1) % 20
    a, va = m(idx)
    b, vb = m(changed)
    torch.testing.assert_close(a[:, :7], b[:, :7], rtol=0, atol=1e-6)
    torch.testing.assert_close(va[:, :7], vb[:, :7], rtol=0, atol=1e-6)


def test_separate_critic_has_its_own_trunk():
    shared, separate = model(False), model(True)
    assert count_parameters(separate) > count_parameters(shared)
    _, values = separate(torch.zeros(2, 5, dtype=torch.long))
    values.sum().backward()
    assert all(p.grad is None for n, p in separate.named_parameters() if n.startswith("trunk."))


def test_sequence_longer_than_block_is_an_error():
    with pytest.raises(ValueError, match="block_size"):
        model()(torch.zeros(1, 25, dtype=torch.long))
