"""The `copc` command line: train, methods, hf-tiny, sweep, report, analyze, serve, dashboard, migrate-study, up."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pathlib
import sys
import typing
from typing import NoReturn, Optional

import typer
from pydantic import ValidationError
from rich.markup import escape as rich_escape

from copc_core.config import TASKS
from infra.settings import Runtime
from sweeps.space import Sampler

_TASK_NAMES = " | ".join(TASKS)  # the help lists the registry's tasks (copc_core/config.py TASKS)
app = typer.Typer(add_completion=False, no_args_is_help=True, help="COPC platform: train, sweep, report.")


@app.callback()
def _quiet_mlflow_links() -> None:
    """MLflow's client prints "View run … at: <URL>" as a run ends, a URL that opens in its GenAI view: copc prints
    its own links (the training view); the flow runs `copc serve` starts inherit this."""
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")


def _fail(message: str) -> NoReturn:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code=2)


@contextlib.contextmanager
def _prefect_api():
    """The Prefect API the flows report to: PREFECT_API_URL's, or a temporary local server for this command
    (it dies with the command, however the command ends)."""
    if os.environ.get("PREFECT_API_URL"):
        yield
        return
    from prefect.logging.handlers import APILogHandler
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from infra.local_stack import ServerDownError, temporary_prefect_server
    from infra.settings import data_dir

    try:
        with temporary_prefect_server(data_dir()) as api, temporary_settings(updates={PREFECT_API_URL: api}):
            try:
                yield
            finally:  # the flows' logs reach the server before it stops (else: "Error logging to API")
                APILogHandler().flush()
    except ServerDownError as err:
        _fail(str(err))


def _servers_up(tracking_uri: Optional[str], mlflow: bool = True, storage: Optional[str] = None) -> None:
    """A clear exit 2, before anything starts, when a configured MLflow or Prefect server is down, or a SQLite store
    the command opens (MLflow's; Optuna's `storage`) is damaged."""
    from infra.local_stack import ServerDownError, require_servers
    from infra.settings import data_root
    from infra.tracking import tracking_uri as resolve

    uri = resolve(data_root(), tracking_uri)  # the URI only: no folder is made before there is something to write
    try:
        require_servers(uri if mlflow else None)
    except ServerDownError as err:
        _fail(str(err))
    if mlflow:
        _sound_store(uri, "MLflow store")
    if storage is not None:
        _sound_store(storage, "Optuna storage")


def _sound_store(uri: str, what: str) -> None:
    """Exit 2 naming the file and what to do when a SQLite store is damaged (infra.settings.check_sqlite_store)."""
    from infra.settings import DamagedStoreError, check_sqlite_store

    try:
        check_sqlite_store(uri, what)
    except DamagedStoreError as err:
        _fail(str(err))


def _validation_message(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        where = ".".join(str(x) for x in e["loc"]) or "config"
        lines.append(f"{where}: {e['msg']}")
    return "invalid configuration:\n  " + "\n  ".join(lines)


MAX_FILE_BYTES = 1 << 20  # a config or space file larger than 1 MiB is refused unread


def _read_text(path: pathlib.Path) -> str:
    """A small UTF-8 text file, or exit 2 saying why not (missing, a device, too large, not UTF-8)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as err:
        _fail(f"cannot read {path}: {err}")
    if len(data) > MAX_FILE_BYTES:
        _fail(f"{path} is larger than {MAX_FILE_BYTES // 1024} KiB: not a config file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        _fail(f"{path} is not UTF-8 text: {err}")


def build_run_config(
    config_file: Optional[pathlib.Path], overrides: dict[str, object], task: Optional[str] = None, base=None
):
    """A RunConfig from an optional JSON file (or `base`) plus CLI overrides (dotted paths), validated once.

    `task` switches to that built-in task's default section unless the config already runs it."""
    from copc_core.config import RunConfig, default_task, with_overrides

    base = base or RunConfig()
    if config_file is not None:
        try:
            base = RunConfig.model_validate_json(_read_text(config_file))
        except ValidationError as err:
            _fail(f"{config_file}: " + _validation_message(err))
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        if task is not None and task != base.task.name:
            given = {"task": default_task(task).model_dump(), **given}
        return with_overrides(base, given)
    except ValidationError as err:
        _fail(_validation_message(err))
    except (KeyError, ValueError) as err:
        _fail(str(err))


def _choices(model: str, field: str):
    """A config field's Literal, for a flag: the CLI offers exactly the values the config takes."""
    import copc_core.config as config

    annotation = getattr(config, model).model_fields[field].annotation
    if typing.get_origin(annotation) is not typing.Literal:  # Optional[Literal[...]]
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    return annotation


Device = _choices("ModelConfig", "device")
Lag = _choices("TrainConfig", "lag")
Anchor = _choices("MethodConfig", "anchor")


def _default(path: str) -> str:
    """The value at a dotted path of `copc train`'s default run (the preset embedded-default), for --help (a flag left
    out keeps it)."""
    from copc_core.train.run_presets import run_preset

    node = run_preset("embedded-default").model_dump()
    for key in path.split("."):
        node = node[key]
    return f" (default {node})"


def train_config(preset: Optional[str], config: Optional[pathlib.Path], task: Optional[str], flags: dict[str, object]):
    """`copc train`'s RunConfig: a --config file, or a run preset (default: the default sweep's trial, the search
    regime's for --task search), with the flags over it (a --method keeps the preset's bands it has); exit 2 naming
    what is wrong."""
    from copc_core.train.run_presets import run_preset, with_method

    if config is not None and preset is not None:
        _fail("give --config or --preset, not both")
    if config is None and preset is None:
        preset = "embedded-search" if task == "search" else "embedded-default"
    try:
        base = run_preset(preset) if preset is not None else None
    except ValueError as err:
        _fail(str(err))
    return build_run_config(config, flags, task, base=base and with_method(base, flags.get("method.name")))


def _run_presets() -> str:
    from copc_core.train.run_presets import RUN_PRESETS

    return " | ".join(RUN_PRESETS)


@app.command()
def train(
    method: Optional[str] = typer.Option(None, help="method preset (see `copc methods`)" + _default("method.name")),
    task: Optional[str] = typer.Option(None, help=f"built-in task: {_TASK_NAMES} (default tool_math)"),
    staleness: Optional[int] = typer.Option(
        None,
        help="controlled lag k in versions (learner steps; one version = "
        "minibatches × epochs optimizer updates; 0 = synchronous)" + _default("train.staleness"),
    ),
    lag: Optional[Lag] = typer.Option(
        None, help="exact (every batch k versions old) | uniform (lag drawn from 0..k)" + _default("train.lag")
    ),
    eta: Optional[int] = typer.Option(
        None,
        help="bounded staleness η instead of a controlled lag: free-running "
        "sampling on the Ray runtime (implies --runtime ray)",
    ),
    anchor: Optional[Anchor] = typer.Option(
        None, help="PPO ratio anchor: behavior | recomputed | interpolated (default: the method's; see `copc methods`)"
    ),
    separate_critic: Optional[bool] = typer.Option(
        None,
        "--separate-critic/--shared-critic",
        help="critic trunk of its own, or the value head on the policy's" + _default("model.separate_critic"),
    ),
    critic_warmup_steps: Optional[int] = typer.Option(
        None, help="value-only updates before the first policy update" + _default("train.critic_warmup_steps")
    ),
    tau_policy: Optional[float] = typer.Option(
        None, help="policy mask band τ_p ≥ 1 (inf: no mask)" + _default("method.tau_policy")
    ),
    tau_advantage: Optional[float] = typer.Option(
        None, help="advantage clip band τ_a ≥ 1" + _default("method.tau_advantage")
    ),
    seed: Optional[int] = typer.Option(None, help="training seed" + _default("train.seed")),
    steps: Optional[int] = typer.Option(None, help="learner steps" + _default("train.steps")),
    batch_size: Optional[int] = typer.Option(None, help="episodes per learner step" + _default("train.batch_size")),
    lr: Optional[float] = typer.Option(None, help="learning rate" + _default("train.lr")),
    eval_every: Optional[int] = typer.Option(None, help="evaluate every N steps" + _default("train.eval_every")),
    config: Optional[pathlib.Path] = typer.Option(None, help="a RunConfig JSON file (flags override it)"),
    run_dir: Optional[pathlib.Path] = typer.Option(None, help="where checkpoints and the summary go"),
    resume: bool = typer.Option(True, help="continue from run_dir's checkpoint when present"),
    runtime: Runtime = typer.Option(
        "inprocess", help="inprocess | ray (rollout and learner actors, overlap for k >= 1)"
    ),
    tracking_uri: Optional[str] = typer.Option(
        None,
        help="MLflow tracking URI the run is logged to (default: $MLFLOW_TRACKING_URI or SQLite under the data folder)",
    ),
    ray_address: Optional[str] = typer.Option(None, help="join an existing Ray cluster (implies --runtime ray)"),
    preset: Optional[str] = typer.Option(
        None, help="run preset (base config; default embedded-default, a trial of the default sweep): " + _run_presets()
    ),
    hf_model: Optional[str] = typer.Option(
        None, help="a Hugging Face causal LM (Hub id or local directory) instead of the tiny GPT"
    ),
    device: Optional[Device] = typer.Option(
        None, help="cpu | cuda | auto (where the model runs)" + _default("model.device")
    ),
    rollout_workers: Optional[int] = typer.Option(
        None, help="Ray rollout actors (one GPU each in the scale-out presets)" + _default("resources.rollout_workers")
    ),
) -> None:
    """Train one run: by default a trial of the default sweep (the study's regime at τ_p 4, τ_a 1, k 32, seed 0, tiny
    GPT on tool-math; --task search: the search regime), so flags for a cell's bands, lag and seed rerun that cell's
    trial; or a preset, a --config file, an HF model."""
    cfg = train_config(
        preset,
        config,
        task,
        {
            "method.name": method,
            "train.staleness": staleness,
            "train.lag": lag,
            "train.eta": eta,
            "method.anchor": anchor,
            "model.separate_critic": separate_critic,
            "train.critic_warmup_steps": critic_warmup_steps,
            "method.tau_policy": tau_policy,
            "method.tau_advantage": tau_advantage,
            "train.seed": seed,
            "train.steps": steps,
            "train.batch_size": batch_size,
            "train.lr": lr,
            "train.eval_every": eval_every,
            "model.backend": "hf" if hf_model else None,
            "model.hf_model": hf_model,
            "model.device": device,
            "resources.rollout_workers": rollout_workers,
        },
    )
    runtime = _runtime_for(cfg, runtime)
    _runnable_here(cfg)
    _servers_up(tracking_uri)
    from infra.settings import data_dir

    root = data_dir()
    run_dir = run_dir or root / "runs" / cfg.config_hash()
    _announce_run(cfg, run_dir)
    summary, run_dir, run_id = _train(cfg, root, runtime, run_dir, tracking_uri, ray_address, resume)
    _print_run(summary, root, tracking_uri, run_id, run_dir)


def _runtime_for(cfg, runtime: Runtime) -> Runtime:
    if cfg.train.eta is not None and runtime != "ray":
        typer.echo("bounded staleness (eta) runs on the Ray runtime: --runtime ray", err=True)
        return "ray"
    return runtime


def _runnable_here(cfg) -> None:
    """Exit 2 before anything runs when the run's device or rollout engine is not on this machine."""
    from copc_core.engines.backends import device as model_device
    from copc_core.engines.backends import engine_problem

    try:
        model_device(cfg)  # the warm start and the in-process learner run here
    except RuntimeError as err:
        _fail(f"{err} (this run needs a GPU machine; --device cpu runs it here, slowly)")
    problem = engine_problem(cfg)
    if problem is not None:
        _fail(problem)


def _announce_run(cfg, run_dir: pathlib.Path) -> None:
    t = cfg.train
    schedule = (
        f"η = {t.eta}"
        if t.eta is not None
        else f"k = {t.staleness} ({t.lag}; {t.staleness * t.updates_per_version} optimizer updates)"
    )
    typer.echo(f"run {cfg.config_hash()} · task {cfg.task.name} · method {cfg.method.name} · {schedule} · {run_dir}")


def _train(cfg, root, runtime, run_dir, tracking_uri, ray_address, resume):
    """The run, tracked in MLflow, with its progress bars; a checkpoint it cannot use exits 2."""
    from flows.progress import TrainBars
    from infra.checkpoints import CheckpointError
    from infra.local_run import train_and_track

    bars = TrainBars(cfg.train.steps)
    try:
        return train_and_track(
            cfg,
            root,
            runtime,
            run_dir,
            tracking_uri,
            ray_address,
            resume,
            on_step=bars.on_step,
            on_warm_start=bars.on_warm_start,
            on_critic_warmup=bars.on_critic_warmup,
        )
    except CheckpointError as err:
        _fail(str(err))
    finally:
        bars.close()


def _print_run(summary, root, tracking_uri, run_id: str, run_dir: pathlib.Path) -> None:
    from infra.tracking import mlflow_ui_for, run_link
    from infra.tracking import tracking_uri as resolve

    typer.echo(json.dumps(summary.model_dump(), indent=2))
    typer.echo(
        f"held-out accuracy: warm start {summary.warm_start_accuracy:.3f} -> final {summary.final_accuracy:.3f} "
        f"(peak {summary.peak_accuracy:.3f}){' · COLLAPSED' if summary.collapsed else ''}"
    )
    uri = resolve(root, tracking_uri)
    server = "" if uri.startswith("http") else " (with `copc up` serving this data folder)"
    typer.echo(f"MLflow run {run_id} (kind train) in {uri}: {run_link(uri, mlflow_ui_for(uri), run_id)}{server}")
    typer.echo(f"files in {run_dir}")


@app.command()
def methods() -> None:
    """List the registered methods: what each runs (anchor, correction, loss, estimator) and its source.

    Every preset with a policy side takes `method.anchor` (behavior | recomputed | interpolated) and
    the other options of docs/ALGORITHMS.md §2 (`copc train --anchor`, or a --config file)."""
    from copc_core.rl.methods import METHODS, describe, method_spec

    for name, row in METHODS.items():
        typer.echo(f"{name}\n    {row.description}\n    runs: {describe(method_spec(name))}\n    source: {row.source}")
    typer.echo(
        "\nanchors of the PPO ratio r = π_θ / π_anchor (option method.anchor):\n"
        "    behavior      π_anchor = μ, the rollout's log-probs; the IS weight sits inside r (w = 1)\n"
        "    recomputed    π_anchor = π_old, the learner's recompute; w = ρ = π_old/μ\n"
        "    interpolated  log π_anchor = log μ + α (log π_old − log μ); w = π_anchor/μ; α = "
        "method.anchor_alpha or k/(k+1) (A-3PO)"
    )


@app.command("hf-tiny")
def hf_tiny(
    path: pathlib.Path = typer.Argument(..., help="directory to write the model and tokenizer to"),
    task: str = typer.Option(
        "tool_math", help=f"built-in task whose demonstrations train the tokenizer: {_TASK_NAMES}"
    ),
    hidden: int = typer.Option(64, min=8, max=4096, help="hidden size (a multiple of --heads)"),
    layers: int = typer.Option(2, min=1, max=48, help="transformer layers"),
    heads: int = typer.Option(
        2, min=1, max=64, help="attention heads; vLLM's CPU backend needs hidden / heads in 32, 64, 80, 96, 128, ..."
    ),
) -> None:
    """Write a tiny Hugging Face model (Llama architecture, BPE tokenizer, chat template) built from a config.

    Nothing is downloaded; train it with `copc train --hf-model PATH` to try the HF backend on a CPU."""
    from copc_core.config import default_task
    from copc_core.engines.hf import save_tiny_model
    from copc_core.tasks import make_task

    if hidden % heads:
        _fail(f"--hidden ({hidden}) must be a multiple of --heads ({heads})")
    try:
        task_config = default_task(task)
    except ValueError as err:
        _fail(str(err))
    out = save_tiny_model(path, make_task(task_config), hidden=hidden, layers=layers, heads=heads)
    typer.echo(f"tiny HF model for {task} in {out}; train it with: copc train --hf-model {out} --task {task}")


def _ints(text: Optional[str], option: str) -> Optional[list[int]]:
    """'0,4,16' → [0, 4, 16]; integers only."""
    if text is None:
        return None
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        _fail(f"{option} takes comma-separated integers, got {text!r}")


def _space_with_axes(
    space,
    methods: Optional[str],
    tau_policy: Optional[str],
    tau_advantage: Optional[str],
    staleness: Optional[str],
    seeds: Optional[str],
    steps: Optional[int],
):
    """The space with the axes given as flags replaced (sweeps.space.with_axes); exit 2 naming a bad flag; a method
    named otherwise than the space's entries of it, or one with no point at the lags, said on stderr
    (sweeps.space.methods_notice)."""
    from sweeps.space import methods_notice, with_axes

    try:
        grown = with_axes(
            space,
            methods,
            _floats(tau_policy, "--tau-policy"),
            _floats(tau_advantage, "--tau-advantage"),
            _ints(staleness, "--staleness"),
            _ints(seeds, "--seeds"),
            steps,
        )
    except ValidationError:
        raise
    except ValueError as err:  # named by its field: say the flag
        field, _, rest = str(err).partition(" ")
        flags = {"tau_policy": "--tau-policy", "tau_advantage": "--tau-advantage", "methods:": "--methods:"}
        _fail(f"{flags[field]} {rest}" if field in flags else str(err))
    if notice := methods_notice(space, grown, methods):
        typer.echo(notice, err=True)
    return grown


def _sweep_presets() -> str:
    from sweeps.presets import PRESETS

    return " | ".join(PRESETS)


@app.command()
def sweep(
    name: Optional[str] = typer.Option(
        None, help="study / MLflow parent-run name (rerun to resume; default: the preset's name)"
    ),
    preset: str = typer.Option("embedded-default", help="sweep preset (space + base config): " + _sweep_presets()),
    task: Optional[str] = typer.Option(None, help=f"built-in task of the base config: {_TASK_NAMES}"),
    space_file: Optional[pathlib.Path] = typer.Option(
        None, "--space", help="a SweepSpace JSON file (replaces the preset's space; the flags below override it)"
    ),
    methods: Optional[str] = typer.Option(
        None,
        # escaped: Rich reads "[behavior]" as a style tag and drops it from the help
        help="methods axis, comma-separated, a reading in brackets: "
        + rich_escape("copc,copc[behavior],async_ppo,tis")
        + " (see `copc methods`)",
    ),
    tau_policy: Optional[str] = typer.Option(None, help="τ_p values of every method with a τ_p, e.g. 1.5,2,4,inf"),
    tau_advantage: Optional[str] = typer.Option(None, help="τ_a values of every method with a τ_a, e.g. 1,1.25,2"),
    staleness: Optional[str] = typer.Option(None, help="staleness levels, e.g. 0,4,16 (lags k in versions)"),
    seeds: Optional[str] = typer.Option(None, help="seeds, e.g. 0,1,2"),
    steps: Optional[int] = typer.Option(None, help="learner steps per trial"),
    max_parallel: Optional[int] = typer.Option(None, min=1, max=4096, help="trials at once (default: one per CPU)"),
    config: Optional[pathlib.Path] = typer.Option(None, help="base RunConfig JSON (the grid overrides it)"),
    storage: Optional[str] = typer.Option(None, help="Optuna storage URL (default: SQLite under the data folder)"),
    tracking_uri: Optional[str] = typer.Option(
        None, help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI or SQLite under the data folder)"
    ),
    sampler: Sampler = typer.Option(
        "grid", help="grid | tpe (every point is run either way; tpe only orders new ones)"
    ),
    warm_start_per_seed: Optional[bool] = typer.Option(
        None,
        "--warm-start-per-seed/--one-warm-start",
        help="each seed its own SFT warm start (cached per seed), so seeds vary the starting model too (default: the "
        "preset's, one for every seed); a study keeps the choice it started with",
    ),
    plan: Optional[pathlib.Path] = typer.Option(
        None,
        help="the plan, written before the data (Markdown): kept on the study and in MLflow, a changed one as a new "
        "version; analyses it names in backticks (`coupling`, `late`, ...) are marked planned in the report",
    ),
    ray_address: Optional[str] = typer.Option(
        None, help="run the trials on an existing Ray cluster (default: $RAY_ADDRESS, else a local Ray of its own)"
    ),
) -> None:
    """Joint sweep over methods × (τ_p, τ_a) × staleness × seed: Optuna study, Ray trials, MLflow runs, report.

    Files go under the data folder: $COPC_DATA_DIR, default ./data."""
    if ray_address:  # as Ray's own `ray.init()` reads it (infra.ray_runtime.init_ray)
        os.environ["RAY_ADDRESS"] = ray_address
    name, space, base = _sweep_plan(
        name, preset, task, space_file, config, methods, tau_policy, tau_advantage, staleness, seeds, steps
    )
    plan_text = _plan_text(plan) if plan is not None else None
    from infra.settings import data_root

    _servers_up(tracking_uri, storage=storage or f"sqlite:///{data_root() / 'optuna.db'}")
    from flows.prefect_flows import LOCAL_CALLER, SweepParams, copc_sweep
    from sweeps.study import StudyFormatError

    params = SweepParams.model_validate(
        {
            "name": name,
            "space": space,
            "base": base,
            "storage": storage,
            "tracking_uri": tracking_uri,
            "sampler": sampler,
            "max_parallel": max_parallel,
            "warm_start_per_seed": warm_start_per_seed,
            "plan": plan_text,
        },
        context=LOCAL_CALLER,
    )
    try:
        with _prefect_api():
            result = copc_sweep(params)
    except StudyFormatError as err:
        _fail(str(err))
    _print_sweep(name, result)


