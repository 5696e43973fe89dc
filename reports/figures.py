"""Plotly figures: pure functions of the report frames (no I/O, no global state).

Text that came from users (run names) is HTML-escaped before it reaches a figure, because plotly
renders a subset of HTML in labels and hover text.
"""

from __future__ import annotations

import html
import itertools
import math
from collections.abc import Callable, Collection
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import hex_to_rgb, qualitative
from plotly.subplots import make_subplots

from reports.analysis import MethodRuns, improvement_matrices, method_label

DIAGNOSTICS = [
    ("correction/ess", "ESS (token)"),
    ("correction/masked_frac", "masked fraction"),
    ("correction/trace_clip_frac", "trace-clip fraction"),
    ("actor/grad_norm", "grad norm"),
    ("policy/kl_step", "KL(π_v ‖ π_v+1) per token"),
    ("critic/explained_var", "critic explained variance"),
    ("staleness/mean", "realised staleness"),
]
_PALETTE = qualitative.Plotly + qualitative.D3 + qualitative.Dark24 + qualitative.Light24  # 68: a regime grid's cells
_READING_COLOURS = ["#ff7f0e", "#d62728", "#8c564b", "#e377c2", "#bcbd22"]  # warm, as the IQM plot's orange readings
_OTHER_COLOURS = qualitative.Pastel + qualitative.Set3  # 23 pale colours for the baselines beside them


def _lag_panels(ks: list) -> go.Figure:
    """One row of panels, one per lag k, titled `k = …`, sharing the y-axis."""
    return make_subplots(rows=1, cols=max(1, len(ks)), subplot_titles=[f"k = {k}" for k in ks], shared_yaxes=True)


def tau(x: float) -> str:
    return "∞" if math.isinf(x) else f"{x:g}"


def _colors(cells: list[tuple]) -> dict[tuple, str]:
    return {c: _PALETTE[i % len(_PALETTE)] for i, c in enumerate(sorted(set(cells)))}


def band_text(tp: float, ta: float, has: tuple[bool, bool], sep: str = " ") -> str:
    """A cell's bands as text, `τp=∞ τa=2`: a band the method has is written even at ∞ (no mask, no clip);
    one it lacks (its column reads ∞ too) is left out."""
    return sep.join(f"{n}={tau(v)}" for n, v, h in (("τp", tp, has[0]), ("τa", ta, has[1])) if h)


def run_cell(r: Any) -> tuple[str, float, float, bool, bool]:
    """A run's (method, τ_p, τ_a) cell and the bands its method has: its colour and legend entry in the figures
    across staleness panels."""
    return (r.method, r.tau_policy, r.tau_advantage, r.has_tau_policy, r.has_tau_advantage)


def cell_name(cell: tuple[str, float, float, bool, bool]) -> str:
    method, tp, ta, *has = cell
    return html.escape(f"{method} {band_text(tp, ta, tuple(has))}".strip())


def tau_grid(
    g: pd.DataFrame, value: Callable[[Any], float], label: Callable[[Any], str]
) -> tuple[list[float], list[float], np.ndarray, list[list[str]]]:
    """(τ_p values, τ_a values, z[τ_p, τ_a], text[τ_p][τ_a]) of one panel's rows; empty cells stay NaN / ""."""
    tps, tas = sorted(g["tau_policy"].unique()), sorted(g["tau_advantage"].unique())
    z = np.full((len(tps), len(tas)), np.nan)
    text = [["" for _ in tas] for _ in tps]
    for r in g.itertuples():
        i, j = tps.index(r.tau_policy), tas.index(r.tau_advantage)
        z[i, j], text[i][j] = value(r), label(r)
    return tps, tas, z, text


OBJECTIVE_RANGE = (-1.0, 1.0)  # accuracy in [0, 1] minus a collapse penalty in [0, 1]: one pinned scale
MIN_SPAN = 0.2  # the interaction plot's y-axis and the heatmaps' colours span at least this: a 0.004 gap looks small


