"""MLflow tracking, the only module that imports mlflow.

A sweep is a parent run; each trial a nested child run, created when the trial starts, with the flattened config
as params, `config.json` as an artifact, the config hash as a tag, per-step metrics sent in batches while it
trains (`MetricStream`, from the process that trains; `log_batch`, never one call per metric per step) and the
`RunSummary` as final metrics when it ends.
Default store: SQLite under the data folder; `MLFLOW_TRACKING_URI` or an explicit URI overrides.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import platform
import re
import sys
import time
from importlib import metadata
from typing import TYPE_CHECKING, Any

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from copc_core.train.stability import RunSummary

if TYPE_CHECKING:  # only for annotations: the reports read runs through this module and import no torch
    from copc_core.config import RunConfig
    from copc_core.results import TrialResult

EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")
# MLflow 3.17's UI opens an experiment in its GenAI view: the sidebar's GenAI / Model training toggle lives in the
# browser's localStorage (default GenAI) and ignores EXPERIMENT_KIND (mlflow/mlflow#24498). A link that names the
# view in its query is opened as a training experiment in any browser.
TRAINING_VIEW = "workflowType=machine_learning"
SHARED_VIEW = "mlflow.sharedViewState."  # an experiment tag MLflow's UI reads a runs view from (its "Share" button)
# what a sweep's view shows: the point and the outcome, beside the run name (which carries the point too)
VIEW_COLUMNS = [
    "params.`point.method`",
    "params.`point.tau_policy`",
    "params.`point.tau_advantage`",
    "params.`train.staleness`",
    "params.`train.seed`",
    "metrics.`summary/objective`",
    "metrics.`summary/final_accuracy`",
    "metrics.`summary/peak_accuracy`",
    "metrics.`summary/collapsed`",
    "metrics.`summary/collapse_step`",
]
_BATCH = 900  # MLflow accepts up to 1000 metrics per log_batch call
_KEY = re.compile(r"[^A-Za-z0-9_\-./ ]")


def tracking_uri(data_dir: pathlib.Path, uri: str | None = None) -> str:
    return uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{pathlib.Path(data_dir) / 'mlflow.db'}"


def sanitize_key(key: str) -> str:
    """MLflow keys allow letters, digits, `_ - . / space`: anything else becomes `_`."""
    return _KEY.sub("_", key)


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out |= flatten(v, key + ".")
        else:
            out[key] = json.dumps(v) if isinstance(v, (list, tuple)) else str(v)
    return out


class Tracker:
    def __init__(self, uri: str, experiment: str = "copc", artifact_dir: pathlib.Path | None = None):
        """`artifact_dir` places a new experiment's artifacts (local stores); a server decides its own."""
        self.uri = uri
        # MlflowClient(uri) only: mlflow.set_tracking_uri would also export MLFLOW_TRACKING_URI to this
        # process's environment, and every later subprocess (a second command, a test) would inherit it
        self.client = MlflowClient(uri)
        found = self.client.get_experiment_by_name(experiment)
        location = (
            pathlib.Path(artifact_dir).resolve().as_uri() if artifact_dir and not uri.startswith("http") else None
        )
        self.experiment_id = found.experiment_id if found else self.client.create_experiment(experiment, location)
        if not found or EXPERIMENT_KIND[0] not in found.tags:
            # MLflow 3 opens an experiment without this tag in GenAI mode (a Traces page, no runs table)
            self.client.set_experiment_tag(self.experiment_id, *EXPERIMENT_KIND)

    def parent_run(self, sweep_name: str, params: dict[str, Any]) -> str:
        """The sweep's parent run id (reused when the sweep is resumed)."""
        runs = self.client.search_runs(
            [self.experiment_id], f"tags.copc_sweep = '{sweep_name}' and tags.copc_kind = 'sweep'"
        )
        if runs:
            return runs[0].info.run_id
        run = self.client.create_run(
            self.experiment_id, run_name=sweep_name, tags={"copc_sweep": sweep_name, "copc_kind": "sweep"}
        )
        self.client.log_batch(
            run.info.run_id, params=[Param(sanitize_key(k), v[:6000]) for k, v in flatten(params).items()]
        )
        return run.info.run_id

    def log_trial(
        self,
        parent_id: str | None,
        sweep_name: str | None,
        run_name: str,
        config: RunConfig,
        result: TrialResult,
        label: str | None = None,
        tags: dict[str, str] | None = None,
    ) -> str:
        """One run with everything the reports read, logged after it ended; returns its run id (`start_trial`, then
        `finish_trial`). A trial of a sweep is a child of the sweep's parent run; a single `copc train` run
        (`parent_id` None) is a run of its own."""
        run_id = self.start_trial(parent_id, sweep_name, run_name, config, label, tags)
        self.finish_trial(run_id, result)
        return run_id

    def start_trial(
        self,
        parent_id: str | None,
        sweep_name: str | None,
        run_name: str,
        config: RunConfig,
        label: str | None = None,
        tags: dict[str, str] | None = None,
    ) -> str:
        """A run for a trial that starts now (RUNNING, so the UI lists it while it trains): its identity as tags (the
        config hash, the method's key in the sweep as `method`, the bands in effect, `tags` such as the machine), the
        config as params (`run_params`) and `config.json`. Returns its id; `MetricStream` and `finish_trial` add to
        it."""
        kind = (
            {"mlflow.parentRunId": parent_id, "copc_sweep": sweep_name, "copc_kind": "trial"}
            if parent_id
            else {"copc_kind": "train"}
        )
        tp, ta = config.method.resolved_taus()  # the bands in effect (a method's default when not given)
        run = self.client.create_run(
            self.experiment_id,
            run_name=run_name,
            tags={
                **kind,
                "config_hash": config.config_hash(),
                "method_spec": config.method.spec_hash(),  # the method as resolved (registry row included)
                "method": label or config.method.name,
                "tau_policy": str(tp),
                "tau_advantage": str(ta),
                **(tags or {}),
            },
        )
        run_id = run.info.run_id
        self.client.log_batch(run_id, params=run_params(config, label))
        self.client.log_dict(run_id, config.model_dump(mode="json"), "config.json")
        t = config.train
        warmup = (
            f"{t.critic_warmup_steps} value-only critic warm-up steps come first (no curves yet), then "
            if t.critic_warmup_steps
            else ""
        )
        self._set_tags(
            run_id,
            {
                "mlflow.note.content": f"{run_name}: {warmup}{t.steps} learner steps, evaluated every {t.eval_every}; "
                "the curves grow from the first learner step while it trains (refresh the page)."
            },
        )
        return run_id

    def finish_trial(self, run_id: str, result: TrialResult) -> None:
        """End a started run with its result: the per-step records it has not streamed yet (`result.streamed`), the
        summary as `summary/*` metrics (the early-warning step lists as counts, `summary/ess_drop_count` and
        `summary/grad_spike_count`, and as tags), the sweep's objective as `summary/objective`, the runner as the
        `runtime` tag; FINISHED, or FAILED for a non-finite step."""
        summary = result.summary
        warnings = {"ess_drop_steps": summary.ess_drop_steps, "grad_norm_spike_steps": summary.grad_norm_spike_steps}
        self.client.log_batch(
            run_id,
            tags=[
                RunTag("runtime", result.runtime),
                RunTag("collapse_reason", str(summary.collapse_reason)),
                *(RunTag(k, json.dumps(v)[:5000]) for k, v in warnings.items()),
            ],
        )
        sent_steps, sent_evals = result.streamed
        metrics = step_metrics(result.history[sent_steps:] + result.evals[sent_evals:])
        now = int(time.time() * 1000)
        metrics += [
            Metric(f"summary/{k}", float(v), now, 0)
            for k, v in summary.model_dump().items()
            if isinstance(v, (int, float, bool)) and v is not None
        ]
        metrics += [
            Metric("summary/ess_drop_count", float(len(warnings["ess_drop_steps"])), now, 0),
            Metric("summary/grad_spike_count", float(len(warnings["grad_norm_spike_steps"])), now, 0),
        ]
        if result.objective is not None:
            metrics.append(Metric("summary/objective", float(result.objective), now, 0))
        self._log_metrics(run_id, metrics)
        self.client.set_terminated(run_id, "FAILED" if summary.collapse_reason == "non_finite" else "FINISHED")

    def fail_trial(self, run_id: str, reason: str) -> None:
        """End a started run whose trial raised: the reason as the tag `fail_reason`, status FAILED."""
        self._set_tags(run_id, {"fail_reason": reason[:5000]})
        self.client.set_terminated(run_id, "FAILED")

    def kill_orphans(self, parent_id: str, live: set[tuple[str, str]]) -> int:
        """Mark KILLED the RUNNING trial runs of a sweep whose point no live sweep process is running (`live`: their
        (config hash, method label) keys): a sweep stopped midway left them, and they will never finish. Returns
        how many."""
        runs = self.client.search_runs(
            [self.experiment_id],
            f"tags.mlflow.parentRunId = '{parent_id}' and attributes.status = 'RUNNING'",
            max_results=50_000,
        )
        orphans = [r for r in runs if (r.data.tags.get("config_hash"), r.data.tags.get("method")) not in live]
        for r in orphans:
            self._set_tags(r.info.run_id, {"fail_reason": "interrupted: its sweep process stopped"})
            self.client.set_terminated(r.info.run_id, "KILLED")
        return len(orphans)

    def _set_tags(self, run_id: str, tags: dict[str, str]) -> None:
        """Set tags through `log_batch`, not `set_tag`: MLflow's set_tag reads, then inserts, so two processes setting
        one new tag at once (two sweep processes finishing one study both write its parent's note) fail the second
        with a UNIQUE constraint; log_batch retries that race (MLflow's `_try_insert_tags`)."""
        self.client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])

    def _log_metrics(self, run_id: str, metrics: list[Metric]) -> None:
        for i in range(0, len(metrics), _BATCH):
            self.client.log_batch(run_id, metrics=metrics[i : i + _BATCH])

    def logged_train_run(self, config_hash: str, run_dir: str) -> str | None:
        """The id of a finished `train` run of this config in this run folder, if one was logged."""
        folder = run_dir.replace("\\", "\\\\").replace("'", "\\'")
        runs = self.client.search_runs(
            [self.experiment_id],
            f"tags.copc_kind = 'train' and tags.config_hash = "
            f"'{config_hash}' and tags.run_dir = '{folder}' and attributes.status = 'FINISHED'",
        )
        return runs[0].info.run_id if runs else None

    def logged_trials(
        self, parent_id: str, specs: dict[tuple[str, str], str] | None = None
    ) -> dict[tuple[str, str], TrialResult]:
        """The finished, scored child runs of a sweep's parent, by (config hash, method label) (summary as logged; no
        curves). The label is part of the key: a config names a method by its registry name, so when a preset's
        meaning changes (COPC's default reading, which its ablations follow) the hash stays and only a relabelled
        run (scripts/relabel_trials.py) tells the old result from the new point. A run whose `method_spec` tag
        differs from `specs[key]` (the method as resolved today) ran another definition of it and is left out."""
        from copc_core.results import TrialResult

        runs = self.client.search_runs(
            [self.experiment_id],
            f"tags.mlflow.parentRunId = '{parent_id}' and attributes.status = 'FINISHED'",
            max_results=50_000,
        )
        out = {}
        for r in runs:
            metrics, tags = r.data.metrics, r.data.tags
            key = (tags.get("config_hash"), tags.get("method"))
            if "summary/objective" not in metrics or "config_hash" not in tags or key in out:
                continue
            if specs and "method_spec" in tags and key in specs and tags["method_spec"] != specs[key]:
                continue
            out[key] = TrialResult(
                logged_summary(metrics, tags),
                runtime=tags.get("runtime", "?"),
                objective=metrics["summary/objective"],
                mlflow_run_id=r.info.run_id,
                recovered=True,
            )
        return out

    def log_failed_trial(
        self,
        parent_id: str,
        sweep_name: str,
        run_name: str,
        reason: str,
        config: RunConfig,
        label: str | None = None,
    ) -> str:
        """A trial that raised before it was started in MLflow: its config as params (so reports place it in the
        grid) and the reason."""
        run_id = self.start_trial(parent_id, sweep_name, run_name, config, label)
        self.fail_trial(run_id, reason)
        return run_id

    def finish_parent(
        self, parent_id: str, metrics: dict[str, float], table: list[dict[str, Any]] | None = None
    ) -> None:
        """Close a sweep's parent run: its metrics, and the per-cell summary `table` as the run's
        description (a Markdown table, shown on the run's page) and as `sweep_summary.json`."""
        now = int(time.time() * 1000)
        self.client.log_batch(
            parent_id, metrics=[Metric(sanitize_key(k), float(v), now, 0) for k, v in metrics.items()]
        )
        if table:
            self._set_tags(parent_id, {"mlflow.note.content": markdown_table(table)[:60_000]})
            self.client.log_dict(parent_id, {"cells": table}, "sweep_summary.json")
        self.client.set_terminated(parent_id, "FINISHED")

    def sweep_view(self, sweep_name: str) -> str:
        """Write the sweep's view of MLflow's runs page as a shared view (the state MLflow's own "Share" button
        stores on the experiment) and return its key, for `sweep_url`: the sweep's trial runs, best objective first,
        with the point's and the outcome's columns; its chart view opens on the objective against the bands, the lag
        and the seed (parallel coordinates), before MLflow's own per-metric charts."""
        quoted = sweep_name.replace("'", "\\'")
        section = {"uuid": "copc-sweep", "name": "Sweep: objective against the bands", "display": True}
        section |= {"columns": 1, "cardHeight": 480}  # one chart across the page, tall enough to read its axes
        state = {
            "searchFilter": f"tags.copc_sweep = '{quoted}' and tags.copc_kind = 'trial'",
            "orderByKey": "metrics.`summary/objective`",
            "orderByAsc": False,
            "selectedColumns": VIEW_COLUMNS,
            "columnOrder": VIEW_COLUMNS,
            "isAccordionReordered": True,
            "compareRunSections": [section | {"isReordered": True}],
            "compareRunCharts": [
                {
                    "type": "PARALLEL",
                    "uuid": "copc-parallel",
                    "metricSectionId": section["uuid"],
                    "displayName": "objective against the method, τ_p, τ_a, k and seed",
                    "selectedParams": [f"point.{k}" for k in ("method", "tau_policy", "tau_advantage")]
                    + ["train.staleness", "train.seed"],
                    "selectedMetrics": ["summary/objective"],
                    "showAllRuns": True,
                    "runsCountToCompare": 100,
                    "deleted": False,
                    "isGenerated": False,
                }
            ],
        }
        key = view_key(sweep_name)
        self.client.set_experiment_tag(self.experiment_id, SHARED_VIEW + key, json.dumps(state))
        return key

    def record_plans(self, parent_id: str, plans: list[dict[str, Any]]) -> None:
        """The versions of the sweep's plan (sweeps/plan.py; {version, sha256, at, text, runs_before}, oldest first)
        on its parent run: each text as `plan/v<N>.md`, its time and the trials finished before it as tags
        `plan.v<N>.at` / `plan.v<N>.runs_before`, its hash `plan.v<N>.sha256` written last (a version is whole when
        its hash is there), and `plan_version` naming the latest. A version already there is left as it is; one
        there with another hash (the parent of an older study under the same name) raises ValueError rather than show
        a text that is not the study's."""
        if not plans:
            return
        tags = self.client.get_run(parent_id).data.tags
        for plan in plans:
            version, sha256 = plan["version"], plan["sha256"]
            recorded = tags.get(f"plan.v{version}.sha256")
            if recorded is not None and recorded != sha256:
                raise ValueError(
                    f"plan v{version} of this sweep's MLflow parent run {parent_id} has sha256 {recorded[:12]}, the "
                    f"study's has {sha256[:12]}: the run belongs to another study of the same name; run this sweep "
                    "under a new name"
                )
            if recorded is None:
                self.client.log_text(parent_id, plan["text"], f"plan/v{version}.md")
                self._set_tags(
                    parent_id,
                    {
                        f"plan.v{version}.at": plan["at"],
                        f"plan.v{version}.runs_before": str(plan["runs_before"]),
                        f"plan.v{version}.sha256": sha256,
                    },
                )
        self._set_tags(parent_id, {"plan_version": str(plans[-1]["version"])})

    def log_report(self, parent_id: str, path: pathlib.Path) -> None:
        """Attach an HTML report to the sweep's parent run (a rerun replaces the file)."""
        self.client.log_artifact(parent_id, str(path), "report")