def _plan_text(path: pathlib.Path) -> str:
    """A plan file's text, or exit 2 saying why it cannot be one."""
    from sweeps.plan import check_plan

    try:
        return check_plan(_read_text(path))
    except ValueError as err:
        _fail(f"--plan {path}: {err}")


def _sweep_plan(name, preset, task, space_file, config, methods, tau_policy, tau_advantage, staleness, seeds, steps):
    """(name, space, base) from the preset, a --space file, the axis flags and a --config base; exit 2 naming what
    is wrong, before anything is written (every method's first point must build a valid config on the base)."""
    from pydantic import TypeAdapter

    from sweeps.presets import sweep_preset
    from sweeps.space import SweepName, SweepPoint, SweepSpace
    from sweeps.study import heartbeat_settings

    try:
        preset_space, preset_base = sweep_preset(preset)
        heartbeat_settings()
    except ValueError as err:
        _fail(str(err))
    name = name or preset
    try:
        TypeAdapter(SweepName).validate_python(name)
        space = SweepSpace.model_validate_json(_read_text(space_file)) if space_file else preset_space
        space = _space_with_axes(space, methods, tau_policy, tau_advantage, staleness, seeds, steps)
    except ValidationError as err:
        _fail(("--name: " if err.title != "SweepSpace" else "") + _validation_message(err))
    except ValueError as err:  # an unknown method named in --methods
        _fail(str(err))
    base = build_run_config(config, {}, task, base=preset_base)
    try:
        for m in space.methods:  # each entry's first point (an entry with no point at these lags: none to build)
            if lags := m.lags(space.staleness):
                space.run_config(base, SweepPoint(m.key, *m.bands()[0], lags[0], space.seeds[0]))
    except ValidationError as err:
        _fail(_validation_message(err))
    return name, space, base


