"""MLflow tracking, the only module that imports mlflow.

A sweep is a parent run; each trial a nested child run with the flattened config as params,
`config.json` as an artifact, the config hash as a tag, per-step metrics sent in batches
(`log_batch`, never one call per metric per step) and the `RunSummary` as final metrics.
Default store: SQLite under the data folder; `MLFLOW_TRACKING_URI` or an explicit URI overrides.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import time
from typing import TYPE_CHECKING, Any

from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

if TYPE_CHECKING:  # only for annotations: the reports read runs through this module and import no torch
    from copc_core.config import RunConfig

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
        location = pathlib.Path(artifact_dir).resolve().as_uri() if artifact_dir and not uri.startswith("http") else None
        self.experiment_id = found.experiment_id if found else self.client.create_experiment(experiment, location)

    def parent_run(self, sweep_name: str, params: dict[str, Any]) -> str:
        """The sweep's parent run id (reused when the sweep is resumed)."""
        runs = self.client.search_runs([self.experiment_id], f"tags.copc_sweep = '{sweep_name}' and tags.copc_kind = 'sweep'")
        if runs:
            return runs[0].info.run_id
        run = self.client.create_run(self.experiment_id, run_name=sweep_name,
                                     tags={"copc_sweep": sweep_name, "copc_kind": "sweep"})
        self.client.log_batch(run.info.run_id, params=[Param(sanitize_key(k), v[:6000]) for k, v in flatten(params).items()])
        return run.info.run_id

    def log_trial(self, parent_id: str, sweep_name: str, run_name: str, config: RunConfig, summary: dict[str, Any],
                  history: list[dict[str, float]], evals: list[dict[str, float]], objective: float | None = None,
                  runtime: str = "inprocess") -> str:
        """One child run with everything the reports read; returns its run id.

        Besides the numeric summary fields (`summary/*`), the early-warning step lists go in as counts
        (`summary/ess_drop_count`, `summary/grad_spike_count`) and as tags, the sweep's objective as
        `summary/objective`, the runner as the `runtime` tag.
        """
        warnings = {"ess_drop_steps": summary.get("ess_drop_steps") or [],
                    "grad_norm_spike_steps": summary.get("grad_norm_spike_steps") or []}
        run = self.client.create_run(self.experiment_id, run_name=run_name, tags={
            "mlflow.parentRunId": parent_id, "copc_sweep": sweep_name, "copc_kind": "trial",
            "config_hash": config.config_hash(), "method": config.method.name, "runtime": runtime,
            "collapse_reason": str(summary.get("collapse_reason")),
            **{k: json.dumps(v)[:5000] for k, v in warnings.items()}})
        run_id = run.info.run_id
        params = [Param(sanitize_key(k), v) for k, v in flatten(config.model_dump(mode="json")).items()]
        self.client.log_batch(run_id, params=params)
        self.client.log_dict(run_id, config.model_dump(mode="json"), "config.json")
        now = int(time.time() * 1000)
        metrics = [Metric(sanitize_key(k), float(v), now, int(rec["step"]))
                   for rec in history + evals for k, v in rec.items() if k != "step"]
        metrics += [Metric(f"summary/{k}", float(v), now, 0) for k, v in summary.items()
                    if isinstance(v, (int, float, bool)) and v is not None]
        metrics += [Metric("summary/ess_drop_count", float(len(warnings["ess_drop_steps"])), now, 0),
                    Metric("summary/grad_spike_count", float(len(warnings["grad_norm_spike_steps"])), now, 0)]
        if objective is not None:
            metrics.append(Metric("summary/objective", float(objective), now, 0))
        for i in range(0, len(metrics), _BATCH):
            self.client.log_batch(run_id, metrics=metrics[i : i + _BATCH])
        self.client.set_terminated(run_id, "FAILED" if summary.get("collapsed") and summary.get("collapse_reason") == "non_finite" else "FINISHED")
        return run_id

    def logged_trials(self, parent_id: str) -> dict[str, dict[str, Any]]:
        """The finished, scored child runs of a sweep's parent, by config hash: {"mlflow_run_id", "summary",
        "runtime"} (the summary's numbers as logged, `collapsed` as a bool)."""
        runs = self.client.search_runs([self.experiment_id], f"tags.mlflow.parentRunId = '{parent_id}' and "
                                       "attributes.status = 'FINISHED'", max_results=50_000)
        out = {}
        for r in runs:
            metrics, tags = r.data.metrics, r.data.tags
            if "summary/objective" not in metrics or "config_hash" not in tags:
                continue
            summary = {k[len("summary/"):]: v for k, v in metrics.items() if k.startswith("summary/")}
            summary["collapsed"] = summary.get("collapsed", 0.0) > 0.5
            out.setdefault(tags["config_hash"], {"mlflow_run_id": r.info.run_id, "summary": summary,
                                                 "runtime": tags.get("runtime", "?"), "recovered": True})
        return out

    def log_failed_trial(self, parent_id: str, sweep_name: str, run_name: str, reason: str,
                         config: RunConfig | None = None) -> str:
        """A trial that raised: its config as params (so reports place it in the grid) and the reason."""
        tags = {"mlflow.parentRunId": parent_id, "copc_sweep": sweep_name, "copc_kind": "trial", "fail_reason": reason[:5000]}
        if config is not None:
            tags |= {"config_hash": config.config_hash(), "method": config.method.name}
        run = self.client.create_run(self.experiment_id, run_name=run_name, tags=tags)
        if config is not None:
            self.client.log_batch(run.info.run_id, params=[Param(sanitize_key(k), v) for k, v in
                                                           flatten(config.model_dump(mode="json")).items()])
        self.client.set_terminated(run.info.run_id, "FAILED")
        return run.info.run_id

    def finish_parent(self, parent_id: str, metrics: dict[str, float]) -> None:
        now = int(time.time() * 1000)
        self.client.log_batch(parent_id, metrics=[Metric(sanitize_key(k), float(v), now, 0) for k, v in metrics.items()])
        self.client.set_terminated(parent_id, "FINISHED")

    def log_report(self, parent_id: str, path: pathlib.Path) -> None:
        """Attach an HTML report to the sweep's parent run (a rerun replaces the file)."""
        self.client.log_artifact(parent_id, str(path), "report")


