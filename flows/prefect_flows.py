"""Prefect flows `copc-train`, `copc-sweep`, `copc-report`: one typed parameter each, thin wiring.

Deployments (`copc serve`) bind these flows so that each can be triggered from the Prefect UI with a
parameter form generated from the pydantic models below.
"""

from __future__ import annotations

import pathlib
from typing import Optional

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from pydantic import BaseModel, ConfigDict, Field

from copc_core.config import RunConfig
from sweeps.space import SweepSpace


class TrainParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    config: RunConfig = Field(default_factory=RunConfig)
    runtime: str = Field("inprocess", pattern="^(inprocess|ray)$")
    data_dir: Optional[str] = None


class SweepParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = "embedded-default"
    space: SweepSpace = Field(default_factory=SweepSpace)
    base: RunConfig = Field(default_factory=RunConfig)
    storage: Optional[str] = None
    tracking_uri: Optional[str] = None
    sampler: str = Field("grid", pattern="^(grid|tpe)$")
    data_dir: Optional[str] = None


class ReportParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sweep: str = "embedded-default"
    tracking_uri: Optional[str] = None
    data_dir: Optional[str] = None


def _data(path: Optional[str]) -> pathlib.Path:
    from infra.settings import data_dir

    if path:
        p = pathlib.Path(path).resolve()
        p.mkdir(parents=True, exist_ok=True)
        return p
    return data_dir()


@task(retries=2, retry_delay_seconds=2)
def publish_markdown(key: str, markdown: str, description: str) -> None:
    """Idempotent I/O (an artifact write): the only kind of task that retries."""
    create_markdown_artifact(key=key, markdown=markdown, description=description)


@flow(name="copc-train")
def copc_train(params: TrainParams) -> dict:
    from infra.local_run import train_in_process, train_on_ray

    data = _data(params.data_dir)
    run_dir = data / "runs" / params.config.config_hash()
    runner = train_on_ray if params.runtime == "ray" else train_in_process
    summary = runner(params.config, run_dir, data / "cache")
    publish_markdown("copc-train-summary", f"### Run {params.config.config_hash()}\n\n```\n"
                     f"{summary.model_dump_json(indent=2)}\n```\n\nfiles: `{run_dir}`", "run summary")
    return summary.model_dump()


@flow(name="copc-sweep")
def copc_sweep(params: SweepParams) -> dict:
    from flows.sweep_job import grid_table, run_sweep

    logger = get_run_logger()
    result = run_sweep(params.space, params.name, params.base, _data(params.data_dir), params.storage,
                       params.tracking_uri, params.sampler)
    table = grid_table(result["study"], params.space)
    logger.info("\n%s", table)
    best = result["best"]
    runs = [f"| {o['params']} | {o['state']} | {o.get('value', '')} | {o.get('mlflow_run_id', '')} |"
            for o in result["outcomes"]]
    publish_markdown("copc-sweep", f"### Sweep {params.name}\n\n```\n{table}\n```\n\nbest: {best.params if best else None}"
                     f"\n\nMLflow `{result['tracking_uri']}`, parent run `{result['parent_run_id']}`; Optuna "
                     f"`{result['storage']}`\n\n| params | state | value | MLflow run |\n|---|---|---|---|\n" + "\n".join(runs),
                     "joint sweep")
    return {"parent_run_id": result["parent_run_id"], "trials": len(result["outcomes"]), "table": table,
            "failed": sum(o["state"] == "FAIL" for o in result["outcomes"]), "storage": result["storage"],
            "tracking_uri": result["tracking_uri"],
            "best_value": best.value if best else None, "best_params": best.params if best else None}


@flow(name="copc-report")
def copc_report(params: ReportParams) -> list[dict]:
    """Lists the sweep's trial runs (the HTML report comes with the reports issue)."""
    from infra.tracking import Tracker, tracking_uri

    tracker = Tracker(tracking_uri(_data(params.data_dir), params.tracking_uri))
    runs = tracker.client.search_runs([tracker.experiment_id],
                                      f"tags.copc_sweep = '{params.sweep}' and tags.copc_kind = 'trial'")
    rows = [{"run_id": r.info.run_id, "name": r.info.run_name, "status": r.info.status,
             "final_accuracy": r.data.metrics.get("summary/final_accuracy")} for r in runs]
    publish_markdown("copc-report", "| run | name | status | final accuracy |\n|---|---|---|---|\n" + "\n".join(
        f"| {r['run_id']} | {r['name']} | {r['status']} | {r['final_accuracy']} |" for r in rows), "sweep runs")
    return rows


DEPLOYMENT = "embedded"


def deployments(data_dir: Optional[str] = None) -> list:
    """One deployment per flow, its parameters bound explicitly (the embedded defaults)."""
    return [
        copc_train.to_deployment(name=DEPLOYMENT, parameters={"params": TrainParams(data_dir=data_dir).model_dump(mode="json")}),
        copc_sweep.to_deployment(name=DEPLOYMENT, parameters={"params": SweepParams(data_dir=data_dir).model_dump(mode="json")}),
        copc_report.to_deployment(name=DEPLOYMENT, parameters={"params": ReportParams(data_dir=data_dir).model_dump(mode="json")}),
    ]