def _print_sweep(name: str, result) -> None:
    """The sweep's end on the console (its per-cell table went to the flow's log, on this console too)."""
    for line in result.best_per_level:
        typer.echo(f"best {line}")
    typer.echo(
        f"Optuna study {name!r} in {result.storage}; MLflow parent run {result.parent_run_id} "
        f"in {result.tracking_uri}" + (f"; {result.failed} trial(s) FAILED" if result.failed else "")
    )
    server = "" if result.tracking_uri.startswith("http") else " (with `copc up` serving this data folder)"
    typer.echo(f"MLflow: {result.mlflow_url}{server}")
    typer.echo(f"HTML report: {result.report}")


@app.command()
def report(
    sweep: list[str] = typer.Option(["embedded-default"], "--sweep", help="sweep name (repeat for several)"),
    out: Optional[pathlib.Path] = typer.Option(None, help="HTML file (default: <data>/reports/<sweep>.html)"),
    tracking_uri: Optional[str] = typer.Option(
        None, help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI or SQLite under the data folder)"
    ),
    mlflow_ui: Optional[str] = typer.Option(
        None,
        help="MLflow UI base URL for run links (default: the tracking "
        "server, or http://127.0.0.1:5000 as `copc up` serves)",
    ),
    baseline: str = typer.Option("async_ppo", help="method the learner-time ratio is taken against"),
) -> None:
    """Build the HTML report of one or more sweeps from MLflow (runs through the copc-report flow)."""
    _servers_up(tracking_uri)
    from flows.prefect_flows import LOCAL_CALLER, ReportParams

    try:
        params = ReportParams.model_validate(
            {
                "sweeps": sweep,
                "out": str(out) if out else None,
                "tracking_uri": tracking_uri,
                "mlflow_ui": mlflow_ui,
                "baseline": baseline,
            },
            context=LOCAL_CALLER,
        )
    except ValidationError as err:
        _fail(_validation_message(err))
    from infra.settings import data_root
    from infra.tracking import read_sweeps
    from infra.tracking import tracking_uri as default_uri

    try:  # fail before Prefect starts, and before any folder is made, when there is nothing to report
        read_sweeps(default_uri(data_root(), tracking_uri), params.sweeps, [])
    except LookupError as err:
        _fail(str(err))
    from flows.prefect_flows import copc_report

    with _prefect_api():
        path = copc_report(params)["path"]
    typer.echo(f"HTML report: {path}")


