"""Synthetic trial records in the shape `infra.tracking.read_sweeps` returns (for report tests)."""

from __future__ import annotations

import math


def trial(
    run_id: str,
    tp: float,
    ta: float,
    k: int,
    seed: int,
    objective: float | None,
    method: str = "copc",
    collapsed: bool = False,
    collapse_step: int | None = None,
    run_name: str | None = None,
    history: dict | None = None,
    step_s: float = 1.0,
    rollout_s: float = 0.6,
    train_s: float = 0.4,
    sweep: str = "synthetic",
    fail_reason: str | None = None,
    steps: int = 50,
) -> dict:
    params = {
        "method.name": method,
        "method.tau_policy": str(tp),
        "method.tau_advantage": str(ta),
        "train.staleness": str(k),
        "train.seed": str(seed),
        "train.steps": str(steps),
    }
    tags = {
        "copc_kind": "trial",
        "copc_sweep": sweep,
        "method": method,
        "runtime": "inprocess",
        "collapse_reason": "accuracy" if collapsed else "None",
    }
    metrics = {}
    if objective is not None:
        final = objective + (0.5 if collapsed else 0.0)
        metrics = {
            "summary/objective": objective,
            "summary/final_accuracy": final,
            "summary/peak_accuracy": final + 0.1,
            "summary/auc_accuracy": final - 0.05,
            "summary/warm_start_accuracy": 0.3,
            "summary/collapsed": float(collapsed),
            "summary/ess_drop_count": 0.0,
            "summary/grad_spike_count": 1.0,
            "summary/mean_step_s": step_s,
            "summary/mean_rollout_s": rollout_s,
            "summary/mean_train_s": train_s,
            "summary/staleness_mean": float(k),
            "summary/staleness_max": float(k),
        }
        if collapse_step is not None:
            metrics["summary/collapse_step"] = float(collapse_step)
    if fail_reason:
        tags["fail_reason"] = fail_reason
    return {
        "run_id": run_id,
        "run_name": run_name
        or " ".join([method, *(f"{n}={v:g}" for n, v in (("tp", tp), ("ta", ta)) if v is not None)])
        + f" k={k} s={seed}",
        "status": "FINISHED" if objective is not None else "FAILED",
        "sweep": sweep,
        "params": params,
        "tags": tags,
        "metrics": metrics,
        "history": history or {},
    }


def grid_records(
    value,
    tps=(1.5, 2.0, 4.0),
    tas=(1.0, 2.0, 4.0),
    ks=(0, 4),
    seeds=(0, 1, 2),
    noise=(-0.01, 0.0, 0.01),
    method: str = "copc",
    history=None,
) -> list[dict]:
    """One trial per grid point; objective = value(i, a, k) + noise[seed index], i/a the level indices.

    The noise offsets sum to zero, so each cell's seed mean is exactly value(i, a, k).
    """
    out = []
    for k in ks:
        for i, tp in enumerate(tps):
            for a, ta in enumerate(tas):
                for s, seed in enumerate(seeds):
                    rid = f"{method}-{k}-{i}-{a}-{s}"
                    out.append(
                        trial(
                            rid,
                            tp,
                            ta,
                            k,
                            seed,
                            value(i, a, k) + noise[s],
                            method=method,
                            history=history(i, a, k, s) if history else None,
                        )
                    )
    return out


def curve(steps, values):
    return [(int(s), float(v)) for s, v in zip(steps, values)]


INF = math.inf