def colour_range(cells: pd.DataFrame) -> tuple[float, float]:
    """The heatmaps' default colour range, one for all of a report's heatmaps: the seed means of its drawn cells whose
    runs did not all collapse, widened about their middle to at least MIN_SPAN (a grid at 0.64–0.71 shows its
    structure, a 0.004 gap does not fill the scale) and kept inside the objective's range. A wholly collapsed cell
    lies below it and takes the lowest colour; where every cell collapsed, the pinned range: a collapsed grid never
    looks good, whatever the penalty."""
    healthy = cells.loc[cells["collapse_rate"] < 1.0, "mean"].dropna().clip(*OBJECTIVE_RANGE)
    if healthy.empty:
        return OBJECTIVE_RANGE
    lo, hi = float(healthy.min()), float(healthy.max())
    pad = max(MIN_SPAN - (hi - lo), 0.0) / 2
    lo, hi = lo - pad, hi + pad
    shift = max(OBJECTIVE_RANGE[0] - lo, 0.0) - max(hi - OBJECTIVE_RANGE[1], 0.0)
    return max(lo + shift, OBJECTIVE_RANGE[0]), min(hi + shift, OBJECTIVE_RANGE[1])


def _colour_buttons(zrange: tuple[float, float]) -> list[dict]:
    """Two buttons over a heatmap figure: the report's colour range (the default) or the pinned −1..1."""
    return [
        {
            "type": "buttons",
            "direction": "right",
            "x": 0.0,
            "xanchor": "left",
            "y": 1.12,
            "yanchor": "bottom",
            "buttons": [
                {
                    "label": f"colour: this report's cells ({zrange[0]:.2f} to {zrange[1]:.2f})",
                    "method": "restyle",
                    "args": [{"zmin": zrange[0], "zmax": zrange[1]}],
                },
                {
                    "label": "colour: the whole objective (−1 to 1)",
                    "method": "restyle",
                    "args": [{"zmin": OBJECTIVE_RANGE[0], "zmax": OBJECTIVE_RANGE[1]}],
                },
            ],
        }
    ]


def heatmaps(cells: pd.DataFrame, method: str, zrange: tuple[float, float] = OBJECTIVE_RANGE) -> go.Figure:
    """One heatmap per staleness level: seed-mean objective over (τ_p rows, τ_a columns), annotated
    with mean ± sd, the number of seeds and the collapsed runs. Colour over `zrange` (`colour_range` of the
    report's drawn cells), with buttons for it and for the objective's whole range; the best cell of each panel is
    outlined (every tied cell), and a panel whose runs all collapsed says so."""
    mine = cells[cells["method"] == method]
    ks = sorted(mine["staleness"].unique())
    titles = []
    for k in ks:
        g = mine[mine["staleness"] == k]
        titles.append(f"k = {k}" + (" (all collapsed)" if (g["collapse_rate"] >= 1.0).all() else ""))
    fig = make_subplots(rows=1, cols=len(ks), subplot_titles=titles, horizontal_spacing=0.08)
    for col, k in enumerate(ks, start=1):
        g = mine[mine["staleness"] == k]
        tps, tas, z, text = tau_grid(
            g,
            lambda r: r.mean,
            lambda r: (
                f"{r.mean:.2f}"
                + ("" if math.isnan(r.sd) else f" ± {r.sd:.2f}")
                + f"<br>n={r.n}"
                + (
                    f"<br>✕ {round(r.collapse_rate * r.n)}/{r.n} collapsed"
                    f" [{r.collapse_low:.0%}, {r.collapse_high:.0%}]"
                    if r.collapse_rate > 0
                    else ""
                )
            ),
        )
        fig.add_trace(
            go.Heatmap(
                z=z,
                x=[tau(v) for v in tas],
                y=[tau(v) for v in tps],
                text=text,
                texttemplate="%{text}",
                zmin=zrange[0],
                zmax=zrange[1],
                colorscale="RdYlGn",
                showscale=col == len(ks),
                colorbar={"title": "objective"},
                hovertemplate="τ_p=%{y} τ_a=%{x}<br>%{text}<extra></extra>",
                name=f"k={k}",
            ),
            row=1,
            col=col,
        )
        best = np.nanmax(z)
        for i, j in zip(*np.where(np.isclose(z, best, atol=1e-9))):
            fig.add_shape(
                type="rect",
                x0=j - 0.5,
                x1=j + 0.5,
                y0=i - 0.5,
                y1=i + 0.5,
                line={"color": "black", "width": 3},
                row=1,
                col=col,
            )
        fig.update_xaxes(title_text="τ_a", type="category", row=1, col=col)
        fig.update_yaxes(title_text="τ_p", type="category", row=1, col=col)
    fig.update_layout(
        title={  # at the top, the colour buttons below it
            "text": f"{html.escape(method)}: seed-mean objective over (τ_p, τ_a); outlined: best at each k (ties all)",
            "y": 0.98,
            "yanchor": "top",
        },
        height=440,
        margin={"t": 120},
        updatemenus=_colour_buttons(zrange),
    )
    return fig


