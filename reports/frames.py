"""Tidy pandas frames from trial records (the plain data `infra.tracking.read_sweeps` returns).

`runs_frame`: one row per trial run (schema `RUNS`); `curves_frame`: one row per (run, metric,
step) (schema `CURVES`). Both are validated against reports/schema.py. A bounded-staleness run
(`train.eta` set) reads as method "<name> (bounded η)" with η in the staleness column.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import pandas as pd

from infra.tracking import run_url
from reports import schema

# per-step metrics the report plots (learner/trainer keys, docs/ALGORITHMS.md §5)
HISTORY_KEYS = [
    "eval/accuracy",
    "reward/mean",
    "correction/ess",
    "correction/masked_frac",
    "correction/trace_clip_frac",
    "actor/grad_norm",
    "policy/kl_step",
    "critic/explained_var",
    "staleness/mean",
    "time/step_s",
    "time/rollout_s",
    "time/train_s",
]

_SUMMARY = [
    "objective",
    "final_accuracy",
    "peak_accuracy",
    "auc_accuracy",
    "warm_start_accuracy",
    "collapse_step",
    "collapse_step_train",
    "ess_drop_count",
    "grad_spike_count",
    "mean_step_s",
    "mean_rollout_s",
    "mean_train_s",
    "staleness_mean",
    "staleness_max",
    "staleness_updates_mean",
    "kl_step_mean",
    "critic_explained_var_first",
    "critic_warmup_explained_var",
    "ratio_in_band_mean",
    "log_ratio_p01_mean",
    "log_ratio_p99_mean",
]


def _float(text: str | None) -> float:
    try:
        return float(text) if text is not None else math.nan
    except ValueError:
        return math.nan


def _band(text: str | None) -> float:
    """A band as logged: "None" (the method has no such band) reads as ∞ (no mask / no clip), so that the
    cell keys of every method are numbers."""
    return math.inf if text == "None" else _float(text)


def _int(text: str | None) -> int:
    value = _float(text)
    return int(value) if math.isfinite(value) else -1


def _first_warning(tags: dict[str, str]) -> float:
    steps = []
    for key in ("ess_drop_steps", "grad_norm_spike_steps"):
        try:
            steps += [float(v) for v in json.loads(tags.get(key, "[]"))]
        except (ValueError, TypeError):  # a list cut short by the tag limit: its first steps still parse below
            steps += [float(v) for v in re.findall(r"\d+", tags.get(key, ""))[:1]]
    return min(steps, default=math.nan)


def runs_frame(trials: list[dict[str, Any]], experiment_id: str, mlflow_ui: str) -> pd.DataFrame:
    """One row per trial run that ended (FINISHED, or FAILED with its reason); a run still RUNNING (its
    process died while logging it) is left out, and of several finished runs of one config (one point
    trained twice) the first is kept."""
    rows, seen = [], set()
    for t in trials:
        if t["status"] not in ("FINISHED", "FAILED"):
            continue
        config_hash = t["tags"].get("config_hash")
        if config_hash and t["status"] == "FINISHED":
            key = (config_hash, t["tags"].get("method"))  # a relabelled run of the same config is another point
            if key in seen:
                continue
            seen.add(key)
        p, m, tags = t["params"], t["metrics"], t["tags"]
        objective = m.get("summary/objective", math.nan)
        method = tags.get("method") or p.get("method.name", "?")  # the method's key in its sweep (a reading too)
        bounded = p.get("train.eta", "None") != "None"  # the staleness level is the bound η, not a lag k
        rows.append(
            {
                "run_id": t["run_id"],
                "run_name": t["run_name"],
                "sweep": t["sweep"],
                "status": t["status"],
                "method": f"{method} (bounded η)" if bounded else method,
                "runtime": tags.get("runtime", "?"),
                # the bands in effect, as logged (older runs: the config's, which may be None for a method's default)
                **{
                    column: _band(tags.get(column, p.get(f"method.{column}")))
                    for column in ("tau_policy", "tau_advantage")
                },
                **{
                    f"has_{column}": tags.get(column, p.get(f"method.{column}")) not in (None, "None")
                    for column in ("tau_policy", "tau_advantage")
                },
                "staleness": _int(p.get("train.eta" if bounded else "train.staleness")),
                "seed": _int(p.get("train.seed")),
                "steps": _int(p.get("train.steps")),
                "scored": bool(math.isfinite(objective)),
                "collapsed": bool(m.get("summary/collapsed", 0.0) > 0.5),
                "collapse_reason": tags.get("collapse_reason", "None") if "summary/collapsed" in m else "not run",
                "fail_reason": tags.get("fail_reason", ""),
                "first_warning_step": _first_warning(tags),
                "url": run_url(mlflow_ui, experiment_id, t["run_id"]),
                **{k: float(m.get(f"summary/{k}", math.nan)) for k in _SUMMARY},
            }
        )
    if not rows:
        return schema.empty(schema.RUNS)
    frame = pd.DataFrame(rows).astype({"staleness": "int64", "seed": "int64", "steps": "int64"})
    frame = frame.sort_values(["sweep", "method", "staleness", "tau_policy", "tau_advantage", "seed"], kind="stable")
    return schema.validate(frame.reset_index(drop=True), schema.RUNS, "runs")


def curves_frame(trials: list[dict[str, Any]]) -> pd.DataFrame:
    rows = [
        {"run_id": t["run_id"], "metric": key, "step": int(step), "value": float(value)}
        for t in trials
        for key, points in t["history"].items()
        for step, value in points
    ]
    if not rows:
        return schema.empty(schema.CURVES)
    return schema.validate(pd.DataFrame(rows).astype({"step": "int64"}), schema.CURVES, "curves")