def _floats(text: Optional[str], option: str) -> Optional[list[float]]:
    """'1.5,2,inf' → [1.5, 2.0, inf]; parsed as numbers only."""
    if text is None:
        return None
    try:
        return [float(part) for part in text.split(",")]  # an empty part ("1,,2") is a typo: refused
    except ValueError:
        _fail(f"{option} takes comma-separated numbers, got {text!r}")


@app.command()
def analyze(
    method: Optional[str] = typer.Option(None, help="a method with both bands (default copc)"),
    anchor: Optional[Anchor] = typer.Option(None, help="PPO ratio anchor, a reading of COPC (default: the method's)"),
    tau_policy: Optional[str] = typer.Option(None, help="comma-separated τ_p values, e.g. 1.25,1.5,2,inf"),
    tau_advantage: Optional[str] = typer.Option(None, help="comma-separated τ_a values"),
    staleness: Optional[str] = typer.Option(None, help="comma-separated perturbation sizes ε ≥ 0 of μ"),
    critic_error: Optional[float] = typer.Option(None, help="critic error σ"),
    batch_size: Optional[int] = typer.Option(None, help="trajectories per update (MSE = bias² + var / B)"),
    vocab: Optional[int] = typer.Option(None, help="tokens per step"),
    horizon: Optional[int] = typer.Option(None, help="steps per trajectory (vocab^horizon ≤ 5000)"),
    seed: Optional[int] = typer.Option(None, help="seed of the MDP"),
    out: Optional[pathlib.Path] = typer.Option(None, help="HTML file (default: <data>/reports/analysis-<hash>.html)"),
) -> None:
    """Exact bias/variance decomposition over (τ_p, τ_a) × staleness on an enumerable token MDP
    (runs through the copc-analysis flow; no training, no Ray)."""
    from copc_core.analysis.token_mdp import AnalysisSpec

    given = {
        "method": method,
        "anchor": anchor,
        "tau_policy": _floats(tau_policy, "--tau-policy"),
        "tau_advantage": _floats(tau_advantage, "--tau-advantage"),
        "staleness": _floats(staleness, "--staleness"),
        "critic_error": critic_error,
        "batch_size": batch_size,
        "vocab": vocab,
        "horizon": horizon,
        "seed": seed,
    }
    try:
        spec = AnalysisSpec(**{k: v for k, v in given.items() if v is not None})
    except ValidationError as err:
        _fail(_validation_message(err))
    _servers_up(None, mlflow=False)
    from flows.prefect_flows import LOCAL_CALLER, AnalysisParams, copc_analysis

    params = AnalysisParams.model_validate({"spec": spec, "out": str(out) if out else None}, context=LOCAL_CALLER)
    with _prefect_api():
        result = copc_analysis(params)
    typer.echo(f"HTML report: {result['path']}\nrecords: {result['records']}")


