"""Benchmark: what one run of the study's regime costs, where the CPU goes, and the ratio to another commit.

    python -m bench.run_cost [--against d16db70] [--steps 300] [--staleness 32] [--repeats 3]

One run is the `regime-tool-math` preset's base config (COPC at τ_p 4, τ_a 1.25, lag k versions, 100 critic
warm-up steps, 256 held-out problems every 5 steps) on one torch thread, in a process of its own. Its CPU time
(`time.process_time`, so other work on the machine counts as little as it can) is split into: sampling of training
batches (critic warm-up included), evaluation, learner updates (critic warm-up updates included), and the rest
(snapshots, weight loads, problems).

With `--against REV` the same run also runs with REV's code (a detached git worktree, each process importing its
own code: the module paths moved at 24b6db4, and both layouts are read), alternated with this checkout's
(A B B A …) `--repeats` times. Printed: the median of each part per code, the ratio this / REV of each, and
whether the two codes trained identically (the held-out accuracies and the per-step actor losses bit for bit).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
PARTS = ("sampling", "evaluation", "updates", "rest", "total")

# Run in a child process whose sys.path starts at the code under test (either module layout).
CHILD = r"""
import json, sys, time
import torch

torch.set_num_threads(1)
try:
    from copc_core.train.trainer import Trainer
    from copc_core.train.run_presets import REGIME_BASE
except ImportError:  # before the wings moved (24b6db4)
    from copc_core.trainer import Trainer
    from sweeps.presets import REGIME_BASE
from copc_core.config import with_overrides
from infra.checkpoints import cached_warm_start
from infra.settings import data_dir

steps, staleness = int(sys.argv[1]), int(sys.argv[2])
config = with_overrides(
    REGIME_BASE,
    {"train.steps": steps, "train.staleness": staleness, "method.tau_policy": 4.0, "method.tau_advantage": 1.25},
)
warm = cached_warm_start(config, data_dir() / "cache")
trainer = Trainer(config, warm)
cpu = {"sampling": 0.0, "evaluation": 0.0, "updates": 0.0}
inside = []

def timed(part, function):
    def call(*args, **kwargs):
        if inside:  # sampling within an evaluation is the evaluation's
            return function(*args, **kwargs)
        inside.append(part)
        start = time.process_time()
        try:
            return function(*args, **kwargs)
        finally:
            cpu[part] += time.process_time() - start
            inside.pop()
    return call

trainer.evaluate = timed("evaluation", trainer.evaluate)
trainer.sampler.sample = timed("sampling", trainer.sampler.sample)
trainer.learner.step = timed("updates", trainer.learner.step)
trainer.learner.warm_up_critic = timed("updates", trainer.learner.warm_up_critic)
start = time.process_time()
trainer.run()
cpu["total"] = time.process_time() - start
cpu["rest"] = cpu["total"] - cpu["sampling"] - cpu["evaluation"] - cpu["updates"]
print(json.dumps({
    "cpu": cpu,
    "accuracy": [e["eval/accuracy"] for e in trainer.evals],
    "loss": [h["actor/loss"] for h in trainer.history],
}))
"""


def run_once(code: pathlib.Path, data: pathlib.Path, steps: int, staleness: int) -> dict:
    """One run with the code at `code`, in a fresh process (its warm start cached under `data`)."""
    env = os.environ | {"PYTHONPATH": str(code), "COPC_DATA_DIR": str(data), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(steps), str(staleness)],
        cwd=code,
        env=env,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise RuntimeError(f"the run with the code at {code} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def worktree(rev: str, where: pathlib.Path) -> pathlib.Path:
    path = where / f"code-{rev}"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), rev], check=True)
    return path


def print_table(medians: dict[str, dict[str, float]], reference: str | None) -> None:
    print("| code | " + " | ".join(f"{p} (CPU-s)" for p in PARTS) + " |")
    print("|---|" + "---|" * len(PARTS))
    for name, m in medians.items():
        cells = [f"{m[p]:.1f} ({m[p] / m['total']:.0%})" for p in PARTS[:-1]] + [f"{m['total']:.1f}"]
        print(f"| {name} | " + " | ".join(cells) + " |")
    if reference is not None:
        this, ref = medians["this checkout"], medians[reference]
        print(f"| this / {reference} | " + " | ".join(f"{this[p] / ref[p]:.2f}" for p in PARTS) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", metavar="REV", help="a commit to run side by side (e.g. d16db70)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--staleness", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="run-cost-") as tmp:
        tmp_path = pathlib.Path(tmp)
        codes = {"this checkout": ROOT}
        if args.against:
            codes[args.against] = worktree(args.against, tmp_path)
        try:
            data = {name: tmp_path / f"data-{i}" for i, name in enumerate(codes)}  # each code's warm-start cache
            for name, code in codes.items():  # the warm starts computed first, not timed
                run_once(code, data[name], 1, args.staleness)
            runs: dict[str, list[dict]] = {name: [] for name in codes}
            order = list(codes)
            for r in range(args.repeats):
                for name in order if r % 2 == 0 else order[::-1]:
                    runs[name].append(run_once(codes[name], data[name], args.steps, args.staleness))
                    print(f"  repeat {r + 1}, {name}: {runs[name][-1]['cpu']['total']:.1f} CPU-s", file=sys.stderr)
        finally:
            if args.against:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(codes[args.against])])
    medians = {name: {p: statistics.median(r["cpu"][p] for r in rs) for p in PARTS} for name, rs in runs.items()}
    print(
        f"one regime run: {args.steps} learner steps, k = {args.staleness}, one torch thread, CPU seconds, "
        f"median of {args.repeats} alternated"
    )
    print_table(medians, args.against)
    if args.against:
        a, b = runs["this checkout"][0], runs[args.against][0]
        same = a["accuracy"] == b["accuracy"] and a["loss"] == b["loss"]
        print(f"held-out accuracies and actor losses bit for bit the same in both codes: {same}")


if __name__ == "__main__":
    main()