def span_at_least(cells: pd.DataFrame, span: float) -> list[float]:
    """A y-range over the cells' means and intervals, widened about its middle to at least `span` (plotly's own
    range fits the data, so a 0.004 difference filled the plot beside a heatmap that showed it flat)."""
    values = pd.concat([cells["mean"], cells["ci_low"], cells["ci_high"]]).dropna()
    lo, hi = float(values.min()), float(values.max())
    pad = max(span - (hi - lo), 0.0) / 2 + 0.02 * max(hi - lo, span)
    return [lo - pad, hi + pad]


def interaction_lines(cells: pd.DataFrame, method: str) -> go.Figure:
    """Objective against τ_p, one line per τ_a, per staleness level, with the t 95 % interval
    of the seed mean: non-parallel (crossing) lines are the coupling."""
    mine = cells[cells["method"] == method]
    ks = sorted(mine["staleness"].unique())
    fig = _lag_panels(ks)
    tas_all = sorted(mine["tau_advantage"].unique())
    colors = {ta: _PALETTE[i % len(_PALETTE)] for i, ta in enumerate(tas_all)}
    for col, k in enumerate(ks, start=1):
        g = mine[mine["staleness"] == k]
        for ta in sorted(g["tau_advantage"].unique()):
            line = g[g["tau_advantage"] == ta].sort_values("tau_policy")
            err = {
                "type": "data",
                "symmetric": False,
                "array": (line["ci_high"] - line["mean"]).fillna(0).tolist(),
                "arrayminus": (line["mean"] - line["ci_low"]).fillna(0).tolist(),
            }
            fig.add_trace(
                go.Scatter(
                    x=[tau(v) for v in line["tau_policy"]],
                    y=line["mean"].tolist(),
                    error_y=err,
                    text=[
                        f"τ_a {tau(ta)}, τ_p {tau(r.tau_policy)}: {r.mean:.3f} "
                        + ("" if pd.isna(r.ci_low) else f"[{r.ci_low:.3f}, {r.ci_high:.3f}] ")
                        + f"over {int(r.n)} seed{'s' if int(r.n) != 1 else ''}"
                        for r in line.itertuples()
                    ],
                    hovertemplate="%{text}<extra></extra>",
                    mode="lines+markers",
                    name=f"τ_a = {tau(ta)}",
                    legendgroup=str(ta),
                    showlegend=col == 1,
                    line={"color": colors[ta]},
                ),
                row=1,
                col=col,
            )
        fig.update_xaxes(title_text="τ_p", type="category", row=1, col=col)
    fig.update_yaxes(title_text="objective", range=span_at_least(mine, MIN_SPAN), row=1, col=1)
    fig.update_layout(
        title=f"{html.escape(method)}: interaction plot (lines not parallel ⇔ τ_p's effect depends on τ_a)",
        height=380,
        margin={"t": 80},
        scattermode="group",  # each τ_a's point beside the others' at a τ_p, so no bar hides another
        scattergap=0.75,
    )
    return fig


def contrasts(coupling: pd.DataFrame) -> go.Figure:
    """Forest plot of interaction contrasts E_b − E_a with Welch t intervals; sign reversals in red."""
    fig = go.Figure()
    labels = [
        f"{html.escape(r.method)} k={r.staleness}: τp {tau(r.tau_policy_from)}→{tau(r.tau_policy_to)}, "
        f"τa {tau(r.tau_advantage_a)} vs {tau(r.tau_advantage_b)}"
        for r in coupling.itertuples()
    ]
    colors = [
        "#d62728" if r.significant_reversal else ("#ff7f0e" if r.reversal else "#1f77b4") for r in coupling.itertuples()
    ]
    err = {
        "type": "data",
        "symmetric": False,
        "array": (coupling["contrast_high"] - coupling["contrast"]).fillna(0).tolist(),
        "arrayminus": (coupling["contrast"] - coupling["contrast_low"]).fillna(0).tolist(),
    }
    hover = [
        f"E_a={r.effect_a:+.3f} E_b={r.effect_b:+.3f} contrast={r.contrast:+.3f} "
        f"[{r.contrast_low:+.3f}, {r.contrast_high:+.3f}] n≥{r.n_min}"
        for r in coupling.itertuples()
    ]
    fig.add_trace(
        go.Scatter(
            x=coupling["contrast"].tolist(),
            y=labels,
            mode="markers",
            error_x=err,
            marker={"color": colors, "size": 9},
            text=hover,
            hovertemplate="%{y}<br>%{text}<extra></extra>",
            name="contrast",
        )
    )
    fig.add_vline(x=0.0, line_dash="dot", line_color="grey")
    fig.update_layout(
        title="Interaction contrasts (red: significant sign reversal of τ_p's effect; orange: point-estimate reversal)",
        xaxis_title="E(τ_a = b) − E(τ_a = a), effect of τ_p from → to",
        height=max(300, 24 * len(labels) + 140),
        margin={"l": 360, "t": 70},
    )
    return fig


