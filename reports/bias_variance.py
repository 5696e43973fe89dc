"""The exact bias/variance section: heatmaps of ‖bias‖, variance and MSE over (τ_p, τ_a) per
staleness level, with the best τ_p for each τ_a marked, and whether that optimum moves with τ_a.

Input: the plain records of `copc_core.analysis.token_mdp.grid` (this module imports no torch).
"""

from __future__ import annotations

import html
import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from reports.figures import _PALETTE, tau, tau_grid
from reports.html import figure_div, num, page, table
from reports.schema import BIAS_VARIANCE, OPTIMA, SchemaError, validate

METRICS = [
    ("bias_norm", "‖bias‖ = ‖E_μ[ĝ] − g*‖"),
    ("variance", "variance tr Cov_μ(ĝ)"),
    ("mse", "MSE of a batch mean = ‖bias‖² + variance / B"),
]


def frame(records: list[dict]) -> pd.DataFrame:
    for i, record in enumerate(records):
        if set(record) != set(BIAS_VARIANCE):
            raise SchemaError(
                f"bias/variance record {i}: missing {sorted(set(BIAS_VARIANCE) - set(record))}, "
                f"undeclared {sorted(set(record) - set(BIAS_VARIANCE))}"
            )
    out = pd.DataFrame.from_records(records, columns=list(BIAS_VARIANCE))
    for column, kind in BIAS_VARIANCE.items():
        if kind == "float":
            out[column] = out[column].astype(float)
    return validate(out, BIAS_VARIANCE, "bias/variance")


def optima(bv: pd.DataFrame) -> pd.DataFrame:
    """For each staleness level, metric and τ_a: the τ_p that minimises the metric (ties → smaller τ_p)."""
    rows = []
    for eps, g in bv.groupby("staleness", sort=True):
        for metric, _ in METRICS:
            for ta, col in g.groupby("tau_advantage", sort=True):
                col = col.sort_values("tau_policy")
                best = col.iloc[int(np.argmin(col[metric].to_numpy()))]
                rows.append(
                    {
                        "staleness": float(eps),
                        "metric": metric,
                        "tau_advantage": float(ta),
                        "best_tau_policy": float(best.tau_policy),
                        "value": float(best[metric]),
                    }
                )
    return validate(pd.DataFrame(rows, columns=list(OPTIMA)), OPTIMA, "optima")


def moves(opt: pd.DataFrame) -> pd.DataFrame:
    """Per staleness level and metric: the distinct optimal τ_p over τ_a, and whether there is more than one."""
    rows = []
    for (eps, metric), g in opt.groupby(["staleness", "metric"], sort=True):
        best = sorted(set(g["best_tau_policy"]))
        rows.append(
            {
                "staleness": eps,
                "metric": metric,
                "optimal_tau_policy": ", ".join(tau(v) for v in best),
                "moves": len(best) > 1,
            }
        )
    return pd.DataFrame(rows, columns=["staleness", "metric", "optimal_tau_policy", "moves"])


def heatmaps(bv: pd.DataFrame, opt: pd.DataFrame, metric: str, label: str) -> go.Figure:
    """One panel per staleness level (τ_p rows, τ_a columns), one colour scale (log10) for all panels;
    ○ marks the best τ_p in each τ_a column, ★ the best cell of the panel."""
    levels = sorted(bv["staleness"].unique())
    fig = make_subplots(
        rows=1, cols=len(levels), subplot_titles=[f"ε = {e:g}" for e in levels], horizontal_spacing=0.07
    )
    positive = bv[metric][bv[metric] > 0]
    floor = float(positive.min()) if len(positive) else 1e-300
    logz = np.log10(bv[metric].clip(lower=floor).to_numpy())
    zmin, zmax = float(logz.min()), float(logz.max())
    for col, eps in enumerate(levels, start=1):
        g = bv[bv["staleness"] == eps]
        tps, tas, z, text = tau_grid(
            g, lambda r: math.log10(max(getattr(r, metric), floor)), lambda r: f"{getattr(r, metric):.3g}"
        )
        fig.add_trace(
            go.Heatmap(
                z=z,
                x=[tau(v) for v in tas],
                y=[tau(v) for v in tps],
                text=text,
                texttemplate="%{text}",
                zmin=zmin,
                zmax=zmax,
                colorscale="Viridis",
                showscale=col == len(levels),
                colorbar={"title": f"log10 {metric}"},
                hovertemplate="τ_p=%{y} τ_a=%{x}<br>" + metric + " = %{text}<extra></extra>",
                name=f"ε={eps:g}",
            ),
            row=1,
            col=col,
        )
        mine = opt[(opt["staleness"] == eps) & (opt["metric"] == metric)].sort_values("tau_advantage")
        fig.add_trace(
            go.Scatter(
                x=[tau(v) for v in mine["tau_advantage"]],
                y=[tau(v) for v in mine["best_tau_policy"]],
                mode="markers+lines",
                name="best τ_p per τ_a",
                showlegend=col == 1,
                legendgroup="opt",
                marker={"symbol": "circle-open", "size": 16, "color": "#ff2d2d", "line": {"width": 3}},
                line={"color": "#ff2d2d", "dash": "dot", "width": 1},
                hovertemplate="τ_a=%{x}: best τ_p=%{y}<extra></extra>",
            ),
            row=1,
            col=col,
        )
        best = g.iloc[int(np.argmin(g[metric].to_numpy()))]
        fig.add_trace(
            go.Scatter(
                x=[tau(best.tau_advantage)],
                y=[tau(best.tau_policy)],
                mode="markers",
                name="best cell",
                showlegend=col == 1,
                legendgroup="best",
                marker={"symbol": "star", "size": 14, "color": "white", "line": {"color": "black", "width": 1}},
                hovertemplate=f"best cell: {best[metric]:.3g}<extra></extra>",
            ),
            row=1,
            col=col,
        )
        for update, title, values in ((fig.update_xaxes, "τ_a", tas), (fig.update_yaxes, "τ_p", tps)):
            update(
                title_text=title,
                type="category",
                categoryorder="array",
                categoryarray=[tau(v) for v in values],
                row=1,
                col=col,
            )
    fig.update_layout(
        title=f"{html.escape(label)} over (τ_p, τ_a) per staleness ε (○ best τ_p per τ_a, ★ best cell)",
        height=420,
        margin={"t": 90},
        showlegend=False,
    )  # the title explains the markers
    return fig