def _stoppable(on_stop=None) -> None:
    """SIGINT and SIGTERM both raise KeyboardInterrupt, so `copc serve &` or `copc dashboard &` (whose
    shell ignores SIGINT for background jobs) still stops cleanly on either; `on_stop()` runs first."""
    import signal

    def interrupt(signum, frame):
        if on_stop is not None:
            on_stop()
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)


def _exit_if_prefect_is_gone() -> None:
    """Prefect's graceful shutdown of `serve` talks to the API, and retries for over a minute before a
    ConnectError traceback when the server has gone (measured: 74 s). With nothing to tell it, exit now."""
    from infra.local_stack import ServerDownError, wait_healthy

    try:
        wait_healthy(os.environ["PREFECT_API_URL"].rstrip("/") + "/health", 2.0, "Prefect API")
    except ServerDownError:
        typer.echo("copc serve: the Prefect server is gone; stopped without telling it", err=True)
        sys.stderr.flush()
        os._exit(0)


@app.command()
def serve() -> None:
    """Register the copc-train / copc-sweep / copc-report / copc-analysis deployments and serve them (needs a Prefect
    server: `copc up`, then PREFECT_API_URL=http://127.0.0.1:4200/api). Ctrl-C or SIGTERM stops it."""
    if not os.environ.get("PREFECT_API_URL"):
        _fail("copc serve needs a Prefect server: run `copc up`, then set PREFECT_API_URL to the API URL it prints")
    _servers_up(None, mlflow=False)
    import asyncio

    from prefect.runner import Runner

    from flows.prefect_flows import deployments

    class _Runner(Runner):
        def handle_sigterm(self, *args, **kwargs) -> None:  # Prefect's graceful stop needs the API
            _exit_if_prefect_is_gone()
            super().handle_sigterm(*args, **kwargs)

    runner = _Runner(pause_on_shutdown=True)
    served = deployments()
    for deployment in served:
        runner.add_deployment(deployment)
    ui = os.environ["PREFECT_API_URL"].rstrip("/").removesuffix("/api")
    typer.echo(
        f"copc serve: serving {', '.join(f'{d.flow_name}/{d.name}' for d in served)}; run them from the "
        f"Prefect UI ({ui}/deployments) or `prefect deployment run NAME`. Ctrl-C or SIGTERM stops it."
    )
    _stoppable(on_stop=_exit_if_prefect_is_gone)
    try:
        asyncio.run(runner.start())
    except KeyboardInterrupt:
        typer.echo("copc serve: stopped", err=True)


