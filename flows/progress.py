"""The progress bars of the CLI and the flows, in one place: tqdm on stderr, made at the first step they see (so a
resumed run's bar starts where the run is), closed at their last."""

from __future__ import annotations

import sys


class Bar:
    """One tqdm bar; `terminal_only`: drawn only when stderr is a terminal (a served flow's stderr is a log, where
    carriage returns are spam)."""

    def __init__(self, desc: str, unit: str = "step", terminal_only: bool = True):
        self.desc, self.unit, self.terminal_only, self.bar = desc, unit, terminal_only, None

    def step(self, done: int, total: int, **postfix: str) -> None:
        from tqdm import tqdm

        if self.bar is None:
            self.bar = tqdm(
                total=total,
                initial=done - 1,
                desc=self.desc,
                unit=self.unit,
                file=sys.stderr,
                disable=self.terminal_only and not sys.stderr.isatty(),
            )
        self.bar.update(1)
        if postfix:
            self.bar.set_postfix(**postfix)
        if done == total:
            self.close()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class TrainBars:
    """`copc train`'s bars: the SFT warm start, the critic warm-up, the RL steps (held-out accuracy, training reward
    and ESS beside)."""

    def __init__(self, steps: int):
        self.steps = steps
        self.warm, self.critic, self.rl = (
            Bar(d, terminal_only=False) for d in ("warm start (SFT)", "critic warm-up", "RL")
        )

    def on_warm_start(self, step: int, total: int, loss: float) -> None:
        self.warm.step(step, total, loss=f"{loss:.3f}")

    def on_critic_warmup(self, step: int, total: int, record: dict[str, float]) -> None:
        self.critic.step(step, total, explained_var=f"{record['critic/explained_var']:.2f}")

    def on_step(self, trainer, metrics: dict[str, float]) -> None:
        self.rl.step(
            trainer.step,
            self.steps,
            acc=f"{trainer.evals[-1]['eval/accuracy']:.2f}",
            reward=f"{metrics['reward/mean']:.2f}",
            ess=f"{metrics['correction/ess']:.2f}",
        )

    def close(self) -> None:
        for bar in (self.warm, self.critic, self.rl):
            bar.close()
