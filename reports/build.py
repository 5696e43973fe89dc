"""Build a sweep report from MLflow: read runs → frames → analysis and figures → one HTML file.

The report reads MLflow only (never a training process), writes the file atomically, and attaches
it to each sweep's parent run as the artifact `report/<file name>`.
"""

from __future__ import annotations

import os
import pathlib

from infra.tracking import Tracker, mlflow_ui_for, read_sweeps, sweep_url
from reports.frames import HISTORY_KEYS, curves_frame, runs_frame
from reports.html import ReportData, render


def write_plotly_beside(page: pathlib.Path) -> pathlib.Path:
    """plotly.js once per folder of reports (written when missing or of another plotly version)."""
    from plotly.offline import get_plotlyjs

    from reports.html import PLOTLY_FILE

    path = page.parent / PLOTLY_FILE
    text = get_plotlyjs()
    if not path.exists() or path.stat().st_size != len(text.encode("utf-8")):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    return path


def _plans(found: dict) -> list[dict]:
    """Every sweep's plan versions, each with the number of its sweep's runs that ran under it."""
    out = []
    for parent in found["parents"]:
        runs = [t for t in found["trials"] if t["sweep"] == parent["sweep"]]
        for plan in parent["plans"]:
            under = sum(t["tags"].get("plan_version") == str(plan["version"]) for t in runs)
            out.append({"sweep": parent["sweep"], **plan, "runs": under})
    return out


def build_report(
    tracking_uri: str,
    sweeps: list[str],
    out: pathlib.Path,
    mlflow_ui: str | None = None,
    baseline: str = "async_ppo",
    log_artifact: bool = True,
) -> pathlib.Path:
    if not sweeps:
        raise ValueError("name at least one sweep")
    found = read_sweeps(tracking_uri, sweeps, HISTORY_KEYS)
    ui = mlflow_ui_for(tracking_uri, mlflow_ui)
    runs = runs_frame(found["trials"], found["experiment_id"], ui)
    data = ReportData(
        title=f"COPC sweep report: {', '.join(sweeps)}",
        runs=runs,
        curves=curves_frame(found["trials"]),
        sources={"MLflow": tracking_uri} | ({} if ui == tracking_uri else {"run links": ui}),
        parent_links=[
            (
                p["sweep"],
                sweep_url(ui, found["experiment_id"], p["sweep"]),
                sweep_url(ui, found["experiment_id"], p["sweep"], True),
            )
            for p in found["parents"]
        ],
        baseline=baseline,
        plans=_plans(found),
    )
    out = pathlib.Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    plotly = write_plotly_beside(out)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(render(data, plotly.name), encoding="utf-8")
    os.replace(tmp, out)
    if log_artifact:
        tracker = Tracker(tracking_uri)
        for name in sweeps:  # the links above open these views (a sweep of an older copc has none yet)
            tracker.sweep_view(name)
        for parent in found["parents"]:
            tracker.log_report(parent["run_id"], out)
            tracker.log_report(parent["run_id"], plotly)  # the report opens from MLflow's artifact store too
    return out
