"""Prefect flows `copc-train`, `copc-sweep`, `copc-report`, `copc-analysis`: one typed parameter each, thin wiring.

Deployments (`copc serve`) bind these flows so that each can be triggered from the Prefect UI with a
parameter form generated from the pydantic models below.
"""

from __future__ import annotations

import pathlib
import threading
from typing import Annotated, Literal, Optional, Union

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NONE
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from copc_core.analysis.token_mdp import AnalysisSpec
from copc_core.config import RunConfig
from copc_core.train.run_presets import RUN_PRESETS
from infra.settings import Runtime
from sweeps.plan import check_plan
from sweeps.presets import PRESETS
from sweeps.space import Band, Sampler, SweepName, SweepSpace

RunPresetName = Literal[tuple(RUN_PRESETS)]  # the presets' names, choices in the form
SweepPresetName = Literal[tuple(PRESETS)]
LOCAL_CALLER = {"local_caller": True}  # validation context of the CLI: its user chooses paths freely


def _confined(field: str, kind: str):
    """A validator confining a path or store parameter to the data folder: parameters arrive from the
    Prefect API, and whoever can post to it must not choose where files are written. The `copc` CLI
    validates with `LOCAL_CALLER`, and its user's paths pass as given."""
    from pydantic import ValidationInfo

    def check(value: Optional[str], info: ValidationInfo) -> Optional[str]:
        from infra.settings import confined_store_uri, inside_data_folder

        if value is None or (info.context or {}).get("local_caller"):
            return value
        return str(inside_data_folder(value, field)) if kind == "path" else confined_store_uri(value, field)

    return field_validator(field)(check)


OverrideValue = Union[bool, int, float, str, None]


def _no_null_bands(overrides: dict[str, OverrideValue]) -> dict[str, OverrideValue]:
    """A band set to null is refused: JSON has no ∞ or NaN, and an `Infinity`, `-Infinity` or `NaN` in a request body
    (or a float('inf') a Python client sends) reaches the flow as null, which would run the method's default band
    without a word. ∞ goes as the string "inf"; the default, by leaving the key out."""
    for key in ("method.tau_policy", "method.tau_advantage"):
        if key in overrides and overrides[key] is None:
            raise ValueError(
                f'overrides: {key} is null (a JSON Infinity or NaN arrives as null): give a number ≥ 1, "inf" for no '
                "band, or leave the key out for the method's default"
            )
    return overrides


class TrainParams(BaseModel):
    """One run: a preset and a few dotted overrides (a short form), or a whole RunConfig."""

    model_config = ConfigDict(extra="forbid")

    preset: RunPresetName = Field("embedded-default", description="the run's base config (`copc train --help`)")
    overrides: dict[str, OverrideValue] = Field(
        default_factory=dict,
        description='dotted RunConfig fields over the preset, e.g. {"method.name": "tis", "train.staleness": 4}',
    )
    config: Optional[RunConfig] = Field(None, description="a whole RunConfig in place of the preset (advanced)")
    runtime: Runtime = "inprocess"
    data_dir: Optional[str] = Field(None, description="a folder inside the data folder (default: the data folder)")

    _data_dir = _confined("data_dir", "path")
    _bands = field_validator("overrides")(classmethod(lambda cls, v: _no_null_bands(v)))

    @model_validator(mode="after")
    def _overrides_apply(self) -> TrainParams:
        try:
            self.run_config()
        except KeyError as err:
            raise ValueError(f"overrides: {err.args[0]}") from None
        return self

    def run_config(self) -> RunConfig:
        """The run's config: `config` or the preset, with the overrides applied (re-validated)."""
        from copc_core.config import with_overrides
        from copc_core.train.run_presets import run_preset, with_method

        base = self.config if self.config is not None else run_preset(self.preset)
        return with_overrides(with_method(base, self.overrides.get("method.name")), self.overrides)


