"""Benchmark: SDPA against plain softmax attention at the learner's shape, forward and backward, one torch thread.

    python -m bench.attention [--batch 16 --heads 4 --positions 40 --head-dim 16 --calls 300 --rounds 5]

The learner's causal self-attention (`CausalSelfAttention.forward`) calls `F.scaled_dot_product_attention`; plain
attention (q kᵀ / √d, a causal mask, softmax, @ v) is what the sampler's one-query step uses and was listed as a lever
for the learner (issue 43). Both take the same random q, k, v with gradients; rounds alternate; printed: the median
microseconds of a forward + backward call of each, their ratio, and the largest forward difference (float32
rounding: they are not bit for bit alike, so taking plain attention would need the study's metrics shown equal).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--positions", type=int, default=40)
    parser.add_argument("--head-dim", type=int, default=16)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    causal = torch.ones(args.positions, args.positions, dtype=torch.bool).tril()

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def plain(q, k, v):
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
        return torch.softmax(att.masked_fill(~causal, float("-inf")), dim=-1) @ v

    shape = (args.batch, args.heads, args.positions, args.head_dim)
    q, k, v = (torch.randn(shape, generator=torch.Generator().manual_seed(i), requires_grad=True) for i in range(3))

    def time_calls(attention) -> float:
        start = time.perf_counter()
        for _ in range(args.calls):
            attention(q, k, v).sum().backward()
        return (time.perf_counter() - start) / args.calls * 1e6

    for attention in (sdpa, plain):  # warm-up
        time_calls(attention)
    times = {"sdpa": [], "plain": []}
    for _ in range(args.rounds):
        times["sdpa"].append(time_calls(sdpa))
        times["plain"].append(time_calls(plain))
    with torch.no_grad():
        diff = (sdpa(q, k, v) - plain(q, k, v)).abs().max().item()
    median = {name: statistics.median(t) for name, t in times.items()}
    print(f"batch {args.batch} × {args.heads} heads × {args.positions} positions × {args.head_dim}, 1 torch thread")
    for name, t in times.items():
        print(f"  {name:6s} forward + backward {median[name]:8.0f} µs (rounds: {', '.join(f'{x:.0f}' for x in t)})")
    print(f"  plain / sdpa: {median['plain'] / median['sdpa']:.2f}x   largest forward difference {diff:.1e}")


if __name__ == "__main__":
    main()