@app.command()
def dashboard(
    storage: Optional[str] = typer.Option(
        None, help="Optuna storage URL (default: SQLite under the data folder, where `copc sweep` keeps its studies)"
    ),
    host: str = typer.Option("127.0.0.1", help="interface to bind (loopback by default; the dashboard has no auth)"),
    port: int = typer.Option(8080, min=1, max=65535, help="port"),
    allowed_hosts: Optional[str] = typer.Option(
        None, help="comma-separated host names the browser may use besides loopback and --host (DNS-rebinding check)"
    ),
) -> None:
    """Serve the sweeps' Optuna studies with optuna-dashboard: every trial's point, objective, final and peak
    accuracy, collapse and MLflow run id. Requests for another Host, and changes from another origin, are refused
    (optuna-dashboard has no such check). Ctrl-C or SIGTERM stops it."""
    from infra.local_stack import serve_wsgi
    from infra.settings import data_dir

    if storage is None:
        db = data_dir() / "optuna.db"
        if not db.is_file():
            _fail(f"no Optuna storage at {db}: run a sweep first (or give --storage)")
        storage = f"sqlite:///{db}"
    _sound_store(storage, "Optuna storage")
    if host not in ("127.0.0.1", "localhost", "::1"):
        typer.secho(
            f"warning: the dashboard on {host} lets anyone who reaches it read and edit the studies "
            "(optuna-dashboard has no authentication)",
            fg=typer.colors.YELLOW,
            err=True,
        )
    import optuna
    from optuna_dashboard import wsgi

    try:
        rdb = optuna.storages.RDBStorage(storage)
    except Exception as err:  # a URL SQLAlchemy cannot open: say so, no traceback
        _fail(f"cannot open Optuna storage {storage!r}: {err}")
    _warn_older_studies(storage)
    typer.echo(f"optuna-dashboard of {storage} on http://{host}:{port}/ (Ctrl-C stops it)")
    _stoppable()
    try:
        serve_wsgi(wsgi(rdb), host, port, tuple(h.strip() for h in (allowed_hosts or "").split(",") if h.strip()))
    except KeyboardInterrupt:
        typer.echo("copc dashboard: stopped", err=True)
    except OSError as err:
        _fail(f"cannot serve on {host}:{port}: {err}")


