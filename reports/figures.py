"""Plotly figures: pure functions of the report frames (no I/O, no global state).

Text that came from users (run names) is HTML-escaped before it reaches a figure, because plotly
renders a subset of HTML in labels and hover text.
"""

from __future__ import annotations

import html
import math
from typing import Any, Callable

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

DIAGNOSTICS = [("correction/ess", "ESS (token)"), ("correction/masked_frac", "masked fraction"),
               ("correction/trace_clip_frac", "trace-clip fraction"), ("actor/grad_norm", "grad norm"),
               ("policy/kl_step", "KL(π_v ‖ π_v+1) per token"), ("critic/explained_var", "critic explained variance"),
               ("staleness/mean", "realised staleness")]
_PALETTE = qualitative.Plotly + qualitative.D3


def tau(x: float) -> str:
    return "∞" if math.isinf(x) else f"{x:g}"


def _cell_label(tp: float, ta: float) -> str:
    return f"τp={tau(tp)} τa={tau(ta)}"


def _colors(cells: list[tuple[float, float]]) -> dict[tuple[float, float], str]:
    return {c: _PALETTE[i % len(_PALETTE)] for i, c in enumerate(sorted(set(cells)))}


def tau_grid(g: pd.DataFrame, value: Callable[[Any], float], label: Callable[[Any], str]
             ) -> tuple[list[float], list[float], np.ndarray, list[list[str]]]:
    """(τ_p values, τ_a values, z[τ_p, τ_a], text[τ_p][τ_a]) of one panel's rows; empty cells stay NaN / ""."""
    tps, tas = sorted(g["tau_policy"].unique()), sorted(g["tau_advantage"].unique())
    z = np.full((len(tps), len(tas)), np.nan)
    text = [["" for _ in tas] for _ in tps]
    for r in g.itertuples():
        i, j = tps.index(r.tau_policy), tas.index(r.tau_advantage)
        z[i, j], text[i][j] = value(r), label(r)
    return tps, tas, z, text


def heatmaps(cells: pd.DataFrame, method: str) -> go.Figure:
    """One heatmap per staleness level: seed-mean objective over (τ_p rows, τ_a columns), annotated
    with mean ± sd and the number of seeds; one colour scale for all panels."""
    mine = cells[cells["method"] == method]
    ks = sorted(mine["staleness"].unique())
    fig = make_subplots(rows=1, cols=len(ks), subplot_titles=[f"k = {k}" for k in ks], horizontal_spacing=0.08)
    zmin, zmax = float(mine["mean"].min()), float(mine["mean"].max())
    for col, k in enumerate(ks, start=1):
        g = mine[mine["staleness"] == k]
        tps, tas, z, text = tau_grid(g, lambda r: r.mean, lambda r: f"{r.mean:.2f}"
                                     + ("" if math.isnan(r.sd) else f" ± {r.sd:.2f}") + f"<br>n={r.n}")
        fig.add_trace(go.Heatmap(z=z, x=[tau(v) for v in tas], y=[tau(v) for v in tps], text=text,
                                 texttemplate="%{text}", zmin=zmin, zmax=zmax, colorscale="Viridis",
                                 showscale=col == len(ks), colorbar={"title": "objective"},
                                 hovertemplate="τ_p=%{y} τ_a=%{x}<br>%{text}<extra></extra>", name=f"k={k}"),
                      row=1, col=col)
        fig.update_xaxes(title_text="τ_a", type="category", row=1, col=col)
        fig.update_yaxes(title_text="τ_p", type="category", row=1, col=col)
    fig.update_layout(title=f"{html.escape(method)}: objective over (τ_p, τ_a) per staleness level (seed mean ± sd)",
                      height=380, margin={"t": 80})
    return fig


