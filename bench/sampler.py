"""Benchmark: the embedded KV-cached sampler vs Hugging Face `generate` on an equally sized model.

    python -m bench.sampler [--batch 128 --new-tokens 32 --rounds 5 --threads 1]

Both models have the embedded default's shape (2 layers, width 64, 4 heads, the task vocabulary)
and random weights. Both step the whole batch until `new_tokens` positions (ours stops earlier only if
every sequence has answered, which a random policy practically never does; finished rows keep
being computed on both sides) and both count batch × positions. Ours runs the tool environment
too (a random policy opens and closes calls now and then). HF runs GPT-2
(`GPT2LMHeadModel`, built from a config, nothing downloaded) with `do_sample=True` and its KV cache.
Rounds are interleaved; medians reported; tokens/s counts generated positions.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import GPT2Config, GPT2LMHeadModel

    from copc_core.config import RunConfig, with_overrides
    from copc_core.engines.backends import build_model
    from copc_core.engines.rollout import EpisodeLimits, TorchSampler
    from copc_core.tasks.base import PAD_ID
    from copc_core.tasks.tool_math import VOCAB, ToolMathTask, encode, make_problems

    cfg = with_overrides(RunConfig(), {"task.max_response_tokens": args.new_tokens})
    ours = build_model(cfg, seed=0)
    sampler = TorchSampler(
        ours, ToolMathTask(cfg.task), EpisodeLimits(args.new_tokens, cfg.task.max_tool_calls, 1.0, 0.0)
    )
    problems = make_problems(args.batch, cfg.task.operand_digits, cfg.task.ops, seed=0)
    prompt = torch.tensor([encode(p.prompt) for p in problems])
    shape = ours.shape
    hf = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=len(VOCAB),
            n_positions=shape.block_size,
            n_embd=shape.n_embd,
            n_layer=shape.n_layer,
            n_head=shape.n_head,
        )
    ).eval()
    n_params_ours = sum(p.numel() for n, p in ours.named_parameters() if not n.startswith("value_head"))
    n_params_hf = sum(p.numel() for p in hf.parameters())

    def run_ours() -> int:
        batch = sampler.sample(problems, 0, torch.Generator().manual_seed(0))
        return batch.response_ids.numel()

    def run_hf() -> int:
        with torch.no_grad():
            out = hf.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                do_sample=True,
                max_new_tokens=args.new_tokens,
                pad_token_id=PAD_ID,
                eos_token_id=None,
                use_cache=True,
            )
        return (out.shape[1] - prompt.shape[1]) * out.shape[0]

    variants = {"ours (TorchSampler, KV cache, tool env)": run_ours, "HF generate (GPT-2, KV cache)": run_hf}
    for f in variants.values():
        f()
    rates: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(args.rounds):
        for name, f in variants.items():
            start = time.perf_counter()
            tokens = f()
            rates[name].append(tokens / (time.perf_counter() - start))
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(
        f"batch {args.batch}, {args.new_tokens} new tokens, {args.threads} torch thread(s), {args.rounds} rounds; "
        f"params: ours {n_params_ours:,} (policy), HF {n_params_hf:,}"
    )
    for name, rate in med.items():
        print(f"  {name:<42s} {rate:10,.0f} tokens/s")
    print(
        f"  ours / HF: {med['ours (TorchSampler, KV cache, tool env)'] / med['HF generate (GPT-2, KV cache)']:.2f}x"
        "   (goal >= 3)"
    )


if __name__ == "__main__":
    main()