def region_bars(region: pd.DataFrame) -> go.Figure:
    fig = go.Figure()
    for method, g in region.groupby("method", sort=True):
        fig.add_trace(
            go.Bar(
                x=[f"k={k}" for k in g["staleness"]],
                y=g["fraction"].tolist(),
                name=html.escape(method),
                text=[f"{a}/{b}" for a, b in zip(g["n_within"], g["n_cells"])],
                textposition="outside",
            )
        )
    fig.update_layout(
        title="High-performing region: fraction of the (τ_p, τ_a) grid within 90 % of the best cell",
        yaxis={"title": "fraction of cells", "range": [0, 1.1]},
        barmode="group",
        height=360,
    )
    return fig


def method_curves(
    picks: dict[tuple[str, int], MethodRuns], curves: pd.DataFrame, metric: str = "eval/accuracy"
) -> go.Figure:
    """Held-out accuracy per method over training: the mean over its runs evaluated at each step, and the band from its
    lowest run to its highest (shown at first for up to three methods; a button shows or hides it), one panel per lag
    k, a colour per method; a method swept over a grid by its selection-free picks (`analysis.method_finals`)."""
    ks = sorted({k for _, k in picks})
    methods = sorted({m for m, _ in picks})
    fig = _lag_panels(ks)
    colors = _colors([(m,) for m in methods])
    spread = len(methods) <= 3
    data = curves[curves["metric"] == metric]
    shown: set[str] = set()
    for (method, k), (_, n_cells, run_ids) in picks.items():
        table = data[data["run_id"].isin(run_ids)].pivot_table(index="step", columns="run_id", values="value")
        if table.empty:
            continue
        name, group = html.escape(method_label(method, n_cells)), html.escape(method)
        steps, color, col = table.index.tolist(), colors[(method,)], ks.index(k) + 1
        low, high, mean, count = table.min(axis=1), table.max(axis=1), table.mean(axis=1), table.count(axis=1)
        band = {
            "mode": "lines",
            "line": {"width": 0},
            "legendgroup": group,
            "showlegend": False,
            "hoverinfo": "skip",
            "visible": spread,
            "meta": "spread",
        }
        fill = "rgba({}, {}, {}, 0.15)".format(*hex_to_rgb(color))
        fig.add_trace(go.Scatter(x=steps, y=high.tolist(), **band), row=1, col=col)
        fig.add_trace(go.Scatter(x=steps, y=low.tolist(), fill="tonexty", fillcolor=fill, **band), row=1, col=col)
        fig.add_trace(
            go.Scatter(
                x=steps,
                y=mean.tolist(),
                mode="lines",
                name=name,
                legendgroup=group,
                showlegend=name not in shown,
                line={"color": color, "width": 2},
                customdata=np.stack([low, high, count], axis=1).tolist(),
                hovertemplate=f"{name}<br>step %{{x}}: mean %{{y:.3f}} of %{{customdata[2]}} runs "
                "(lowest %{customdata[0]:.3f}, highest %{customdata[1]:.3f})<extra></extra>",
            ),
            row=1,
            col=col,
        )
        shown.add(name)
    for col in range(1, len(ks) + 1):
        fig.update_xaxes(title_text="learner step", row=1, col=col)
    fig.update_yaxes(title_text="held-out accuracy", range=[0, 1.02], row=1, col=1)
    is_spread = [tr.meta == "spread" for tr in fig.data]
    buttons = [
        {"label": "means", "method": "restyle", "args": [{"visible": [not b for b in is_spread]}]},
        {"label": "means and spread", "method": "restyle", "args": [{"visible": [True] * len(is_spread)}]},
    ]
    fig.update_layout(
        title="Held-out accuracy per method: the mean of its runs (and the band from its lowest run to its highest)",
        height=460,
        margin={"t": 110},
        updatemenus=[
            {"type": "buttons", "direction": "right", "x": 0, "xanchor": "left", "y": 1.2, "active": int(spread)}
            | {"buttons": buttons}
        ],
    )
    return fig