def interaction_lines(cells: pd.DataFrame, method: str) -> go.Figure:
    """Objective against τ_p, one line per τ_a, per staleness level, with the bootstrap 95 % interval
    of the seed mean: non-parallel (crossing) lines are the coupling."""
    mine = cells[cells["method"] == method]
    ks = sorted(mine["staleness"].unique())
    fig = make_subplots(rows=1, cols=len(ks), subplot_titles=[f"k = {k}" for k in ks], shared_yaxes=True)
    tas_all = sorted(mine["tau_advantage"].unique())
    colors = {ta: _PALETTE[i % len(_PALETTE)] for i, ta in enumerate(tas_all)}
    for col, k in enumerate(ks, start=1):
        g = mine[mine["staleness"] == k]
        for ta in sorted(g["tau_advantage"].unique()):
            line = g[g["tau_advantage"] == ta].sort_values("tau_policy")
            err = {"type": "data", "symmetric": False, "array": (line["ci_high"] - line["mean"]).fillna(0).tolist(),
                   "arrayminus": (line["mean"] - line["ci_low"]).fillna(0).tolist()}
            fig.add_trace(go.Scatter(x=[tau(v) for v in line["tau_policy"]], y=line["mean"].tolist(), error_y=err,
                                     mode="lines+markers", name=f"τ_a = {tau(ta)}", legendgroup=str(ta),
                                     showlegend=col == 1, line={"color": colors[ta]}), row=1, col=col)
        fig.update_xaxes(title_text="τ_p", type="category", row=1, col=col)
    fig.update_yaxes(title_text="objective", row=1, col=1)
    fig.update_layout(title=f"{html.escape(method)}: interaction plot (lines cross ⇔ τ_p's effect depends on τ_a)",
                      height=380, margin={"t": 80})
    return fig


def contrasts(coupling: pd.DataFrame) -> go.Figure:
    """Forest plot of interaction contrasts E_b − E_a with bootstrap intervals; sign reversals in red."""
    fig = go.Figure()
    labels = [f"{html.escape(r.method)} k={r.staleness}: τp {tau(r.tau_policy_from)}→{tau(r.tau_policy_to)}, "
              f"τa {tau(r.tau_advantage_a)} vs {tau(r.tau_advantage_b)}" for r in coupling.itertuples()]
    colors = ["#d62728" if r.significant_reversal else ("#ff7f0e" if r.reversal else "#1f77b4")
              for r in coupling.itertuples()]
    err = {"type": "data", "symmetric": False, "array": (coupling["contrast_high"] - coupling["contrast"]).fillna(0).tolist(),
           "arrayminus": (coupling["contrast"] - coupling["contrast_low"]).fillna(0).tolist()}
    hover = [f"E_a={r.effect_a:+.3f} E_b={r.effect_b:+.3f} contrast={r.contrast:+.3f} "
             f"[{r.contrast_low:+.3f}, {r.contrast_high:+.3f}] n≥{r.n_min}" for r in coupling.itertuples()]
    fig.add_trace(go.Scatter(x=coupling["contrast"].tolist(), y=labels, mode="markers", error_x=err,
                             marker={"color": colors, "size": 9}, text=hover, hovertemplate="%{y}<br>%{text}<extra></extra>",
                             name="contrast"))
    fig.add_vline(x=0.0, line_dash="dot", line_color="grey")
    fig.update_layout(title="Interaction contrasts (red: significant sign reversal of τ_p's effect; orange: point-estimate reversal)",
                      xaxis_title="E(τ_a = b) − E(τ_a = a), effect of τ_p from → to", height=max(300, 24 * len(labels) + 140),
                      margin={"l": 360, "t": 70})
    return fig


def region_bars(region: pd.DataFrame) -> go.Figure:
    fig = go.Figure()
    for method, g in region.groupby("method", sort=True):
        fig.add_trace(go.Bar(x=[f"k={k}" for k in g["staleness"]], y=g["fraction"].tolist(), name=html.escape(method),
                             text=[f"{a}/{b}" for a, b in zip(g["n_within"], g["n_cells"])], textposition="outside"))
    fig.update_layout(title="High-performing region: fraction of the (τ_p, τ_a) grid within 90 % of the best cell",
                      yaxis={"title": "fraction of cells", "range": [0, 1.1]}, barmode="group", height=360)
    return fig