def step_metrics(records: list[dict[str, float]]) -> list[Metric]:
    """Per-step records ({"step": s, key: value, ...}) as MLflow metrics at their steps."""
    now = int(time.time() * 1000)
    return [
        Metric(sanitize_key(k), float(v), now, int(rec["step"]))
        for rec in records
        for k, v in rec.items()
        if k != "step"
    ]


def stream_every_s() -> float:
    """Seconds between a training run's metric sends to MLflow: `COPC_MLFLOW_STREAM_S` (default 5; a remote store
    under load may want more, a test less)."""
    text = os.environ.get("COPC_MLFLOW_STREAM_S", "5")
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"COPC_MLFLOW_STREAM_S must be a number of seconds ≥ 0, got {text!r}")
    return value


class MetricStream:
    """A training run's step records sent to its MLflow run while it trains (from the process that trains it), at most
    every `every_s` seconds, so its curves grow in the UI. `send(history, evals)` takes the run's record lists as
    they grow; `close()` sends the rest and returns how many of each were sent, for `Tracker.finish_trial` to send
    the others. A tracking store that fails is not retried: the stream stops, says why (`error`), and the run's
    result still carries every record."""

    def __init__(self, uri: str, run_id: str, every_s: float = 5.0):
        self.client, self.run_id, self.every_s = MlflowClient(uri), run_id, every_s
        self.sent = [0, 0]  # history, evals records sent
        self.last = -math.inf  # the first step goes out at once: the curve starts with the run
        self.error: str | None = None

    def send(self, history: list[dict[str, float]], evals: list[dict[str, float]], force: bool = False) -> None:
        if self.error is not None or (not force and time.monotonic() - self.last < self.every_s):
            return
        new = [history[self.sent[0] :], evals[self.sent[1] :]]
        try:
            metrics = step_metrics(new[0] + new[1])
            for i in range(0, len(metrics), _BATCH):
                self.client.log_batch(self.run_id, metrics=metrics[i : i + _BATCH])
        except Exception as err:  # the store is down or refuses: the result keeps the records; the caller logs them
            self.error = f"{type(err).__name__}: {err}"[:500]
            print(
                f"warning: MLflow run {self.run_id}: live metrics stopped ({self.error}); logged at the end",
                file=sys.stderr,
            )
            return
        self.sent = [self.sent[0] + len(new[0]), self.sent[1] + len(new[1])]
        self.last = time.monotonic()

    def close(self, history: list[dict[str, float]], evals: list[dict[str, float]]) -> tuple[int, int]:
        self.send(history, evals, force=True)
        return self.sent[0], self.sent[1]


