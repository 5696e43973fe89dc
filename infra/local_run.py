"""Run one training job in this process, with warm-start cache and periodic checkpoints."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable

from copc_core.config import RunConfig
from copc_core.train.stability import RunSummary
from copc_core.train.trainer import Trainer
from infra.checkpoints import cached_warm_start, has_checkpoint, load_checkpoint, save_checkpoint
from infra.settings import configure_torch_threads

CHECKPOINT = "checkpoint.pt"
SUMMARY = "summary.json"


def train_in_process(
    config: RunConfig,
    run_dir: pathlib.Path,
    cache_dir: pathlib.Path,
    resume: bool = True,
    checkpoint_every: int = 10,
    on_step: Callable[[Trainer, dict[str, float]], None] | None = None,
    on_warm_start: Callable[[int, int, float], None] | None = None,
    on_critic_warmup: Callable[[int, int, dict[str, float]], None] | None = None,
) -> RunSummary:
    """Train `config` to completion; resumes from `run_dir/checkpoint.pt` when present and allowed.

    Writes `config.json`, a checkpoint after critic warm-up, every `checkpoint_every` steps and at
    the end, and `summary.json` (history.json holds the step, eval and warm-up records).
    """
    configure_torch_threads(config.train.torch_threads)
    run_dir = _start_run_dir(config, run_dir)
    warm = cached_warm_start(config, cache_dir, on_warm_start)
    trainer = Trainer(config, warm)
    checkpoint = run_dir / CHECKPOINT
    if resume and has_checkpoint(checkpoint):
        trainer.load_state_dict(load_checkpoint(checkpoint))
    if trainer.warm_up_critic(on_critic_warmup):
        save_checkpoint(checkpoint, trainer.state_dict())  # a resumed run does not warm the critic again

    summary = trainer.run(_checkpointing(checkpoint, checkpoint_every, on_step))
    save_checkpoint(checkpoint, trainer.state_dict())
    _finish_run_dir(run_dir, summary, trainer.history, trainer.evals, trainer.warmup)
    return summary


def _checkpointing(checkpoint: pathlib.Path, every: int, on_step: Callable | None) -> Callable:
    """A step hook that writes the trainer's state every `every` steps, then calls `on_step`."""

    def step_hook(trainer, metrics: dict[str, float]) -> None:
        if trainer.step % every == 0:
            save_checkpoint(checkpoint, trainer.state_dict())
        if on_step is not None:
            on_step(trainer, metrics)

    return step_hook


def _start_run_dir(config: RunConfig, run_dir: pathlib.Path) -> pathlib.Path:
    run_dir = pathlib.Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(config.model_dump_json(indent=2))
    return run_dir


def _finish_run_dir(run_dir: pathlib.Path, summary: RunSummary, history: list, evals: list, warmup: list) -> None:
    (run_dir / SUMMARY).write_text(summary.model_dump_json(indent=2))
    (run_dir / "history.json").write_text(json.dumps({"steps": history, "evals": evals, "critic_warmup": warmup}))


def train_on_ray(
    config: RunConfig,
    run_dir: pathlib.Path,
    cache_dir: pathlib.Path,
    address: str | None = None,
    resume: bool = True,
    checkpoint_every: int = 10,
    on_step: Callable | None = None,
    on_warm_start: Callable[[int, int, float], None] | None = None,
) -> RunSummary:
    """Train `config` with the Ray runtime (local Ray, or the cluster at `address`); same files as in-process.

    Controlled lag: checkpoints are written at the runtime's barrier steps (every `checkpoint_every`),
    where no learner step is queued ahead. Bounded staleness (`train.eta`): free-running sampling;
    a resumed run samples the chunks that were in flight again.
    """
    from infra.ray_runtime import RayTrainer, init_ray

    run_dir = _start_run_dir(config, run_dir)
    warm = cached_warm_start(config, cache_dir, on_warm_start)
    init_ray(address)
    trainer = RayTrainer(config, warm)
    checkpoint = run_dir / CHECKPOINT
    hook = _checkpointing(checkpoint, checkpoint_every, on_step)
    t = config.train
    try:
        if resume and has_checkpoint(checkpoint):
            trainer.load_state_dict(load_checkpoint(checkpoint))
        if trainer.warm_up_critic():
            save_checkpoint(checkpoint, trainer.state_dict())
        if t.eta is None:
            summary = trainer.run(hook, barrier_every=checkpoint_every)
        else:  # a learner step there is taken synchronously: every step is a consistent checkpoint point
            summary = trainer.run_bounded(t.eta, t.eta_chunk, hook)
        save_checkpoint(checkpoint, trainer.state_dict())
    finally:
        trainer.shutdown()
    _finish_run_dir(run_dir, summary, trainer.history, trainer.evals, trainer.warmup)
    return summary


def train_and_track(
    config: RunConfig,
    data: pathlib.Path,
    runtime: str = "inprocess",
    run_dir: pathlib.Path | None = None,
    tracking: str | None = None,
    address: str | None = None,
    resume: bool = True,
    tags: dict[str, str] | None = None,
    on_step: Callable | None = None,
    on_warm_start: Callable[[int, int, float], None] | None = None,
    on_critic_warmup: Callable[[int, int, dict[str, float]], None] | None = None,
) -> tuple[RunSummary, pathlib.Path, str]:
    """One training run as `copc train` and the `copc-train` flow start it: the run folder (default
    `<data>/runs/<config hash>`), the runner (in process, or the Ray runtime when `runtime` is ray or an
    `address` is given), then one MLflow run (kind `train`) with the config, every step's metrics and
    the summary, tagged with the machine and `tags`. Returns (summary, run folder, MLflow run id)."""
    from copc_core.results import TrialResult
    from infra.local_stack import require_servers
    from infra.tracking import Tracker, machine_tags, tracking_uri

    uri = tracking_uri(data, tracking)
    require_servers(uri, prefect=False)  # a configured MLflow server that is down: said before training
    run_dir = pathlib.Path(run_dir) if run_dir else data / "runs" / config.config_hash()
    ray = runtime == "ray" or address is not None
    if ray:
        summary = train_on_ray(
            config, run_dir, data / "cache", address, resume=resume, on_step=on_step, on_warm_start=on_warm_start
        )
    else:
        summary = train_in_process(
            config,
            run_dir,
            data / "cache",
            resume=resume,
            on_step=on_step,
            on_warm_start=on_warm_start,
            on_critic_warmup=on_critic_warmup,
        )
    tracker = Tracker(uri, artifact_dir=data / "mlartifacts")
    logged = tracker.logged_train_run(config.config_hash(), str(run_dir))
    if logged:  # a rerun of a finished run: its MLflow run exists already
        return summary, run_dir, logged
    records = json.loads((run_dir / "history.json").read_text())
    t = config.train
    lag = f"eta={t.eta}" if t.eta is not None else f"k={t.staleness}"
    result = TrialResult(summary, records["steps"], records["evals"], "ray" if ray else "inprocess")
    run_id = tracker.log_trial(
        None,
        None,
        f"train {config.method.name} {lag} s={t.seed}",
        config,
        result,
        tags={**machine_tags(), "run_dir": str(run_dir), **(tags or {})},
    )
    return summary, run_dir, run_id