def _warn_older_studies(storage: str) -> None:
    """Name the studies an older copc wrote (their pages stay blank in the browser) and how to migrate them."""
    import optuna

    from sweeps.study import older_format

    for summary in optuna.get_all_study_summaries(storage, include_best_trial=False):
        problem = older_format(optuna.load_study(study_name=summary.study_name, storage=storage))
        if problem:
            typer.secho(f"warning: study {summary.study_name!r} {problem}", fg=typer.colors.YELLOW, err=True)


@app.command("migrate-study")
def migrate_study(
    name: str = typer.Argument(..., help="the study (sweep) name"),
    storage: Optional[str] = typer.Option(None, help="Optuna storage URL (default: SQLite under the data folder)"),
) -> None:
    """Rewrite a study an older copc wrote (bands as parameters up to ∞, which optuna-dashboard cannot show) in
    this version's format, in place, keeping every trial; a study already in this format is left as it is."""
    from infra.settings import data_dir
    from sweeps.study import StudyFormatError
    from sweeps.study import migrate_study as migrate

    if storage is None:
        db = data_dir() / "optuna.db"
        if not db.is_file():
            _fail(f"no Optuna storage at {db}: nothing to migrate (or give --storage)")
        storage = f"sqlite:///{db}"
    _sound_store(storage, "Optuna storage")
    try:
        count = migrate(name, storage)
    except StudyFormatError as err:
        _fail(str(err))
    typer.echo(f"study {name!r} in {storage}: {count} trial(s), in this version's format")


