"""A tiny GPT actor–critic, written to be read (after nanoGPT's model.py).

One transformer trunk; a language-model head gives the policy, a scalar head gives V(s_t). With
`separate_critic` the value comes from a second trunk of the same size instead (no shared
features). A KV cache makes sampling cost O(T) per token instead of O(T²).

Candid shortcuts: no dropout, learned absolute positions, no weight tying, no flash attention
(sequences are ~50 tokens; plain softmax attention is the fastest thing on a CPU at that size).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass(frozen=True)
class GPTShape:
    vocab_size: int
    block_size: int  # longest prompt + response
    n_layer: int
    n_head: int
    n_embd: int
    separate_critic: bool = False


class CausalSelfAttention(nn.Module):
    def __init__(self, shape: GPTShape):
        super().__init__()
        assert shape.n_embd % shape.n_head == 0
        self.n_head = shape.n_head
        self.qkv = nn.Linear(shape.n_embd, 3 * shape.n_embd)
        self.proj = nn.Linear(shape.n_embd, shape.n_embd)

    def forward(self, x: Tensor) -> Tensor:
        """Causal self-attention over whole sequences [B, T, C] (the learner's pass)."""
        q, k, v = self._heads(self.qkv(x))
        return self._merge(F.scaled_dot_product_attention(q, k, v, is_causal=True), self.proj)

    def step(self, x: Tensor, cache: KVCache, layer: int) -> Tensor:
        """The same, for new positions x [B, T, C] after the cached ones (sampling). Called as a method, not a
        module, and with F.linear: a decode step at batch 32 is mostly per-call overhead (docs/BENCHMARKS.md)."""
        q, k, v = self._heads(F.linear(x, self.qkv.weight, self.qkv.bias))
        start = cache.length
        k, v = cache.append(layer, k, v)  # [B, H, pos + T, hd]
        if q.shape[2] == 1:
            # one new query sees every cached key: plain attention, no mask; on CPU this is
            # several times faster than the SDPA kernel for a single query
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))  # [B, H, 1, pos + 1]
            y = torch.softmax(att, dim=-1) @ v
        elif start == 0:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # prefill
        else:  # new queries see every cached position and the causal part of themselves
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=cache.mask(q.shape[2]))
        return self._merge(y, lambda h: F.linear(h, self.proj.weight, self.proj.bias))

    def _heads(self, qkv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """[B, T, 3C] → q, k, v, each [B, H, T, hd]."""
        B, T, C3 = qkv.shape
        C = C3 // 3
        return tuple(x.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for x in qkv.split(C, dim=2))

    @staticmethod
    def _merge(y: Tensor, proj) -> Tensor:
        """[B, H, T, hd] → the output projection of [B, T, C]."""
        B, H, T, hd = y.shape
        return proj(y.transpose(1, 2).contiguous().view(B, T, H * hd))


class Block(nn.Module):
    def __init__(self, shape: GPTShape):
        super().__init__()
        self.ln1 = nn.LayerNorm(shape.n_embd)
        self.attn = CausalSelfAttention(shape)
        self.ln2 = nn.LayerNorm(shape.n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(shape.n_embd, 4 * shape.n_embd), nn.GELU(), nn.Linear(4 * shape.n_embd, shape.n_embd)
        )

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))

    def step(self, x: Tensor, cache: KVCache, layer: int) -> Tensor:
        """`forward` after the cached positions, its modules' own functions called directly (bit for bit the same)."""
        x = x + self.attn.step(_layer_norm(self.ln1, x), cache, layer)
        fc, _, out = self.mlp
        h = F.gelu(F.linear(_layer_norm(self.ln2, x), fc.weight, fc.bias))
        return x + F.linear(h, out.weight, out.bias)


def _layer_norm(ln: nn.LayerNorm, x: Tensor) -> Tensor:
    return F.layer_norm(x, ln.normalized_shape, ln.weight, ln.bias, ln.eps)