def optimum_lines(opt: pd.DataFrame) -> go.Figure:
    """The best τ_p as a function of τ_a, one line per staleness level, one panel per metric: a flat
    line means the two bands can be tuned separately."""
    fig = make_subplots(rows=1, cols=len(METRICS), subplot_titles=[m for m, _ in METRICS], shared_yaxes=True)
    levels = sorted(opt["staleness"].unique())
    order_a = [tau(v) for v in sorted(opt["tau_advantage"].unique())]
    order_p = [tau(v) for v in sorted(opt["best_tau_policy"].unique())]
    for col, (metric, _) in enumerate(METRICS, start=1):
        for i, eps in enumerate(levels):
            g = opt[(opt["metric"] == metric) & (opt["staleness"] == eps)].sort_values("tau_advantage")
            fig.add_trace(
                go.Scatter(
                    x=[tau(v) for v in g["tau_advantage"]],
                    y=[tau(v) for v in g["best_tau_policy"]],
                    mode="lines+markers",
                    name=f"ε = {eps:g}",
                    legendgroup=str(eps),
                    showlegend=col == 1,
                    line={"color": _PALETTE[i % len(_PALETTE)]},
                ),
                row=1,
                col=col,
            )
        fig.update_xaxes(
            title_text="τ_a", type="category", categoryorder="array", categoryarray=order_a, row=1, col=col
        )
    fig.update_yaxes(title_text="best τ_p", type="category", categoryorder="array", categoryarray=order_p, row=1, col=1)
    fig.update_layout(
        title="Does the best τ_p move with τ_a? (one line per staleness level)", height=380, margin={"t": 80}
    )
    return fig


def render(records: list[dict], spec: dict, title: str = "COPC exact bias/variance analysis") -> str:
    """The whole HTML page of one analysis grid; `spec` (the AnalysisSpec as a dict) is shown verbatim."""
    bv = frame(records)
    opt = optima(bv)
    moved = moves(opt)
    esc = html.escape
    parts = [
        f"<h1>{esc(title)}</h1>",
        '<p class="note">Exact expectations by enumerating every trajectory of a token-level MDP (softmax '
        "policy per prefix, terminal reward); behavior policy μ = softmax(θ + ε·D), critic V̂ = V^π + σ·ξ. "
        "The update is the learner's first actor step (its own correction, estimator and loss functions); "
        "bias = E_μ[ĝ] − g* = advantage term + policy-weight term + cross term (ALGORITHMS.md §2). "
        "Not modelled: advantage whitening.</p>",
        '<p class="note">' + "; ".join(f"{esc(str(k))} = <code>{esc(str(v))}</code>" for k, v in spec.items()) + "</p>",
        "<h2>Does the optimum of τ_p move with τ_a?</h2>",
        table(
            moved,
            [
                ("staleness", "ε", None),
                ("metric", "metric", lambda r: esc(r["metric"])),
                ("optimal_tau_policy", "best τ_p over the τ_a values", lambda r: esc(r["optimal_tau_policy"])),
                ("moves", "moves with τ_a", lambda r: '<b class="bad">yes</b>' if r["moves"] else "no"),
            ],
            "optimum-moves",
        ),
        figure_div(
            optimum_lines(opt),
            "optimum-lines",
            "One panel per metric, one line per perturbation size ε: the τ_p that minimises the metric at each τ_a. "
            "A flat line: the best τ_p does not depend on τ_a; a sloped one: the two bands must be tuned together.",
        ),
    ]
    for metric, label in METRICS:
        parts += [
            f"<h2>{esc(label)}</h2>",
            figure_div(
                heatmaps(bv, opt, metric, label),
                f"bv-{metric}",
                f"Each square is the exact {esc(label)} at one (τ_p, τ_a), one panel per ε, on one log10 colour scale "
                "for all panels; ○ marks the best τ_p in each τ_a column, ★ the best cell of the panel.",
            ),
        ]
    parts += [
        "<h2>All points</h2>",
        table(
            bv,
            [
                ("staleness", "ε", None),
                ("tau_policy", "τ_p", None),
                ("tau_advantage", "τ_a", None),
                *[
                    (c, c, lambda r, c=c: num(r[c], 5))
                    for c in (
                        "bias_norm",
                        "policy_term",
                        "advantage_term",
                        "cross_term",
                        "variance",
                        "amplification",
                        "mse",
                    )
                ],
            ],
            "points",
        ),
    ]
    return page(title, parts)
