"""Trials of a sweep: controlled-lag trials as Ray tasks (one CPU each, up to the machine's size in
parallel), bounded-staleness trials on the Ray runtime from this process (actors of their own, one
trial at a time, while the tasks run)."""

from __future__ import annotations

import pathlib

import ray

from copc_core.config import RunConfig
from copc_core.results import TrialResult


@ray.remote(num_cpus=1, max_retries=0)
def _train_trial(config_json: str, cache_dir: str) -> dict:
    import torch

    from copc_core.trainer import Trainer
    from infra.checkpoints import cached_warm_start

    config = RunConfig.model_validate_json(config_json)
    torch.set_num_threads(config.train.torch_threads)
    trainer = Trainer(config, cached_warm_start(config, pathlib.Path(cache_dir)))
    summary = trainer.run()
    return {"summary": summary.model_dump(), "history": trainer.history, "evals": trainer.evals, "runtime": IN_TASK}


IN_TASK = "inprocess (one Ray task per trial)"
BOUNDED = "ray (bounded staleness)"


def _train_bounded(config: RunConfig, cache_dir: pathlib.Path) -> dict:
    """A bounded-staleness trial: rollout workers and a learner as actors (config.resources)."""
    from infra.checkpoints import cached_warm_start
    from infra.ray_runtime import RayTrainer

    trainer = RayTrainer(config, cached_warm_start(config, cache_dir))
    try:
        summary = trainer.run_bounded(config.train.eta, config.train.eta_chunk)
    finally:
        trainer.shutdown()
    return {"summary": summary.model_dump(), "history": trainer.history, "evals": trainer.evals, "runtime": BOUNDED}


def run_trials(
    configs: list[RunConfig], cache_dir: pathlib.Path, on_done=None, max_parallel: int | None = None
) -> list[TrialResult | BaseException]:
    """Train every config; a failed trial yields its exception in place of a result.

    Controlled-lag trials go out as Ray tasks, at most `max_parallel` at a time (default: as many as Ray
    has CPUs for); bounded-staleness ones (`train.eta`) run here one after another, and the tasks'
    results are reported between them as they arrive.
    """
    queue = [i for i, c in enumerate(configs) if c.train.eta is None]
    bounded = [i for i, c in enumerate(configs) if c.train.eta is not None]
    limit = max_parallel or len(queue) or 1
    refs: dict = {}
    results: list[TrialResult | BaseException | None] = [None] * len(configs)

    def submit() -> None:
        while queue and len(refs) < limit:
            i = queue.pop(0)
            refs[_train_trial.remote(configs[i].model_dump_json(), str(cache_dir))] = i

    def finish(i: int, outcome) -> None:
        results[i] = outcome
        if on_done is not None:
            on_done(i, outcome)

    def collect(block: bool) -> None:
        submit()
        while refs:
            ready, _ = ray.wait(list(refs), num_returns=1, timeout=None if block else 0)
            if not ready:
                return
            i = refs.pop(ready[0])
            try:
                outcome = TrialResult.from_run(ray.get(ready[0]))
            except Exception as err:  # recorded as the trial's FAIL reason by the caller, never swallowed
                outcome = err
            finish(i, outcome)
            submit()

    for i in bounded:
        collect(block=False)
        try:
            outcome = TrialResult.from_run(_train_bounded(configs[i], cache_dir))
        except Exception as err:  # as for a task: the trial fails with its reason, the sweep goes on
            outcome = err
        finish(i, outcome)
    collect(block=True)
    return results  # type: ignore[return-value]