def run_params(config: RunConfig, label: str | None = None) -> list[Param]:
    """A run's parameters: the flattened config, and its point as MLflow's charts can draw it (`point.method`, the
    sweep's key of the method with its reading; `point.tau_policy` / `point.tau_advantage` as text, `τp=1.5`,
    `τp=∞`, or `none` for a band the method lacks: a number axis would drop ∞ and the methods without a band)."""
    tp, ta = config.method.resolved_taus()
    point = {
        "point.method": label or config.method.name,
        "point.tau_policy": "none" if tp is None else f"τp={tp:g}".replace("inf", "∞"),
        "point.tau_advantage": "none" if ta is None else f"τa={ta:g}".replace("inf", "∞"),
    }
    flat = flatten(config.model_dump(mode="json")) | point
    return [Param(sanitize_key(k), v) for k, v in flat.items()]


def view_key(sweep_name: str) -> str:
    """The key of a sweep's shared view (a tag key and a URL value: no characters either refuses)."""
    import hashlib

    return "copc-" + hashlib.sha1(sweep_name.encode()).hexdigest()[:12]


def run_url(mlflow_ui: str, experiment_id: str, run_id: str) -> str:
    """A run's page in MLflow's UI, as a training run (not the GenAI view)."""
    return f"{mlflow_ui.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}?{TRAINING_VIEW}"