def learning_curves(
    runs: pd.DataFrame, curves: pd.DataFrame, metric: str = "eval/accuracy", train_metric: str = "reward/mean"
) -> go.Figure:
    """Held-out accuracy per run over training (lines with markers at the evaluations), the training
    reward of every step beside it (dotted, same colour), one panel per staleness level, ✕ at the
    collapse step. The dotted line shows rise-and-fall episodes shorter than the evaluation interval."""
    ks = sorted(runs["staleness"].unique())
    fig = _lag_panels(ks)
    colors = _colors([run_cell(r) for r in runs.itertuples()])
    data = curves[curves["metric"] == metric]
    train = curves[curves["metric"] == train_metric]
    shown: set[tuple] = set()
    for col, k in enumerate(ks, start=1):
        for r in runs[runs["staleness"] == k].itertuples():
            pts = data[data["run_id"] == r.run_id].sort_values("step")
            if pts.empty:
                continue
            cell = run_cell(r)
            group, name = cell_name(cell), html.escape(r.run_name)
            color = colors[cell]
            fig.add_trace(
                go.Scatter(
                    x=pts["step"].tolist(),
                    y=pts["value"].tolist(),
                    mode="lines+markers",
                    name=group,
                    legendgroup=group,
                    showlegend=cell not in shown,
                    line={"color": color, "width": 1.5},
                    marker={"size": 4},
                    hovertemplate=f"{name}<br>held-out, step %{{x}}: %{{y:.3f}}<extra></extra>",
                ),
                row=1,
                col=col,
            )
            shown.add(cell)
            steps = train[train["run_id"] == r.run_id].sort_values("step")
            if not steps.empty:
                fig.add_trace(
                    go.Scatter(
                        x=steps["step"].tolist(),
                        y=steps["value"].tolist(),
                        mode="lines",
                        name=f"{name} (training reward)",
                        legendgroup=group,
                        showlegend=False,
                        line={"color": color, "width": 1, "dash": "dot"},
                        hovertemplate=f"{name}<br>training reward, step %{{x}}: %{{y:.3f}}<extra></extra>",
                    ),
                    row=1,
                    col=col,
                )
            if r.collapsed and not math.isnan(r.collapse_step):
                at = pts.iloc[(pts["step"] - r.collapse_step).abs().argmin()]
                fig.add_trace(
                    go.Scatter(
                        x=[int(at["step"])],
                        y=[float(at["value"])],
                        mode="markers",
                        showlegend=False,
                        legendgroup=group,
                        marker={"symbol": "x", "size": 11, "color": "#d62728"},
                        hovertemplate=f"{name}<br>collapsed at step {int(r.collapse_step)} "
                        f"({html.escape(r.collapse_reason)})<extra></extra>",
                    ),
                    row=1,
                    col=col,
                )
        fig.update_xaxes(title_text="learner step", row=1, col=col)
    fig.update_yaxes(title_text="held-out accuracy · training reward (dotted)", range=[0, 1.02], row=1, col=1)
    fig.update_layout(
        title="Learning curves: held-out accuracy (solid), training reward of every step (dotted); "
        "✕ = collapse; one colour and legend entry per cell (click to hide its runs)",
        height=460,
        margin={"t": 80},
        legend={"title": {"text": "cell (all seeds, every k panel)"}},
    )
    return fig


def diagnostics(runs: pd.DataFrame, curves: pd.DataFrame) -> go.Figure:
    """ESS, masked fraction, trace-clip fraction, grad norm and realised staleness over training
    (rows), per staleness level (columns), one line per run."""
    ks = sorted(runs["staleness"].unique())
    titles = [f"{label}, k = {k}" for label, _ in [(lab, key) for key, lab in DIAGNOSTICS] for k in ks]
    fig = make_subplots(rows=len(DIAGNOSTICS), cols=len(ks), subplot_titles=titles, vertical_spacing=0.06)
    colors = _colors([run_cell(r) for r in runs.itertuples()])
    shown: set[tuple] = set()
    for row, (metric, label) in enumerate(DIAGNOSTICS, start=1):
        data = curves[curves["metric"] == metric]
        for col, k in enumerate(ks, start=1):
            for r in runs[runs["staleness"] == k].itertuples():
                pts = data[data["run_id"] == r.run_id].sort_values("step")
                if pts.empty:
                    continue
                cell = run_cell(r)
                group, name = cell_name(cell), html.escape(r.run_name)
                fig.add_trace(
                    go.Scatter(
                        x=pts["step"].tolist(),
                        y=pts["value"].tolist(),
                        mode="lines",
                        name=group,
                        legendgroup=group,
                        showlegend=cell not in shown,
                        line={"color": colors[cell], "width": 1},
                        hovertemplate=f"{name}<br>{label} at step %{{x}}: %{{y:.3g}}<extra></extra>",
                    ),
                    row=row,
                    col=col,
                )
                shown.add(cell)
            fig.update_xaxes(title_text="learner step", row=row, col=col)
        fig.update_yaxes(title_text=label, row=row, col=1)
    fig.update_layout(
        title="Off-policy diagnostics over training: one row per diagnostic, one column per staleness "
        "level, one colour per cell (legend; click to hide)",
        height=260 * len(DIAGNOSTICS),
        margin={"t": 80},
        legend={"title": {"text": "cell"}},
    )
    return fig


