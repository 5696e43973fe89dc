"""Trials of a sweep: controlled-lag trials as Ray tasks (one CPU each, up to the machine's size in
parallel), bounded-staleness trials on the Ray runtime from this process (actors of their own, one
trial at a time, while the tasks run)."""

from __future__ import annotations

import pathlib
from collections.abc import Callable

import ray

from copc_core.config import RunConfig
from copc_core.results import TrialResult


@ray.remote(num_cpus=1, max_retries=0)
def _train_trial(config_json: str, cache_dir: str, stream: dict | None = None) -> dict:
    """One controlled-lag trial in this task's process; `stream` ({uri, run_id}): its MLflow run, which gets the
    step records while it trains."""
    import torch

    from copc_core.train.trainer import Trainer
    from infra.checkpoints import cached_warm_start

    config = RunConfig.model_validate_json(config_json)
    torch.set_num_threads(config.train.torch_threads)
    trainer = Trainer(config, cached_warm_start(config, pathlib.Path(cache_dir)))
    return _finished(trainer, trainer.run, stream, IN_TASK)


def _finished(trainer, run, stream: dict | None, runtime: str) -> dict:
    """Run `run(on_step)` with the step records streamed to `stream`'s MLflow run; the run's plain result."""
    from infra.tracking import MetricStream

    live = MetricStream(**stream) if stream else None
    summary = run(on_step=(lambda t, metrics: live.send(t.history, t.evals)) if live else None)
    sent = live.close(trainer.history, trainer.evals) if live else (0, 0)
    return {
        "summary": summary.model_dump(),
        "history": trainer.history,
        "evals": trainer.evals,
        "runtime": runtime,
        "streamed": sent,
    }


IN_TASK = "inprocess (one Ray task per trial)"
BOUNDED = "ray (bounded staleness)"


def _train_bounded(config: RunConfig, cache_dir: pathlib.Path, stream: dict | None = None) -> dict:
    """A bounded-staleness trial: rollout workers and a learner as actors (config.resources)."""
    from infra.checkpoints import cached_warm_start
    from infra.ray_runtime import RayTrainer

    trainer = RayTrainer(config, cached_warm_start(config, cache_dir))
    try:
        t = config.train
        return _finished(trainer, lambda on_step: trainer.run_bounded(t.eta, t.eta_chunk, on_step), stream, BOUNDED)
    finally:
        trainer.shutdown()


def run_trials(  # noqa: C901 — one scheduling loop over Ray's ready set: starting, ending and failing trials
    configs: list[RunConfig],
    cache_dir: pathlib.Path,
    on_done=None,
    max_parallel: int | None = None,
    on_start: Callable[[int], dict | None] | None = None,
) -> list[TrialResult | BaseException]:
    """Train every config; a failed trial yields its exception in place of a result.

    Controlled-lag trials go out as Ray tasks, at most `max_parallel` at a time (default: as many as Ray
    has CPUs for); bounded-staleness ones (`train.eta`) run here one after another, and the tasks'
    results are reported between them as they arrive. `on_start(i)`, called as trial i starts, may return
    where its step records stream to ({uri, run_id} of its MLflow run).
    """
    start = on_start or (lambda i: None)
    queue = [i for i, c in enumerate(configs) if c.train.eta is None]
    bounded = [i for i, c in enumerate(configs) if c.train.eta is not None]
    # no more in flight than Ray can run at once: a trial's MLflow run and flow-run node start when it is submitted,
    # and a task queued inside Ray would read as running while it waits
    limit = max_parallel or max(1, int(ray.cluster_resources().get("CPU", 1)))
    refs: dict = {}
    results: list[TrialResult | BaseException | None] = [None] * len(configs)

    def submit() -> None:
        while queue and len(refs) < limit:
            i = queue.pop(0)
            refs[_train_trial.remote(configs[i].model_dump_json(), str(cache_dir), start(i))] = i

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
            outcome = TrialResult.from_run(_train_bounded(configs[i], cache_dir, start(i)))
        except Exception as err:  # as for a task: the trial fails with its reason, the sweep goes on
            outcome = err
        finish(i, outcome)
    collect(block=True)
    return results  # type: ignore[return-value]
