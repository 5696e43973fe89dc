"""Trials of a sweep: controlled-lag trials as Ray tasks (one CPU each, up to the machine's size in
parallel), bounded-staleness trials on the Ray runtime from this process (actors of their own, one
trial at a time, while the tasks run)."""

from __future__ import annotations

import pathlib

import ray

from copc_core.config import RunConfig


@ray.remote(num_cpus=1, max_retries=0)
def _train_trial(config_json: str, cache_dir: str) -> dict:
    import torch

    from copc_core.trainer import Trainer
    from infra.checkpoints import cached_warm_start

    config = RunConfig.model_validate_json(config_json)
    torch.set_num_threads(config.train.torch_threads)
    trainer = Trainer(config, cached_warm_start(config, pathlib.Path(cache_dir)))
    summary = trainer.run()
    return {"summary": summary.model_dump(), "history": trainer.history, "evals": trainer.evals,
            "runtime": IN_TASK}


IN_TASK = "inprocess (one Ray task per trial)"
BOUNDED = "ray (bounded staleness)"


def _train_bounded(config: RunConfig, cache_dir: pathlib.Path) -> dict:
    """A bounded-staleness trial: rollout workers and a learner as actors (config.resources)."""
    from infra.checkpoints import cached_warm_start
    from infra.ray_runtime import RayResources, RayTrainer

    trainer = RayTrainer(config, cached_warm_start(config, cache_dir), RayResources.from_config(config))
    try:
        summary = trainer.run_bounded(config.train.eta, config.train.eta_chunk)
    finally:
        trainer.shutdown()
    return {"summary": summary.model_dump(), "history": trainer.history, "evals": trainer.evals, "runtime": BOUNDED}


def run_trials(configs: list[RunConfig], cache_dir: pathlib.Path, on_done=None) -> list[dict | BaseException]:
    """Train every config; a failed trial yields its exception in place of a result.

    Controlled-lag trials go out as Ray tasks at once; bounded-staleness ones (`train.eta`) run here one
    after another, and the tasks' results are reported between them as they arrive.
    """
    tasks = {i: c for i, c in enumerate(configs) if c.train.eta is None}
    bounded = [i for i, c in enumerate(configs) if c.train.eta is not None]
    refs = {_train_trial.remote(c.model_dump_json(), str(cache_dir)): i for i, c in tasks.items()}
    results: list[dict | BaseException | None] = [None] * len(configs)

    def finish(i: int, outcome) -> None:
        results[i] = outcome
        if on_done is not None:
            on_done(i, outcome)

    def collect(block: bool) -> None:
        while refs:
            ready, _ = ray.wait(list(refs), num_returns=1, timeout=None if block else 0)
            if not ready:
                return
            i = refs.pop(ready[0])
            try:
                outcome = ray.get(ready[0])
            except Exception as err:  # recorded as the trial's FAIL reason by the caller, never swallowed
                outcome = err
            finish(i, outcome)

    for i in bounded:
        collect(block=False)
        try:
            outcome = _train_bounded(configs[i], cache_dir)
        except Exception as err:  # as for a task: the trial fails with its reason, the sweep goes on
            outcome = err
        finish(i, outcome)
    collect(block=True)
    return results  # type: ignore[return-value]
