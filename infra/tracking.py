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
from typing import Any

import mlflow
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

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
        mlflow.set_tracking_uri(uri)
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
                  history: list[dict[str, float]], evals: list[dict[str, float]]) -> str:
        """One child run with everything the reports read; returns its run id."""
        run = self.client.create_run(self.experiment_id, run_name=run_name, tags={
            "mlflow.parentRunId": parent_id, "copc_sweep": sweep_name, "copc_kind": "trial",
            "config_hash": config.config_hash(), "method": config.method.name})
        run_id = run.info.run_id
        params = [Param(sanitize_key(k), v) for k, v in flatten(config.model_dump(mode="json")).items()]
        self.client.log_batch(run_id, params=params)
        self.client.log_dict(run_id, config.model_dump(mode="json"), "config.json")
        now = int(time.time() * 1000)
        metrics = [Metric(sanitize_key(k), float(v), now, int(rec["step"]))
                   for rec in history + evals for k, v in rec.items() if k != "step"]
        metrics += [Metric(f"summary/{k}", float(v), now, 0) for k, v in summary.items()
                    if isinstance(v, (int, float, bool)) and v is not None]
        for i in range(0, len(metrics), _BATCH):
            self.client.log_batch(run_id, metrics=metrics[i : i + _BATCH])
        self.client.set_terminated(run_id, "FAILED" if summary.get("collapsed") and summary.get("collapse_reason") == "non_finite" else "FINISHED")
        return run_id

    def log_failed_trial(self, parent_id: str, sweep_name: str, run_name: str, reason: str) -> str:
        run = self.client.create_run(self.experiment_id, run_name=run_name, tags={
            "mlflow.parentRunId": parent_id, "copc_sweep": sweep_name, "copc_kind": "trial", "fail_reason": reason[:5000]})
        self.client.set_terminated(run.info.run_id, "FAILED")
        return run.info.run_id

    def finish_parent(self, parent_id: str, metrics: dict[str, float]) -> None:
        now = int(time.time() * 1000)
        self.client.log_batch(parent_id, metrics=[Metric(sanitize_key(k), float(v), now, 0) for k, v in metrics.items()])
        self.client.set_terminated(parent_id, "FINISHED")