DEFAULT_MLFLOW_UI = "http://127.0.0.1:5000"  # what `copc up` serves, on the same store


def mlflow_ui_for(tracking_uri: str, mlflow_ui: str | None = None) -> str:
    """Where run links point: an explicit UI, else the tracking server itself, else `copc up`'s."""
    if mlflow_ui:
        return mlflow_ui
    return tracking_uri if tracking_uri.startswith(("http://", "https://")) else DEFAULT_MLFLOW_UI


def run_link(tracking: str, mlflow_ui: str, run_id: str) -> str:
    """The UI URL of a logged run (its experiment read from the store)."""
    return run_url(mlflow_ui, MlflowClient(tracking).get_run(run_id).info.experiment_id, run_id)


def sweep_url(mlflow_ui: str, experiment_id: str, sweep_name: str, charts: bool = False) -> str:
    """A sweep's runs in MLflow's UI (its shared view, `Tracker.sweep_view`); `charts`: the chart view, whose first
    chart is the objective against the bands."""
    mode = "&compareRunsMode=CHART" if charts else ""
    return (
        f"{mlflow_ui.rstrip('/')}/#/experiments/{experiment_id}/runs?{TRAINING_VIEW}"
        f"&viewStateShareKey={view_key(sweep_name)}{mode}"
    )