@app.command()
def up(
    prefect_port: int = typer.Option(4200, min=1, max=65535, help="Prefect server port"),
    mlflow_port: int = typer.Option(5000, min=1, max=65535, help="MLflow server port"),
    host: str = typer.Option("127.0.0.1", help="bind address (loopback unless you say otherwise)"),
    prefect_auth: Optional[str] = typer.Option(
        None,
        envvar="COPC_PREFECT_AUTH",
        help="'user:password' the Prefect API requires (clients: export PREFECT_API_AUTH_STRING=user:password)",
    ),
    mlflow_allowed_hosts: Optional[str] = typer.Option(
        None, help="MLflow --allowed-hosts (its default admits localhost and private-network hosts)"
    ),
    mlflow_cors_origins: Optional[str] = typer.Option(None, help="MLflow --cors-allowed-origins"),
    prefect_allowed_hosts: Optional[str] = typer.Option(
        None, help="comma-separated host names the Prefect server answers besides loopback and --host (DNS rebinding)"
    ),
    mlflow_basic_auth: bool = typer.Option(
        False,
        help="MLflow's basic-auth app: users in <data>/mlflow-auth.db; the first start needs "
        "MLFLOW_AUTH_ADMIN_PASSWORD (the admin user's); clients export MLFLOW_TRACKING_USERNAME and "
        "MLFLOW_TRACKING_PASSWORD",
    ),
) -> None:
    """Start a local Prefect server and MLflow server, print their URLs, stop both on Ctrl-C (or SIGTERM).

    Prefect runs with CSRF protection and CORS limited to its UI's origin; both servers stop when this
    command does, however it ends."""

    from infra.local_stack import LOOPBACK, LocalStack
    from infra.settings import data_dir, data_root

    if prefect_auth is not None and ":" not in prefect_auth:
        _fail("--prefect-auth must be 'user:password'")
    first_auth_start = not LocalStack(data_root()).auth_store().exists()
    if mlflow_basic_auth and first_auth_start and not os.environ.get("MLFLOW_AUTH_ADMIN_PASSWORD"):
        _fail(
            "--mlflow-basic-auth: set MLFLOW_AUTH_ADMIN_PASSWORD; MLflow creates its admin user with it on first start "
            "(clients then export MLFLOW_TRACKING_USERNAME=admin MLFLOW_TRACKING_PASSWORD=…)"
        )
    if host not in LOOPBACK:
        typer.secho(
            f"warning: binding {host}: the servers are reachable from other machines. "
            + ("" if prefect_auth else "The Prefect API has no authentication (--prefect-auth). ")
            + ("" if mlflow_basic_auth else "MLflow has no authentication (--mlflow-basic-auth). ")
            + (
                ""
                if mlflow_allowed_hosts
                else "MLflow accepts requests for any private-network host name (--mlflow-allowed-hosts). "
            )
            + (
                ""
                if prefect_allowed_hosts
                else "Prefect answers only requests naming loopback or this address: add the names you browse it by "
                "with --prefect-allowed-hosts. "
            )
            + "Anyone who reaches them can start runs that write files under the data folder.",
            fg=typer.colors.YELLOW,
            err=True,
        )

    _stoppable()  # `copc up &` too
    with LocalStack(
        data_dir(),
        host,
        prefect_port,
        mlflow_port,
        prefect_auth,
        mlflow_allowed_hosts,
        mlflow_cors_origins,
        mlflow_basic_auth,
        prefect_allowed_hosts,
    ) as stack:
        typer.echo(f"Prefect UI and API: {stack.prefect_url}   (export PREFECT_API_URL={stack.prefect_url}/api)")
        typer.echo(f"MLflow UI:          {stack.mlflow_url}   (export MLFLOW_TRACKING_URI={stack.mlflow_url})")
        typer.echo("Ctrl-C stops both.")
        stack.wait()


WRITE_REFUSED = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO}


def _refused_write(err: BaseException) -> str | None:
    """What a failed write says, when the file system refused it (full, read-only, a size limit), anywhere in the
    exception's causes; None for anything else."""
    while err is not None:
        if isinstance(err, OSError) and err.errno in WRITE_REFUSED:
            return f"{err.filename or 'a file'}: {err.strerror}" if err.filename else str(err)
        text = str(err)
        if any(s in text for s in ("database or disk is full", "attempt to write a readonly database")):
            return text.splitlines()[0][:300]
        err = err.__cause__ or err.__context__
    return None


def main() -> None:
    """The `copc` command: the app, with a refused write (a full disk, a read-only data folder) said in one line
    and exit 2 instead of a traceback. Files are written whole or not at all (checkpoints: temp file and rename),
    so the same command run again after space is freed resumes."""
    try:
        app()
    except Exception as err:
        why = _refused_write(err)
        if why is None:
            raise
        typer.secho(
            f"error: a write was refused: {why}. Free space (or make the data folder writable) and run the same "
            "command again: a run resumes from its last checkpoint.",
            fg=typer.colors.RED,
            err=True,
        )
        sys.exit(2)


if __name__ == "__main__":
    main()