def step_time_bars(times: pd.DataFrame) -> go.Figure:
    """Mean rollout / learner / whole-step seconds per (method, k, runtime), ± sd over its runs."""
    labels = [f"{html.escape(r.method)} k={r.staleness}<br>{html.escape(r.runtime)}" for r in times.itertuples()]
    fig = go.Figure()
    for column, name in (("rollout_s", "rollout"), ("train_s", "learner"), ("step_s", "whole step")):
        sd = times[f"{column}_sd"].fillna(0).tolist()  # over the runs (seeds, cells) of the bar; none for one run
        fig.add_trace(go.Bar(x=labels, y=times[column].tolist(), name=name, error_y={"type": "data", "array": sd}))
    fig.update_layout(
        title="Step-time breakdown (mean seconds per learner step)", barmode="group", yaxis_title="seconds", height=380
    )
    return fig


def parallel_coordinates(runs: pd.DataFrame) -> go.Figure:
    """One line per scored run, objective first, then the axes it ran at and what it reached; coloured
    by objective on the report's pinned scale. A band of ∞ (no clipping, or a method without the band)
    sits at the top of its axis."""
    runs = runs[runs["scored"]]
    methods = sorted(runs["method"].unique())

    def band(column: str, label: str) -> dict:
        finite = sorted({float(v) for v in runs[column] if not math.isinf(v)})
        top = (finite[-1] if finite else 1.0) * 1.5
        return {
            "label": label,
            "values": [top if math.isinf(v) else v for v in runs[column]],
            "tickvals": [*finite, top],
            "ticktext": [*[tau(t) for t in finite], "∞"],
        }

    dims = [
        {"label": "objective", "values": runs["objective"], "range": list(OBJECTIVE_RANGE)},
        {
            "label": "method",
            "values": [methods.index(m) for m in runs["method"]],
            "tickvals": list(range(len(methods))),
            "ticktext": methods,
        },
        band("tau_policy", "τ_p"),
        band("tau_advantage", "τ_a"),
        {"label": "staleness k", "values": runs["staleness"]},
        {"label": "seed", "values": runs["seed"]},
        {"label": "final accuracy", "values": runs["final_accuracy"], "range": [0.0, 1.0]},
        {"label": "collapsed", "values": runs["collapsed"].astype(int), "tickvals": [0, 1], "ticktext": ["no", "yes"]},
    ]
    fig = go.Figure(
        go.Parcoords(
            line={
                "color": runs["objective"],
                "colorscale": "RdYlGn",
                "cmin": OBJECTIVE_RANGE[0],
                "cmax": OBJECTIVE_RANGE[1],
                "showscale": True,
                "colorbar": {"title": "objective"},
            },
            dimensions=dims,
        )
    )
    fig.update_layout(title=f"{len(runs)} scored runs, objective first (drag along an axis to filter)", height=480)
    return fig