def read_sweeps(uri: str, sweeps: list[str], history_keys: list[str], experiment: str = "copc") -> dict[str, Any]:
    """Everything the reports need about some sweeps, as plain data (no MLflow objects escape).

    Returns {"experiment_id", "parents": [{run_id, sweep, status, params}], "trials": [{run_id,
    run_name, status, sweep, params, tags, metrics, history: {key: [(step, value), ...]}}]}.
    Reads only; raises LookupError naming what is missing (no experiment, no such sweep).
    """
    if uri.startswith("sqlite:///") and not pathlib.Path(uri[len("sqlite:///"):]).exists():
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
            known = sorted({r.data.tags.get("copc_sweep") for r in client.search_runs([exp], "tags.copc_kind = 'sweep'")})
            raise LookupError(f"no sweep named {sweep!r} in {uri} (known: {', '.join(map(str, known)) or 'none'})")
        parents += [{"run_id": r.info.run_id, "sweep": sweep, "status": r.info.status, "params": dict(r.data.params)}
                    for r in sweep_parents]
        for r in runs:
            if r.data.tags.get("copc_kind") != "trial":
                continue
            history = {}
            for key in history_keys:
                if key in r.data.metrics:
                    points = client.get_metric_history(r.info.run_id, key)
                    history[key] = sorted((int(m.step), float(m.value)) for m in points)
            trials.append({"run_id": r.info.run_id, "run_name": r.info.run_name or "", "status": r.info.status,
                           "sweep": sweep, "params": dict(r.data.params), "tags": dict(r.data.tags),
                           "metrics": dict(r.data.metrics), "history": history})
    return {"experiment_id": exp, "parents": parents, "trials": trials}
