"""Benchmark: COPC advantages + returns vs a verl-style loop GAE and vs a plain copy of the inputs.

    python -m bench.advantages [--batch 256 --length 2048 --rounds 15 --threads 0]

All variants run interleaved, round by round, on the same inputs; the table reports medians and the
ratios the foundation issue sets as goals: loop / COPC ≥ 10, COPC / copy ≤ 5, COPC / GAE ≤ 1.2.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from copc_core.rl.advantages import copc_advantages, gae_advantages
from copc_core.rl.corrections import behavior_log_ratio
from tests.references import verl_gae as verl_loop_gae  # the one copy of verl's loop, the tests' reference


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    B, T = args.batch, args.length
    rewards = torch.zeros(B, T)
    rewards[:, -1] = (torch.rand(B, generator=g) > 0.5).float()
    values = torch.randn(B, T, generator=g)
    mask = (torch.rand(B, T, generator=g) > 0.15).float()  # ~15 % environment (tool) tokens
    logp_behavior = -torch.rand(B, T, generator=g) * 2
    logp_old = logp_behavior + 0.3 * torch.randn(B, T, generator=g)
    inputs = (rewards, values, mask, logp_old, logp_behavior)

    def copc():
        log_ratio = behavior_log_ratio(logp_old, logp_behavior, mask)
        return copc_advantages(rewards, values, mask, log_ratio, 1.0, 0.95, tau_advantage=2.0)

    variants = {
        "copy of the 5 inputs": lambda: [x.clone() for x in inputs],
        "verl-style loop GAE": lambda: verl_loop_gae(rewards, values, mask, 1.0, 0.95),
        "our GAE": lambda: gae_advantages(rewards, values, mask, 1.0, 0.95),
        "COPC (log ratio + advantages + returns)": copc,
    }
    loop_out = verl_loop_gae(rewards, values, mask, 1.0, 0.95)
    ours = gae_advantages(rewards, values, mask, 1.0, 0.95)
    err = (loop_out[0] * mask - ours.advantages).abs().max().item()
    times: dict[str, list[float]] = {k: [] for k in variants}
    for f in variants.values():
        f()  # warm-up
    for _ in range(args.rounds):
        for name, f in variants.items():
            start = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - start)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    print(
        f"B x T = {B} x {T}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{args.rounds} interleaved rounds (median ms); max |loop GAE - our GAE| = {err:.2e}"
    )
    for name, ms in med.items():
        print(f"  {name:<42s} {ms:9.3f} ms")
    copc_ms = med["COPC (log ratio + advantages + returns)"]
    rows = [
        ("loop GAE / COPC", med["verl-style loop GAE"] / copc_ms, ">= 10"),
        ("COPC / copy", copc_ms / med["copy of the 5 inputs"], "<= 5"),
        ("COPC / our GAE", copc_ms / med["our GAE"], "<= 1.2"),
    ]
    for label, ratio, goal in rows:
        print(f"  {label:<42s} {ratio:9.2f}x   (goal {goal})")


if __name__ == "__main__":
    main()
