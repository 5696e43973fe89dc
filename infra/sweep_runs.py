"""Trials of a sweep as Ray tasks (one CPU each), up to the machine's size in parallel."""

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
    return {"summary": summary.model_dump(), "history": trainer.history, "evals": trainer.evals}


def run_trials(configs: list[RunConfig], cache_dir: pathlib.Path, on_done=None) -> list[dict | BaseException]:
    """Train every config as a Ray task; a failed task yields its exception in place of a result."""
    refs = [_train_trial.remote(c.model_dump_json(), str(cache_dir)) for c in configs]
    index = {ref: i for i, ref in enumerate(refs)}
    results: list[dict | BaseException | None] = [None] * len(refs)
    remaining = list(refs)
    while remaining:
        ready, remaining = ray.wait(remaining, num_returns=1)
        i = index[ready[0]]
        try:
            results[i] = ray.get(ready[0])
        except Exception as err:  # recorded as the trial's FAIL reason by the caller, never swallowed
            results[i] = err
        if on_done is not None:
            on_done(i, results[i])
    return results