def logged_summary(metrics: dict[str, float], tags: dict[str, str]) -> RunSummary:
    """A run's `RunSummary` from what `Tracker.log_trial` logged (numbers as metrics, lists as tags)."""
    fields = RunSummary.model_fields
    data: dict[str, Any] = {k: metrics.get(f"summary/{k}") for k in fields}
    data["collapsed"] = (metrics.get("summary/collapsed") or 0.0) > 0.5
    reason = tags.get("collapse_reason")
    data["collapse_reason"] = None if reason in (None, "None") else reason
    for k in ("ess_drop_steps", "grad_norm_spike_steps"):
        data[k] = json.loads(tags.get(k, "[]"))
    for k in ("steps_completed", "collapse_step", "collapse_step_train"):
        data[k] = None if data[k] is None else int(data[k])
    return RunSummary.model_validate(data)


def markdown_table(rows: list[dict[str, Any]], number: str = ".3g") -> str:
    """Rows as a Markdown table, the first row's keys as its head (floats in the `number` format,
    None and NaN as —)."""

    def cell(v: Any) -> str:
        if v is None or (isinstance(v, float) and v != v):
            return "—"
        return format(v, number) if isinstance(v, float) else str(v)

    head = list(rows[0])
    return "\n".join(
        ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        + ["| " + " | ".join(cell(r[k]) for k in head) + " |" for r in rows]
    )