def survival_curves(surv: pd.DataFrame) -> go.Figure:
    """Kaplan–Meier curves (analysis.survival): the share of each method's runs not yet collapsed against the learner
    step, one panel per lag k, one line per method (COPC's readings thicker); hover gives the interval and the runs
    still at risk."""
    ks = sorted(surv["staleness"].unique())
    fig = _lag_panels(ks)
    colors = _colors([(m,) for m in surv["method"]])
    for col, k in enumerate(ks, start=1):
        for method, g in surv[surv["staleness"] == k].groupby("method", sort=True):
            name = html.escape(method)
            fig.add_trace(
                go.Scatter(
                    x=g["step"].tolist(),
                    y=g["surviving"].tolist(),
                    mode="lines+markers",
                    line={"shape": "hv", "color": colors[(method,)], "width": 3 if method.startswith("copc") else 1.5},
                    marker={"size": 5},
                    name=name,
                    legendgroup=name,
                    showlegend=col == 1,
                    customdata=np.column_stack([g["low"], g["high"], g["at_risk"]]),
                    hovertemplate=f"{name}<br>step %{{x}}: %{{y:.2f}} not collapsed "
                    "[%{customdata[0]:.2f}, %{customdata[1]:.2f}], %{customdata[2]} runs at risk<extra></extra>",
                ),
                row=1,
                col=col,
            )
        fig.update_xaxes(title_text="learner step", row=1, col=col)
    fig.update_yaxes(title_text="share of runs not yet collapsed", range=[-0.02, 1.05], row=1, col=1)
    fig.update_layout(title="Survival: runs not yet collapsed (Kaplan–Meier)", height=440, margin={"t": 80})
    return fig


def performance_profiles(picks: dict[tuple[str, int], MethodRuns], readings: Collection[str] = ()) -> go.Figure:
    """Performance profiles (rliable's): the share of a method's runs whose final held-out accuracy is above τ, against
    τ, one panel per lag k, one line per method in a colour of its own, the two-channel `readings` thicker; a method
    swept over a grid is drawn from its selection-free picks (`reports.analysis.method_finals`), named so."""
    ks = sorted({k for _, k in picks})
    fig = _lag_panels(ks)
    taus = np.linspace(0.0, 1.0, 201)
    methods = sorted({m for m, _ in picks})
    strong, pale = itertools.cycle(_READING_COLOURS), itertools.cycle(_OTHER_COLOURS)  # readings warm, the rest pale
    colors = {m: next(strong) if m in readings else next(pale) for m in methods}
    shown: set[str] = set()
    for (method, k), (x, n_cells, _) in picks.items():
        name = html.escape(method_label(method, n_cells))
        above = (x[None, :] > taus[:, None]).sum(axis=1)
        fig.add_trace(
            go.Scatter(
                x=taus.tolist(),
                y=(above / len(x)).tolist(),
                customdata=above.tolist(),
                mode="lines",
                line={"shape": "hv", "color": colors[method], "width": 3.5 if method in readings else 1.5},
                name=name,
                legendgroup=html.escape(method),
                showlegend=name not in shown,
                hovertemplate=f"{name}<br>%{{customdata}} of {len(x)} runs above %{{x:.2f}}<extra></extra>",
            ),
            row=1,
            col=ks.index(k) + 1,
        )
        shown.add(name)
    for col, k in enumerate(ks, start=1):
        every = np.concatenate([m.finals for (_, at), m in picks.items() if at == k])
        span = [max(0.0, every.min() - 0.05), min(1.0, every.max() + 0.05)]  # where this lag's runs end, not space
        fig.update_xaxes(title_text="final held-out accuracy τ", range=span, row=1, col=col)
    fig.update_yaxes(title_text="share of runs above τ", range=[-0.02, 1.05], row=1, col=1)
    fig.update_layout(
        title="Performance profiles: the share of runs above each accuracy (thick: two-channel readings)",
        height=500 + 24 * math.ceil(len(methods) / 4),  # the legend whole under the panels, not scrolled beside
        legend={"orientation": "h", "yanchor": "top", "y": -0.18, "xanchor": "left", "x": 0},
        margin={"t": 80},
    )
    return fig