class SweepParams(BaseModel):
    """A sweep: pick a preset, change any of its axes (empty or None keeps the preset's), run. The presets, their
    axes and steps: `copc sweep --help` and sweeps/presets.py; the last fields replace a whole space or config."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")

    preset: SweepPresetName = Field("embedded-default", description="the sweep's space and base run config")
    name: Optional[SweepName] = Field(
        None, description="study and MLflow parent-run name (default: the preset's); run it again to resume or grow"
    )
    methods: str = Field(
        "",
        pattern=r"^([a-z0-9_]+(\[[a-z]+\])?(,[a-z0-9_]+(\[[a-z]+\])?)*)?$",
        description="methods axis, comma-separated, a reading in brackets: copc,copc[behavior],tis (empty: the "
        "preset's; `copc methods` lists them)",
    )
    tau_policy: list[Band] = Field(
        default_factory=list, description="τ_p values of every method with a τ_p (empty: the preset's)"
    )
    tau_advantage: list[Band] = Field(
        default_factory=list, description="τ_a values of every method with a τ_a (empty: the preset's)"
    )
    staleness: list[Annotated[int, Field(ge=0, le=1024)]] = Field(
        default_factory=list, description="lags k in versions, e.g. [0, 8, 32] (empty: the preset's)"
    )
    seeds: list[Annotated[int, Field(ge=0, le=2**31 - 1)]] = Field(
        default_factory=list, description="e.g. [0, 1, 2] (empty: the preset's)"
    )
    steps: Optional[int] = Field(
        None, ge=1, le=1_000_000, description="learner steps per trial (None: the preset's; embedded-default 200)"
    )
    max_parallel: Optional[int] = Field(None, ge=1, le=4096, description="trials at once (default: one per CPU)")
    warm_start_per_seed: Optional[bool] = Field(
        None, description="each seed its own SFT warm start, cached per seed (None: the preset's; a study keeps one)"
    )
    sampler: Sampler = "grid"
    overrides: dict[str, OverrideValue] = Field(
        default_factory=dict, description='dotted RunConfig fields over the base, e.g. {"train.lr": 5e-5}'
    )
    space: Optional[SweepSpace] = Field(None, description="a whole search space in place of the preset's (advanced)")
    base: Optional[RunConfig] = Field(None, description="a whole base RunConfig in place of the preset's (advanced)")
    storage: Optional[str] = Field(None, description="Optuna storage URL (default: SQLite in the data folder)")
    tracking_uri: Optional[str] = Field(
        None, description="MLflow tracking URI (default: $MLFLOW_TRACKING_URI of `copc serve`, else the data folder)"
    )
    data_dir: Optional[str] = Field(None, description="a folder inside the data folder (default: the data folder)")
    plan: Optional[str] = Field(
        None,
        max_length=64 * 1024,
        description="the plan, written before the data (Markdown): kept on the study and in MLflow as a version; name "
        "an analysis of the report in backticks (`coupling`, `late`, ...) to mark it planned",
        json_schema_extra={"format": "textarea"},
    )

    _data_dir = _confined("data_dir", "path")
    _storage = _confined("storage", "store")
    _tracking = _confined("tracking_uri", "store")
    _bands = field_validator("overrides")(classmethod(lambda cls, v: _no_null_bands(v)))
    _plan = field_validator("plan")(classmethod(lambda cls, v: v if v is None else check_plan(v)))

    @model_validator(mode="after")
    def _resolves(self) -> SweepParams:
        try:
            self.resolved()
        except KeyError as err:
            raise ValueError(f"overrides: {err.args[0]}") from None
        return self

    def resolved(self) -> tuple[str, SweepSpace, RunConfig]:
        """(name, space, base): the preset's, or the whole ones given, with the axes and overrides applied."""
        from copc_core.config import with_overrides
        from sweeps.presets import sweep_preset
        from sweeps.space import with_axes

        space, base = sweep_preset(self.preset)
        lists = (self.methods, self.tau_policy, self.tau_advantage, self.staleness, self.seeds)
        space = with_axes(self.space or space, *(axis or None for axis in lists), self.steps)
        if self.warm_start_per_seed is not None:
            space = SweepSpace.model_validate(
                space.model_dump(mode="json") | {"warm_start_per_seed": self.warm_start_per_seed}
            )
        return self.name or self.preset, space, with_overrides(self.base or base, self.overrides)


class ReportParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sweeps: list[SweepName] = Field(default_factory=lambda: ["embedded-default"], min_length=1, max_length=50)
    out: Optional[str] = Field(None, description="HTML file (default: <data>/reports/<sweeps>.html)")
    tracking_uri: Optional[str] = None
    mlflow_ui: Optional[str] = Field(
        None, pattern=r"^https?://[^\s\"'<>]+$", description="base URL (http or https) of the MLflow UI for run links"
    )
    baseline: str = Field("async_ppo", description="method the learner-time ratio is taken against")
    data_dir: Optional[str] = Field(None, description="a folder inside the data folder (default: the data folder)")

    _data_dir = _confined("data_dir", "path")
    _out = _confined("out", "path")
    _tracking = _confined("tracking_uri", "store")


class AnalysisParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    spec: AnalysisSpec = Field(default_factory=AnalysisSpec)
    out: Optional[str] = Field(None, description="HTML file (default: <data>/reports/analysis-<hash>.html)")
    data_dir: Optional[str] = Field(None, description="a folder inside the data folder (default: the data folder)")

    _data_dir = _confined("data_dir", "path")
    _out = _confined("out", "path")