def machine_tags() -> dict[str, str]:
    """What a run was measured on: CPU model and count, OS, Python and the library versions."""
    cpu = platform.processor() or "?"
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for lib in ("torch", "ray", "mlflow", "optuna", "transformers"):
        try:
            versions[f"machine.{lib}"] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            versions[f"machine.{lib}"] = "absent"
    return {
        "machine.cpu": cpu,
        "machine.cores": str(os.cpu_count()),
        "machine.os": platform.platform(),
        "machine.python": platform.python_version(),
        **versions,
    }


def _plans(client: MlflowClient, parent) -> list[dict[str, Any]]:
    """The plan versions `Tracker.record_plans` left on a parent run, oldest first: {version, sha256, at,
    runs_before, text}."""
    import tempfile

    tags, out = parent.data.tags, []
    version = 1
    while f"plan.v{version}.sha256" in tags:
        with tempfile.TemporaryDirectory() as tmp:
            path = client.download_artifacts(parent.info.run_id, f"plan/v{version}.md", tmp)
            text = pathlib.Path(path).read_text(encoding="utf-8")
        out.append(
            {
                "version": version,
                "sha256": tags[f"plan.v{version}.sha256"],
                "at": tags[f"plan.v{version}.at"],
                "runs_before": int(tags.get(f"plan.v{version}.runs_before", "0")),
                "text": text,
            }
        )
        version += 1
    return out