class Trunk(nn.Module):
    """Token + position embeddings, n_layer blocks, a final LayerNorm: features [B, T, C]."""

    def __init__(self, shape: GPTShape):
        super().__init__()
        self.tok = nn.Embedding(shape.vocab_size, shape.n_embd)
        self.pos = nn.Embedding(shape.block_size, shape.n_embd)
        self.blocks = nn.ModuleList(Block(shape) for _ in range(shape.n_layer))
        self.ln_f = nn.LayerNorm(shape.n_embd)

    def forward(self, idx: Tensor) -> Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))  # [B, T, C]
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x)

    def step(self, idx: Tensor, cache: KVCache) -> Tensor:
        """Features [B, T, C] of new tokens idx [B, T] after the cached prefix (which they join)."""
        T = idx.shape[1]
        pos = torch.arange(cache.length, cache.length + T, device=idx.device)
        x = F.embedding(idx, self.tok.weight) + F.embedding(pos, self.pos.weight)
        for i, block in enumerate(self.blocks):
            x = block.step(x, cache, i)
        cache.advance(T)
        return _layer_norm(self.ln_f, x)


class TinyGPT(nn.Module):
    """Policy logits and values from token ids.

    forward(idx [B, T]) → (logits [B, T, V], values [B, T]) where position t's outputs describe
    the state after reading idx[:, :t+1]: logits for the next token, V of that state.
    """

    def __init__(self, shape: GPTShape):
        super().__init__()
        self.shape = shape
        self.trunk = Trunk(shape)
        self.lm_head = nn.Linear(shape.n_embd, shape.vocab_size, bias=False)
        self.value_head = nn.Linear(shape.n_embd, 1)
        self._initialise(self)
        # the critic trunk draws its initial weights after everything else: the policy's do not depend
        # on whether the critic has a trunk of its own
        self.critic_trunk = self._initialise(Trunk(shape)) if shape.separate_critic else None

    def _initialise(self, module: nn.Module) -> nn.Module:
        module.apply(self._init_weights)
        for name, p in module.named_parameters():  # GPT-2 scaled init of residual projections
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * self.shape.n_layer))
        return module

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    @property
    def max_length(self) -> int:
        return self.shape.block_size

    @property
    def policy_trunk(self) -> nn.Module:
        """The transformer whose features the LM head reads (what a critic trunk copies)."""
        return self.trunk

    def forward(self, idx: Tensor) -> tuple[Tensor, Tensor]:
        if idx.shape[1] > self.shape.block_size:
            raise ValueError(f"sequence of {idx.shape[1]} tokens exceeds block_size {self.shape.block_size}")
        h = self.trunk(idx)  # [B, T, C]
        critic_h = h if self.critic_trunk is None else self.critic_trunk(idx)
        return self.lm_head(h), self.value_head(critic_h).squeeze(-1)

    def values(self, idx: Tensor) -> Tensor:
        """V(s_t) [B, T] alone, as `forward` computes it (the critic warm-up needs no policy pass)."""
        critic = self.trunk if self.critic_trunk is None else self.critic_trunk
        return self.value_head(critic(idx)).squeeze(-1)

    def policy_step(self, idx: Tensor, cache: KVCache) -> Tensor:
        """Next-token logits [B, V] after appending idx [B, T] to the cached prefix (policy only)."""
        h = self.trunk.step(idx, cache)
        return F.linear(h[:, -1], self.lm_head.weight)

    def new_cache(self, batch: int) -> KVCache:
        s = self.shape
        p = next(self.parameters())
        return KVCache(s.n_layer, batch, s.n_head, s.block_size, s.n_embd // s.n_head, p.dtype, p.device)


class KVCache:
    """Preallocated keys/values of every layer: [n_layer, B, H, block_size, hd] each."""

    def __init__(self, n_layer: int, batch: int, n_head: int, block: int, head_dim: int, dtype, device):
        self.k = torch.zeros(n_layer, batch, n_head, block, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.length = 0
        self.block = block

    def append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        T = k.shape[2]
        if self.length + T > self.block:
            raise ValueError(f"KV cache full: {self.length} + {T} > {self.block}")
        self.k[layer, :, :, self.length : self.length + T] = k
        self.v[layer, :, :, self.length : self.length + T] = v
        end = self.length + T
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def mask(self, T: int) -> Tensor:
        """Boolean [T, length + T]: query i sees keys ≤ length + i."""
        keys = torch.arange(self.length + T, device=self.k.device)
        queries = torch.arange(self.length, self.length + T, device=self.k.device)
        return keys[None, :] <= queries[:, None]

    def advance(self, T: int) -> None:
        self.length += T


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