def iqm_intervals(agg: pd.DataFrame, readings: Collection[str]) -> go.Figure:
    """rliable's interval-estimate plot: each method's IQM of final held-out accuracy with its 95 % interval, one panel
    per lag k, methods in the order of their IQM in that panel (best on top), the two-channel readings in orange and
    the other methods in blue. `agg` is `reports.analysis.aggregates`' frame."""
    ks = sorted(agg["staleness"].unique())
    # each panel its own order, best on top: an order shared across lags ranks a method run at the easy lag only
    # above those averaged over a hard one
    fig = make_subplots(rows=1, cols=max(1, len(ks)), subplot_titles=[f"k = {k}" for k in ks], horizontal_spacing=0.2)
    for col, k in enumerate(ks, start=1):
        at = agg[(agg["staleness"] == k) & agg["iqm"].notna()].sort_values(["iqm", "method"], ascending=[True, False])
        at = at.set_index("method")  # plotly draws the first at the bottom: ties alphabetical from the top
        hover = [
            f"{html.escape(method_label(m, int(r.n_cells)))}<br>IQM {r.iqm:.3f} "
            + ("(no interval)" if pd.isna(r.low) or pd.isna(r.high) else f"[{r.low:.3f}, {r.high:.3f}]")
            + f", {int(r.n)} run{'s' if int(r.n) != 1 else ''}"
            for m, r in zip(at.index, at.itertuples())
        ]
        fig.add_trace(
            go.Scatter(
                x=at["iqm"].tolist(),
                y=[html.escape(m) for m in at.index],
                mode="markers",
                marker={"size": 9, "color": ["#ff7f0e" if m in readings else "#1f77b4" for m in at.index]},
                error_x={
                    "type": "data",
                    "symmetric": False,
                    "array": (at["high"] - at["iqm"]).fillna(0).tolist(),
                    "arrayminus": (at["iqm"] - at["low"]).fillna(0).tolist(),
                },
                text=hover,
                hovertemplate="%{text}<extra></extra>",
                name=f"k = {k}",
                showlegend=False,
            ),
            row=1,
            col=col,
        )
        fig.update_xaxes(title_text="IQM of final held-out accuracy [95 % CI]", row=1, col=col)
        fig.update_yaxes(categoryorder="array", categoryarray=[html.escape(m) for m in at.index], row=1, col=col)
    fig.update_layout(
        title="IQM per method (orange: two-channel readings; blue: the other methods)",
        height=max(320, 22 * agg.groupby("staleness").size().max() + 160),
        margin={"l": 200, "t": 80},
    )
    return fig


def improvement_heatmaps(improve: pd.DataFrame) -> go.Figure:
    """P(a run of the reading ends above a run of the baseline) as a matrix per lag k, a reading a row (top down, as the
    tables list them) and a baseline a column: blue above ½, red below, white at ½ (a coin flip), each cell's text the
    estimate and its 95 % interval. `improve` is `reports.analysis.improvement_table`'s frame."""
    matrices = improvement_matrices(improve)
    panels = [22 + 48 * len(p.index) for p, _, _ in matrices.values()]  # px: a row of cells a reading
    # px under a panel: its baselines' names, slanted, and the next panel's title
    gap = 40 + 5 * max(len(b) for p, _, _ in matrices.values() for b in p.columns)
    plot = sum(panels) + gap * (len(panels) - 1)
    fig = make_subplots(
        rows=len(matrices),
        cols=1,
        subplot_titles=[f"k = {k}" for k in matrices],
        row_heights=panels,
        vertical_spacing=gap / plot,
    )
    for row, (k, (p, low, high)) in enumerate(matrices.items(), start=1):
        text = [[_improvement_cell(p.at[m, b], low.at[m, b], high.at[m, b], True) for b in p.columns] for m in p.index]
        hover = [
            [_improvement_cell(p.at[m, b], low.at[m, b], high.at[m, b], False) for b in p.columns] for m in p.index
        ]
        fig.add_trace(
            go.Heatmap(
                z=p.to_numpy().tolist(),
                x=[html.escape(b) for b in p.columns],
                y=[html.escape(m) for m in p.index],
                text=text,
                customdata=hover,
                texttemplate="%{text}",
                textfont={"size": 10},
                colorscale="RdBu",
                zmin=0.0,
                zmax=1.0,
                zmid=0.5,
                showscale=row == 1,
                colorbar={"title": "P(above)", "len": 0.5, "y": 1.0, "yanchor": "top"},
                hovertemplate="%{y} above %{x}: %{customdata}<extra></extra>",
                name=f"k = {k}",
            ),
            row=row,
            col=1,
        )
        fig.update_yaxes(autorange="reversed", row=row, col=1)
    fig.update_layout(
        title="Probability of improvement: a run of the reading (row) ends above a run of the baseline (column)",
        height=plot + 90 + gap,
        margin={"l": 170, "t": 90, "b": gap},
    )
    return fig


def _improvement_cell(value: float, low: float, high: float, in_cell: bool) -> str:
    """A probability of improvement and its interval: in the cell on two lines, bold where the interval leaves ½ out;
    in the hover on one."""
    if pd.isna(value):
        return ""
    if pd.isna(low) or pd.isna(high):
        return f"{value:.2f}"
    if not in_cell:
        return f"{value:.2f} [{low:.2f}, {high:.2f}]"
    shown = f"<b>{value:.2f}</b>" if low > 0.5 or high < 0.5 else f"{value:.2f}"
    return f"{shown}<br>[{low:.2f}, {high:.2f}]"