def learning_curves(runs: pd.DataFrame, curves: pd.DataFrame, metric: str = "eval/accuracy",
                    train_metric: str = "reward/mean") -> go.Figure:
    """Held-out accuracy per run over training (lines with markers at the evaluations), the training
    reward of every step beside it (dotted, same colour), one panel per staleness level, ✕ at the
    collapse step. The dotted line shows rise-and-fall episodes shorter than the evaluation interval."""
    ks = sorted(runs["staleness"].unique())
    fig = make_subplots(rows=1, cols=len(ks), subplot_titles=[f"k = {k}" for k in ks], shared_yaxes=True)
    colors = _colors(list(zip(runs["tau_policy"], runs["tau_advantage"])))
    data = curves[curves["metric"] == metric]
    train = curves[curves["metric"] == train_metric]
    for col, k in enumerate(ks, start=1):
        for r in runs[runs["staleness"] == k].itertuples():
            pts = data[data["run_id"] == r.run_id].sort_values("step")
            if pts.empty:
                continue
            name = html.escape(r.run_name)
            color = colors[(r.tau_policy, r.tau_advantage)]
            fig.add_trace(go.Scatter(x=pts["step"].tolist(), y=pts["value"].tolist(), mode="lines+markers", name=name,
                                     legendgroup=name, line={"color": color, "width": 1.5}, marker={"size": 4},
                                     hovertemplate=f"{name}<br>held-out, step %{{x}}: %{{y:.3f}}<extra></extra>"),
                          row=1, col=col)
            steps = train[train["run_id"] == r.run_id].sort_values("step")
            if not steps.empty:
                fig.add_trace(go.Scatter(x=steps["step"].tolist(), y=steps["value"].tolist(), mode="lines",
                                         name=f"{name} (training reward)", legendgroup=name, showlegend=False,
                                         line={"color": color, "width": 1, "dash": "dot"},
                                         hovertemplate=f"{name}<br>training reward, step %{{x}}: %{{y:.3f}}"
                                                       "<extra></extra>"), row=1, col=col)
            if r.collapsed and not math.isnan(r.collapse_step):
                at = pts.iloc[(pts["step"] - r.collapse_step).abs().argmin()]
                fig.add_trace(go.Scatter(x=[int(at["step"])], y=[float(at["value"])], mode="markers", showlegend=False,
                                         legendgroup=name, marker={"symbol": "x", "size": 11, "color": "#d62728"},
                                         hovertemplate=f"{name}<br>collapsed at step {int(r.collapse_step)} "
                                                       f"({html.escape(r.collapse_reason)})<extra></extra>"),
                              row=1, col=col)
        fig.update_xaxes(title_text="learner step", row=1, col=col)
    fig.update_yaxes(title_text="held-out accuracy · training reward (dotted)", range=[0, 1.02], row=1, col=1)
    fig.update_layout(title="Learning curves: held-out accuracy (solid), training reward of every step (dotted); "
                            "✕ = collapse", height=420, margin={"t": 80})
    return fig


def diagnostics(runs: pd.DataFrame, curves: pd.DataFrame) -> go.Figure:
    """ESS, masked fraction, trace-clip fraction, grad norm and realised staleness over training
    (rows), per staleness level (columns), one line per run."""
    ks = sorted(runs["staleness"].unique())
    titles = [f"{label}, k = {k}" for label, _ in [(lab, key) for key, lab in DIAGNOSTICS] for k in ks]
    fig = make_subplots(rows=len(DIAGNOSTICS), cols=len(ks), subplot_titles=titles, vertical_spacing=0.06)
    colors = _colors(list(zip(runs["tau_policy"], runs["tau_advantage"])))
    for row, (metric, label) in enumerate(DIAGNOSTICS, start=1):
        data = curves[curves["metric"] == metric]
        for col, k in enumerate(ks, start=1):
            for r in runs[runs["staleness"] == k].itertuples():
                pts = data[data["run_id"] == r.run_id].sort_values("step")
                if pts.empty:
                    continue
                name = html.escape(r.run_name)
                fig.add_trace(go.Scatter(x=pts["step"].tolist(), y=pts["value"].tolist(), mode="lines", name=name,
                                         legendgroup=name, showlegend=False,
                                         line={"color": colors[(r.tau_policy, r.tau_advantage)], "width": 1},
                                         hovertemplate=f"{name}<br>{label} at step %{{x}}: %{{y:.3g}}<extra></extra>"),
                              row=row, col=col)
    fig.update_layout(title="Off-policy diagnostics over training (colour = (τ_p, τ_a) cell)",
                      height=230 * len(DIAGNOSTICS), margin={"t": 80})
    return fig


def step_time_bars(times: pd.DataFrame) -> go.Figure:
    """Mean rollout / learner / whole-step seconds per (method, k, runtime)."""
    labels = [f"{html.escape(r.method)} k={r.staleness}<br>{html.escape(r.runtime)}" for r in times.itertuples()]
    fig = go.Figure()
    for column, name in (("rollout_s", "rollout"), ("train_s", "learner"), ("step_s", "whole step")):
        fig.add_trace(go.Bar(x=labels, y=times[column].tolist(), name=name))
    fig.update_layout(title="Step-time breakdown (mean seconds per learner step)", barmode="group",
                      yaxis_title="seconds", height=380)
    return fig