def _data(path: Optional[str]) -> pathlib.Path:
    from infra.settings import data_dir

    if path:
        p = pathlib.Path(path).resolve()
        p.mkdir(parents=True, exist_ok=True)
        return p
    return data_dir()


def publish_markdown(key: str, markdown: str, description: str) -> None:
    """An artifact of the flow run this is called in (a new version of `key` replaces what the UI shows): written
    from the flow itself, not a task, so that the Artifacts tab files it under the flow run and the run graph has no
    node for it."""
    create_markdown_artifact(key=key, markdown=markdown, description=description)


@flow(name="copc-train")
def copc_train(params: TrainParams) -> dict:
    """One training run (in process or on Ray), logged to MLflow as a run of kind `train`."""
    from prefect.runtime import flow_run

    from infra.local_run import train_and_track
    from infra.tracking import mlflow_ui_for, run_link, tracking_uri

    config = params.run_config()
    data = _data(params.data_dir)
    summary, run_dir, run_id = train_and_track(
        config, data, params.runtime, tags={"prefect_flow_run_id": str(flow_run.get_id())}
    )
    s = summary
    result = (
        f"held-out accuracy: warm start {s.warm_start_accuracy:.3f} → final {s.final_accuracy:.3f} "
        f"(peak {s.peak_accuracy:.3f}){' · COLLAPSED at step ' + str(s.collapse_step) if s.collapsed else ''}"
    )
    uri = tracking_uri(data)
    link = run_link(uri, mlflow_ui_for(uri), run_id)
    get_run_logger().info("run %s: %s; MLflow run %s: %s", config.config_hash(), result, run_id, link)
    publish_markdown(
        "copc-train-summary",
        f"### Run {config.config_hash()}\n\n{result}\n\n[MLflow run {run_id[:8]}]({link}); "
        f"files: `{run_dir}`\n\n```\n{s.model_dump_json(indent=2)}\n```",
        "run summary",
    )
    return summary.model_dump() | {"mlflow_run_id": run_id, "run_dir": str(run_dir)}


