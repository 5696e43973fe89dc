import math

import pytest
import torch
import torch.nn.functional as F

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


def modules_policy_step(m: TinyGPT, idx: torch.Tensor, cache) -> torch.Tensor:
    """The cached step with every layer called as a module (as `policy_step` was written before its step path
    called the modules' functions directly, to save per-call overhead)."""
    B, T = idx.shape
    start, trunk = cache.length, m.trunk
    x = trunk.tok(idx) + trunk.pos(torch.arange(start, start + T))
    for i, block in enumerate(trunk.blocks):
        C = x.shape[2]
        q, k, v = (
            t.view(B, T, block.attn.n_head, C // block.attn.n_head).transpose(1, 2)
            for t in block.attn.qkv(block.ln1(x)).split(C, dim=2)
        )
        k, v = cache.append(i, k, v)
        if T == 1:
            y = torch.softmax((q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1])), dim=-1) @ v
        elif start == 0:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=cache.mask(T))
        x = x + block.attn.proj(y.transpose(1, 2).contiguous().view(B, T, C))
        x = x + block.mlp(block.ln2(x))
    cache.advance(T)
    return m.lm_head(trunk.ln_f(x)[:, -1])


@pytest.mark.parametrize("batch", [1, 3, 32])
def test_the_cached_step_is_bit_for_bit_its_modules(batch):
    """`policy_step` calls F.linear / F.layer_norm / F.gelu on the modules' weights instead of the modules: the same
    kernels on the same tensors, so the same floats — the sampler's tokens and log-probs do not move."""
    m = model().eval()
    idx = torch.randint(0, 20, (batch, 15), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        fast, slow = m.new_cache(batch), m.new_cache(batch)
        for a, b in ((0, 5), (5, 8), *((t, t + 1) for t in range(8, 15))):  # prefill, a chunk, then one at a time
            assert torch.equal(m.policy_step(idx[:, a:b], fast), modules_policy_step(m, idx[:, a:b], slow))


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


@pytest.mark.parametrize("separate_critic", [False, True])
def test_values_alone_are_forwards_values_and_their_gradients(separate_critic):
    """`values(idx)` (the critic warm-up's pass) is `forward`'s V bit for bit, and so are the gradients it sends."""
    m = model(separate_critic)
    idx = torch.randint(0, 20, (4, 12), generator=torch.Generator().manual_seed(4))
    grads = []
    for values in (m(idx)[1], m.values(idx)):
        m.zero_grad(set_to_none=True)
        values.square().mean().backward()
        grads.append({n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None})
        grads[-1]["values"] = values.detach()
    assert grads[0].keys() == grads[1].keys() and "values" in grads[0]
    assert all(torch.equal(grads[0][k], grads[1][k]) for k in grads[0])


def test_sequence_longer_than_block_is_an_error():
    with pytest.raises(ValueError, match="block_size"):
        model()(torch.zeros(1, 25, dtype=torch.long))