def read_sweeps(uri: str, sweeps: list[str], history_keys: list[str], experiment: str = "copc") -> dict[str, Any]:
    """Everything the reports need about some sweeps, as plain data (no MLflow objects escape).

    Returns {"experiment_id", "parents": [{run_id, sweep, status, params, plans}], "trials": [{run_id,
    run_name, status, sweep, params, tags, metrics, history: {key: [(step, value), ...]}}]}.
    Reads only; raises LookupError naming what is missing (no experiment, no such sweep).
    """
    if uri.startswith("sqlite:///") and not pathlib.Path(uri[len("sqlite:///") :]).exists():
        raise LookupError(f"no MLflow store at {uri}: run a sweep first")  # and opening it would create one
    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise LookupError(f"no MLflow experiment {experiment!r} in {uri}: run a sweep first")
    exp = found.experiment_id
    parents, trials = [], []
    for sweep in sweeps:
        quoted = sweep.replace("'", "\\'")
        runs = client.search_runs([exp], f"tags.copc_sweep = '{quoted}'", max_results=50_000)
        sweep_parents = [r for r in runs if r.data.tags.get("copc_kind") == "sweep"]
        if not sweep_parents:
            known = sorted(
                {r.data.tags.get("copc_sweep") for r in client.search_runs([exp], "tags.copc_kind = 'sweep'")}
            )
            raise LookupError(f"no sweep named {sweep!r} in {uri} (known: {', '.join(map(str, known)) or 'none'})")
        parents += [
            {
                "run_id": r.info.run_id,
                "sweep": sweep,
                "status": r.info.status,
                "params": dict(r.data.params),
                "plans": _plans(client, r),
            }
            for r in sweep_parents
        ]
        for r in runs:
            if r.data.tags.get("copc_kind") != "trial":
                continue
            history = {}
            for key in history_keys:
                if key in r.data.metrics:
                    points = client.get_metric_history(r.info.run_id, key)
                    history[key] = sorted((int(m.step), float(m.value)) for m in points)
            trials.append(
                {
                    "run_id": r.info.run_id,
                    "run_name": r.info.run_name or "",
                    "status": r.info.status,
                    "sweep": sweep,
                    "params": dict(r.data.params),
                    "tags": dict(r.data.tags),
                    "metrics": dict(r.data.metrics),
                    "history": history,
                }
            )
    return {"experiment_id": exp, "parents": parents, "trials": trials}