@task(name="warm start (SFT)", task_run_name="warm start (SFT)", cache_policy=NONE)
def warm_start_node(configs: list[RunConfig], cache: pathlib.Path) -> None:
    """The sweep's SFT warm start as a node of its run graph, its progress as a progress artifact and log lines
    (it is a few minutes of a small sweep's time); a warm start cached already takes no time."""
    from prefect.artifacts import create_progress_artifact, update_progress_artifact

    from flows.sweep_job import warm_cache

    logger = get_run_logger()
    progress = create_progress_artifact(0.0, key="warm-start", description="SFT warm start (cached for later sweeps)")
    built = []

    def on_warm(step: int, total: int, loss: float) -> None:
        every = max(1, total // 50)
        if step % every == 0 or step == total:
            update_progress_artifact(progress, 100.0 * step / total)
        if step % max(1, total // 10) == 0 or step == total:
            logger.info("warm start: step %d/%d, loss %.3f", step, total, loss)
        if step == total:
            built.append(step)

    warm_cache(configs, cache, on_warm)
    update_progress_artifact(progress, 100.0)
    logger.info("warm start: %s", f"{len(built)} built and cached" if built else "cached already")


class _TrialNodes:
    """The sweep's trials as nodes of its flow run: one submitted as each trial starts (it waits here), ended with
    the trial (a failure marks the node failed, not the flow)."""

    def __init__(self) -> None:
        self.ended_with: dict[str, dict] = {}
        self.changed = threading.Condition()
        self.futures: list = []

    def started(self, name: str) -> None:
        self.futures.append(trial_node.submit(name, self))

    def ended(self, name: str, outcome) -> None:
        if isinstance(outcome, BaseException):
            data = {"error": f"{type(outcome).__name__}: {outcome}"}
        else:
            data = {"mlflow_run_id": outcome.mlflow_run_id, "objective": outcome.objective}
            data |= outcome.summary.model_dump(
                include={"final_accuracy", "peak_accuracy", "collapsed", "collapse_step"}
            )
        with self.changed:
            self.ended_with[name] = data
            self.changed.notify_all()

    def wait(self, name: str) -> dict:
        with self.changed:
            self.changed.wait_for(lambda: name in self.ended_with)
            return self.ended_with[name]

    def close(self) -> None:
        """Every node has ended (each trial was ended before this is called)."""
        for future in self.futures:
            future.wait()


@task(name="trial", task_run_name="{name}", cache_policy=NONE)
def trial_node(name: str, nodes: _TrialNodes) -> dict:
    """A trial as a node of the sweep's run graph, running from the moment its Ray task starts until it ends: its
    summary and MLflow run, or its failure."""
    outcome = nodes.wait(name)
    if "error" in outcome:
        raise RuntimeError(f"trial {name} failed: {outcome['error']}")
    return outcome


class SweepOutcome(BaseModel):
    """What a finished `copc-sweep` flow run returns (the CLI prints it)."""

    parent_run_id: str
    mlflow_url: str
    trials: int  # trials this run ran or recovered
    table: str  # the per-cell text table
    report: str  # the HTML report's path
    failed: int
    storage: str
    tracking_uri: str
    best_per_level: list[str]


@flow(name="copc-sweep")
def copc_sweep(params: SweepParams) -> SweepOutcome:
    """Run a sweep: its warm start and each trial a node of this flow run as they happen, every trial's line in the
    log; publish its table as an artifact with links to MLflow and the report, and build the report."""
    # reports.build is loaded now, with the rest: a tree changed while the sweep runs (a pull) would otherwise meet the
    # modules loaded at its start when the report is built (an ImportError after hours of trials)
    import reports.build  # noqa: F401
    from flows.sweep_job import SweepHooks, best_per_level, grid_table, run_sweep, sweep_rows
    from infra.tracking import mlflow_ui_for, sweep_url
    from sweeps.presets import sweep_preset
    from sweeps.space import methods_notice

    logger = get_run_logger()
    name, space, base = params.resolved()
    if params.space is None and (
        notice := methods_notice(sweep_preset(params.preset)[0], space, params.methods, "methods")
    ):
        logger.warning(notice)  # the form's axes on a preset (`copc sweep` passes its space, having said its own)
    nodes = _TrialNodes()
    hooks = SweepHooks(
        say=logger,
        warm_start=warm_start_node,
        opened=lambda url: publish_markdown("copc-sweep", _running_markdown(name, url), "joint sweep (running)"),
        trial_started=nodes.started,
        trial_ended=nodes.ended,
    )
    try:
        result = run_sweep(
            space,
            name,
            base,
            _data(params.data_dir),
            params.storage,
            params.tracking_uri,
            params.sampler,
            params.max_parallel,
            hooks,
            params.plan,
        )
    finally:
        nodes.close()
    table = grid_table(result.study, space)
    logger.info("\n%s", table)
    report = copc_report(
        ReportParams.model_validate(
            {"sweeps": [name], "tracking_uri": result.tracking_uri, "data_dir": params.data_dir},
            context=LOCAL_CALLER,
        )
    )
    ui = mlflow_ui_for(result.tracking_uri)
    rows = sweep_rows(result.study, space)
    best = best_per_level(rows, space.schedule)
    publish_markdown("copc-sweep", _sweep_markdown(name, space, result, rows, best, report["path"], ui), "joint sweep")
    return SweepOutcome(
        parent_run_id=result.parent_run_id,
        mlflow_url=sweep_url(ui, result.experiment_id, name),
        trials=len(result.outcomes),
        table=table,
        report=report["path"],
        failed=result.failed,
        storage=result.storage,
        tracking_uri=result.tracking_uri,
        best_per_level=best,
    )


def _running_markdown(name: str, runs_url: str) -> str:
    """The sweep's artifact while it runs: where to watch it (replaced by the table when it ends)."""
    charts = runs_url + "&compareRunsMode=CHART"
    return (
        f"### Sweep {name} (running)\n\nMLflow: [the sweep's runs]({runs_url}) (each trial's run from its start, its "
        f"curves growing while it trains), [charts: objective against the bands]({charts}). The per-cell table and "
        "the report's path replace this when the sweep ends."
    )


def _sweep_markdown(
    name: str, space: SweepSpace, result, rows: list[dict], best: list[str], report: str, ui: str
) -> str:
    """The sweep artifact: the per-cell table (seed mean ± sd, 3 decimals), every trial of this run with
    a link to its MLflow run, and where the report is."""
    from infra.tracking import markdown_table, run_url, sweep_url

    experiment = result.experiment_id
    cells = [
        {
            "method": r["method"],
            "τ_p": r["tau_policy"],
            "τ_a": r["tau_advantage"],
            "k": r["staleness"],
            "seeds": r["seeds"],
            "objective mean": r["objective_mean"],
            "objective sd": r["objective_sd"],
            "final mean": r["final_mean"],
            "final sd": r["final_sd"],
            "collapsed": f"{r['collapsed']}/{r['seeds']}",
        }
        for r in rows
    ]
    trials = []
    for o in result.outcomes:
        run_id = o.result.mlflow_run_id if o.result else ""
        trials.append(
            {
                "trial": o.point.label(space.schedule),
                "state": o.state,
                "objective": o.value if o.state == "COMPLETE" else o.reason[:200],
                "MLflow run": f"[{run_id[:8]}]({run_url(ui, experiment, run_id)})" if run_id else None,
            }
        )
    lines = [
        f"### Sweep {name}",
        "",
        "best cell per staleness level (seed mean):",
        "",
        *(f"- {b}" for b in best or ["none finished"]),
        "",
        f"MLflow: [the sweep's runs]({sweep_url(ui, experiment, name)}), "
        f"[charts: objective against the bands]({sweep_url(ui, experiment, name, charts=True)}), "
        f"[parent run]({run_url(ui, experiment, result.parent_run_id)})",
        "",
        f"report: `{report}` (also the artifact `report/` of the parent run in MLflow); Optuna `{result.storage}`",
        "",
        markdown_table(cells, ".3f") if cells else "no cells",
        "",
        "Trials run by this flow run:",
        "",
        markdown_table(trials, ".3f") if trials else "none",
    ]
    return "\n".join(lines)


@flow(name="copc-report")
def copc_report(params: ReportParams) -> dict:
    """One self-contained HTML report of the named sweeps, read from MLflow and logged to each
    sweep's parent run; returns its path."""
    import re

    from infra.tracking import tracking_uri
    from reports.build import build_report

    data = _data(params.data_dir)
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", "+".join(params.sweeps))[:120]
    out = pathlib.Path(params.out) if params.out else data / "reports" / f"{slug}.html"
    path = build_report(tracking_uri(data, params.tracking_uri), params.sweeps, out, params.mlflow_ui, params.baseline)
    get_run_logger().info("report written to %s", path)
    publish_markdown(
        "copc-report",
        f"### Report of {', '.join(params.sweeps)}\n\nfile: `{path}` "
        "(also an artifact `report/` of each sweep's parent run in MLflow)",
        "sweep report",
    )
    return {"path": str(path)}


@flow(name="copc-analysis")
def copc_analysis(params: AnalysisParams) -> dict:
    """Exact bias/variance of the two-channel update over (τ_p, τ_a) × staleness on the enumerable
    token MDP: an HTML page of heatmaps plus the records as JSON next to it; returns both paths."""
    import hashlib
    import json
    import sys

    from tqdm import tqdm

    from copc_core.analysis.token_mdp import grid
    from reports.bias_variance import render

    spec = params.spec.model_dump(mode="json")
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:10]
    out = pathlib.Path(params.out) if params.out else _data(params.data_dir) / "reports" / f"analysis-{digest}.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    with tqdm(total=len(params.spec.points()), desc="exact grid", unit="point", file=sys.stderr) as bar:
        records = grid(params.spec, lambda done, total: bar.update(1))
    records_path = out.with_suffix(".json")
    for path, text in (
        (records_path, json.dumps({"spec": spec, "points": records}, indent=1)),
        (out, render(records, spec)),
    ):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    get_run_logger().info("analysis written to %s (records: %s)", out, records_path)
    publish_markdown(
        "copc-analysis",
        f"### Exact bias/variance analysis\n\nfile: `{out}`, records `{records_path}`",
        "bias/variance analysis",
    )
    return {"path": str(out), "records": str(records_path)}


def _as_json(params: BaseModel) -> dict:
    """Parameters as the JSON the Prefect API stores: ∞ as the string "Infinity" (which the models read back and
    their schema allows), never a float that the API's JSON would turn into null."""
    import json

    return json.loads(params.model_dump_json())


def deployments(data_dir: Optional[str] = None) -> list:
    """One deployment per flow, named for what it does, its parameters bound explicitly (the embedded defaults), and
    one `copc-sweep` deployment per sweep preset, named after it (sweeps/presets.py); every form is short, the whole
    config one optional field away."""
    from sweeps.presets import PRESETS

    sweeps = [
        copc_sweep.to_deployment(
            name=name, parameters={"params": _as_json(SweepParams(preset=name, data_dir=data_dir))}
        )
        for name in PRESETS
    ]
    return [
        copc_train.to_deployment(name="train", parameters={"params": _as_json(TrainParams(data_dir=data_dir))}),
        *sweeps,
        copc_report.to_deployment(name="report", parameters={"params": _as_json(ReportParams(data_dir=data_dir))}),
        copc_analysis.to_deployment(
            name="bias-variance", parameters={"params": _as_json(AnalysisParams(data_dir=data_dir))}
        ),
    ]
