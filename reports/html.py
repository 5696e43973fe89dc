"""One self-contained HTML report: plotly.js inlined once, every user-given string escaped."""

from __future__ import annotations

import datetime
import html
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from reports import analysis, figures
from reports.claims import claim_tables, has_claims, improvement_text, interval_text
from reports.figures import tau
from reports.plan import mark_sections, plan_section

_STYLE = """
*,*::before,*::after{box-sizing:border-box}
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:24px auto;max-width:1400px;color:#222;
padding:0 16px}
.table-wrap{overflow-x:auto;max-width:100%}.caption{color:#444;font-size:0.9em;max-width:1000px;margin:2px 0 16px}
.missing{color:#b00;border:1px dashed #b00;padding:12px}#runs td:first-child{white-space:nowrap}
h1{font-size:1.6em}h2{margin-top:2em;border-bottom:1px solid #ddd;padding-bottom:4px}
table{border-collapse:collapse;margin:8px 0;font-size:0.9em}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f4f4f4}td.l,th.l{text-align:left}.note{color:#555;font-size:0.9em;max-width:1000px}
.bad{color:#b00}.good{color:#070}.figure{margin:12px 0}
.planned,.exploratory{font-size:0.6em;vertical-align:middle;padding:1px 6px;border-radius:3px;font-weight:normal}
.planned{background:#e3f2e3;color:#174d17}.exploratory{background:#f3ead9;color:#6b4a10}
pre.plan{background:#f8f8f8;border:1px solid #ddd;padding:8px;white-space:pre-wrap;max-width:1000px}
"""


@dataclass
class ReportData:
    """What a report shows; every frame follows its schema in reports/schema.py."""

    title: str
    runs: pd.DataFrame
    curves: pd.DataFrame
    sources: dict[str, str] = field(default_factory=dict)  # label → text shown in the header
    parent_links: list[tuple[str, str, str]] = field(default_factory=list)  # (sweep, MLflow runs URL, charts URL)
    baseline: str = "async_ppo"
    n_boot: int = analysis.N_BOOT
    # every sweep's plan versions: {sweep, version, sha256, at, runs_before, text, runs}
    plans: list[dict] = field(default_factory=list)


def num(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, float):
        return tau(value) if math.isinf(value) else f"{value:.{digits}f}"
    return html.escape(str(value))


def table(frame: pd.DataFrame, columns: list[tuple[str, str, Callable[[Any], str] | None]], table_id: str) -> str:
    """columns: (frame column, header, formatter returning HTML; None = escaped number/text)."""
    head = "".join(
        f'<th class="l">{html.escape(h)}</th>' if i == 0 else f"<th>{html.escape(h)}</th>"
        for i, (_, h, _) in enumerate(columns)
    )
    body = []
    for row in frame.to_dict("records"):
        cells = []
        for i, (col, _, fmt) in enumerate(columns):
            text = fmt(row) if fmt else num(row[col])
            left = i == 0 or (fmt is not None and frame[col].dtype.kind not in "fiu")  # numbers align right
            cells.append(f'<td class="l">{text}</td>' if left else f"<td>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    if not body:
        body = [f'<tr><td class="l" colspan="{len(columns)}">none</td></tr>']
    return (
        f'<div class="table-wrap"><table id="{table_id}" class="sortable"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def figure_div(fig: go.Figure, div_id: str, caption: str) -> str:
    """A figure and, under it, one sentence (HTML, written here, not user text) on how to read it."""
    return (
        '<div class="figure">'
        + fig.to_html(
            full_html=False, include_plotlyjs=False, div_id=div_id, config={"displaylogo": False, "responsive": True}
        )
        + f'<p class="caption">{caption}</p></div>'
    )


def _link(url: str, text: str) -> str:
    return f'<a href="{html.escape(url, quote=True)}">{html.escape(text)}</a>'


def best_cells(cells: pd.DataFrame, bands: dict[str, tuple[bool, bool]]) -> str:
    """The best cell(s) of some cells by seed-mean objective: every tied cell named, with the bands its method has
    (`bands`: analysis.method_bands)."""
    if cells.empty:
        return "—"
    return analysis.best_with_ties(
        [
            (
                f"{r.method} {figures.band_text(r.tau_policy, r.tau_advantage, bands[r.method])}".strip(),
                float(r.mean),
            )
            for r in cells.itertuples()
        ]
    )


def _best_per_level(cells: pd.DataFrame, bands: dict[str, tuple[bool, bool]]) -> pd.DataFrame:
    rows = [
        {"staleness": k, "best": best_cells(g, bands), "all_collapsed": bool((g["collapse_rate"] >= 1.0).all())}
        for k, g in cells.groupby("staleness", sort=True)
    ]
    return pd.DataFrame(rows, columns=["staleness", "best", "all_collapsed"])


def _summary(runs: pd.DataFrame, t: _Tables) -> pd.DataFrame:
    rows = []
    for (method, k), g in runs.groupby(["method", "staleness"], sort=True):
        scored = g[g["scored"]]
        reg, mine, itr, cpl, nul = (
            f[(f["method"] == method) & (f["staleness"] == k)] for f in (t.region, t.cells, t.inter, t.coupling, t.null)
        )
        rows.append(
            {
                "method": method,
                "staleness": k,
                "runs": len(g),
                "failed": int((~g["scored"]).sum()),
                "collapsed": int(scored["collapsed"].sum()),
                "best": best_cells(mine, analysis.method_bands(runs)),
                "region": f"{reg.iloc[0].n_within}/{reg.iloc[0].n_cells}" if len(reg) else "—",
                "interaction": (
                    f"{itr.iloc[0].fraction:.2f} "
                    f"[{num(itr.iloc[0].fraction_low, 2)}, {num(itr.iloc[0].fraction_high, 2)}]"
                    if len(itr)
                    else "—"
                ),
                "null": f"{nul.iloc[0].p_value:.3f} ({nul.iloc[0].null_median:.2f})" if len(nul) else "—",
                "reversals": f"{int(cpl['reversal'].sum())} of {len(cpl)} 2×2 sub-grids "
                f"({int(cpl['significant_reversal'].sum())} significant)"
                if len(cpl)
                else "—",
                "seeds": int(scored.groupby(["tau_policy", "tau_advantage"])["seed"].nunique().min())
                if len(scored)
                else 0,
            }
        )
    return pd.DataFrame(rows)


HOW_TO_READ = {  # one sentence under each figure
    "method_curves": "Each line is one method at one lag k, the mean held-out accuracy of its runs evaluated at each "
    'step (the hover gives how many); "means and spread" shades each from its lowest run to its highest (shown at '
    "first for up to three methods). A method swept over a grid is drawn from its selection-free picks (on each seed, "
    "its runs at the cell with the best mean over the other seeds): its cells, run by run, are in the figure below.",
    "profiles": "Each line is one method at one lag k (a method swept over a grid: its selection-free picks, on each "
    "seed its runs at the cell with the best mean over the other seeds): the share of its runs whose final held-out "
    "accuracy is above the accuracy on the x-axis; the two-channel readings' lines are the thick ones. A line above "
    "another everywhere: those runs end higher at every "
    "level (stochastic dominance); lines that cross trade a better typical run for a worse tail.",
    "iqm": "Each point is one method's IQM (the mean of the middle half of its runs' final held-out accuracy) at one "
    "lag k, with its 95 % interval (none where a method has one run); in each panel the best IQM on top; in orange "
    "the two-channel readings (COPC's, and any method with both bands). The intervals are "
    "rliable's percentile bootstrap, which covers ~90 % at 5 seeds (the note below). To compare two methods, read "
    "the probability of improvement.",
    "improvement": "Each square is the chance that a run of the reading (row) ends above a run of the baseline "
    "(column), ties counted half, with its 95 % interval: blue above ½, red below, white at ½ (a coin flip); bold "
    "where the interval leaves ½ out. An interval that holds ½ does not tell the two apart; these cover 86–91 % at 5 "
    "seeds, and each reading meets every baseline here, so one bold cell among many is weak evidence (so is one "
    "paired interval in the claims section's tables against the baselines: they are not corrected for the "
    "comparisons either; only its coupling tests are, by Holm).",
    "heatmap": "Each square is one (τ_p, τ_a) cell at one lag k: its colour is the seed-mean objective, red low to "
    "green high, on one scale for every heatmap of this report: from its lowest cell to its highest among those whose "
    f"runs did not all collapse, at least {figures.MIN_SPAN:g} wide (a small gap does not span the colours); a cell "
    "whose runs all collapsed takes the lowest colour, and where every cell collapsed the scale is the objective's "
    "whole range. The second button puts every heatmap on that whole range, −1 to 1, the same for every report (a "
    "collapse costs the penalty). The text: the mean ± sd over n seeds and the runs that collapsed; the outlined "
    "square is the best cell at that k.",
    "interaction": "Each line is one τ_a: its points are the seed means at each τ_p with their 95 % t "
    "intervals (none with one seed), the lines' points set side by side at each τ_p so no bar hides another. "
    "Parallel lines mean the two bands act independently; lines that are not parallel mean τ_p's effect depends on "
    "τ_a (coupling), and the best τ_p changes with τ_a only where a line's slope changes sign. Read the bars first: "
    "gaps inside them are seed noise (the coupling table tests it). The y-axis spans at least "
    f"{figures.MIN_SPAN:g}, so a gap smaller than the seed noise does not fill the plot.",
    "contrasts": "Each row is one 2 × 2 sub-grid: how much τ_p's effect changes between two values of τ_a, with its "
    "95 % interval. An interval clear of 0 is evidence of coupling; red: τ_p's effect changes sign, significantly.",
    "region": "The share of each method's (τ_p, τ_a) cells whose seed-mean objective is within 90 % of its best cell "
    "at that k (methods with one cell at that k left out). A loose bar where the objective is high: at a best of "
    "0.70 it counts every cell at 0.63 or above — a full bar says no cell is far off, not that the bands do not "
    "matter; the heatmaps' numbers tell finer.",
    "parallel": "One line per scored run; drag along an axis to keep only the runs in that range (the same view as "
    "MLflow's parallel coordinates, with the objective as the first axis).",
    "curves": "One line per run, coloured by its cell: solid, held-out accuracy at each evaluation; dotted, the "
    "training reward of every step; ✕ where the run collapsed. Click a legend entry to hide a cell's runs; "
    "double-click it to show that cell's runs alone (double-click again for all).",
    "diagnostics": "One line per run (double-click a legend entry to show one cell's runs alone). An ESS near 1 and "
    "a small masked or clipped fraction mean the stale batches are "
    "close to on-policy (at τ_a = 1 the band is the point 1, so every ratio other than 1 is clipped: a trace-clip "
    "fraction near 1 there is by construction); spikes in the grad norm or the per-step KL warn before accuracy "
    "falls; a critic explained variance, 1 − Var(return − value) / Var(return) over a batch, below 0 is worse than "
    "predicting the mean return — where returns barely vary (accuracy near 0 or 1) a small error reads far below 0.",
    "survival": "Each line is one method at one lag: the share of its runs (all its cells and seeds) that have not "
    "collapsed by that learner step, Kaplan–Meier style — a run that never collapsed counts until it ended. Lines on "
    "top of each other at 1 are methods none of whose runs collapsed; hover for the 95 % interval: Clopper–"
    "Pearson on the effective number of runs — 5 runs without a collapse read [0.48, 1]; a seed's runs (a grid's "
    "cells share its draws) count as fewer runs as far as they collapsed together, and as one run while none has. "
    "It covers ~90–99 % of the time in python -m bench.coverage --survival-only.",
    "step-time": "Bars: seconds per learner step, averaged over the runs of each method, k and runtime; whiskers: "
    "the sd over those runs (none for a single run).",
}


@dataclass
class _Tables:
    """The analyses a report's sections read, computed once."""

    cells: pd.DataFrame
    coupling: pd.DataFrame
    inter: pd.DataFrame
    region: pd.DataFrame
    methods: pd.DataFrame
    times: pd.DataFrame
    late: pd.DataFrame
    null: pd.DataFrame  # each grid's interaction fraction against an additive grid plus its seed noise
    picks: dict[tuple[str, int], analysis.MethodRuns]  # per (method, k), the runs methods are compared by


def _grids(region: pd.DataFrame) -> pd.DataFrame:
    """The region's rows of a method with more than one cell at that k (one cell is always "within 90 %" of itself)."""
    return region[region["n_cells"] > 1]


def render(data: ReportData, plotly_src: str | None = None) -> str:
    """The report page: its sections top to bottom, each a function of the data and the analyses."""
    runs = data.runs
    cells = analysis.cell_stats(runs)
    t = _Tables(
        cells=cells,
        coupling=analysis.coupling(runs),
        inter=analysis.interaction_fraction(runs, data.n_boot),
        region=_grids(analysis.high_performing_region(cells)),
        methods=analysis.method_comparison(runs, cells),
        times=analysis.step_times(runs, data.baseline),
        late=analysis.late_stage(runs, data.curves),
        picks=analysis.method_finals(runs),
        null=analysis.additive_null(runs, data.n_boot),
    )
    sections = (
        _header,
        lambda data, t: plan_section(data.plans),
        _summary_section,
        _best_section,
        _claims_section,
        _grid_sections,
        _every_run_section,
        _methods_section,
        _curves_section,
        _late_section,
        _aggregates_section,
        _step_time_section,
        _all_runs_section,
    )
    parts = [part for section in sections for part in section(data, t)]
    return page(data.title, mark_sections(parts, data.plans), plotly_src)


def _header(data: ReportData, t: _Tables) -> list[str]:
    esc = html.escape
    parts = [
        f"<h1>{esc(data.title)}</h1>",
        f'<p class="note">generated {datetime.datetime.now().isoformat(timespec="seconds")}; '
        + "; ".join(f"{esc(k)}: <code>{esc(v)}</code>" for k, v in data.sources.items())
        + "</p>",
    ]
    if data.parent_links:
        parts.append(
            '<p class="note">runs in MLflow: '
            + ", ".join(f"{_link(runs, name)} ({_link(charts, 'charts')})" for name, runs, charts in data.parent_links)
            + "</p>"
        )
    return parts


_GRID_COLUMNS = [  # (frame column, header): a grid's summary columns, each left out where no row has one
    ("region", "cells within 90 % of best"),
    ("interaction", "interaction fraction [95 % CI]"),
    ("null", "p, additive null (noise alone gives)"),
    ("reversals", "τ_p sign reversals"),
]


def _summary_section(data: ReportData, t: _Tables) -> list[str]:
    esc = html.escape
    summary = _summary(data.runs, t)
    shown = [col for col, _ in _GRID_COLUMNS if col in summary and (summary[col] != "—").any()]
    coupling = "interaction" in shown
    return [
        "<h2>Summary</h2>",
        table(
            summary,
            [
                ("method", "method", lambda r: esc(r["method"])),
                ("staleness", "k", None),
                ("runs", "runs", None),
                ("failed", "failed", None),
                ("collapsed", "collapsed", None),
                ("seeds", "seeds per cell (min)", None),
                ("best", "best cell of the method at k: objective", lambda r: esc(r["best"])),
                *[
                    (col, head, None if col == "region" else _escaped(col))
                    for col, head in _GRID_COLUMNS
                    if col in shown
                ],
            ],
            "summary",
        ),
        '<p class="note">' + _OBJECTIVE_NOTE + (_COUPLING_NOTE if coupling else "") + _intervals_note(data, coupling),
    ]


def _escaped(col: str) -> Callable[[Any], str]:
    return lambda r: html.escape(r[col])


_OBJECTIVE_NOTE = (
    "Objective: the sweep's score (held-out accuracy, minus the collapse penalty for a collapsed run). Best cell: the "
    "highest seed mean among the method's cells, biased up by that choice among them (a selection-free pick — each "
    "seed scored at the cell chosen on the others, on final accuracy — is in the Aggregates section). "
)
_COUPLING_NOTE = (
    "Interaction fraction: share of the between-cell variation of the seed-mean objective that an additive model in "
    "τ_p and τ_a cannot explain — 0 = no coupling in the means, but seed noise alone makes it positive: p is the share "
    "of additive grids plus the grid's own seed noise that reach at least the observed fraction (their median in "
    "parentheses; uncorrected for the grids tested, on the objective — the claims' section tests final accuracy with "
    "Holm over the grids; — where a cell has under 2 seeds or the grid is flat); τ_p sign reversals count point "
    "estimates, the significant ones those where τ_p's effect at each of the two τ_a has a Welch interval excluding "
    "0, on opposite sides. "
)


def _intervals_note(data: ReportData, coupling: bool) -> str:
    return (
        "Intervals: a cell's mean, Student t over its seeds"
        + (
            "; a contrast of cells, Welch t; the interaction fraction, a percentile bootstrap over seeds "
            f"({data.n_boot} replicates, a random stream per cell)"
            if coupling
            else ""
        )
        + "; a collapse rate, exact (Clopper–Pearson). At 5 seeds the t intervals cover 93–95 % of the time"
        + (" and a bootstrap's 83–85 %" if coupling else "")
        + " (python -m bench.coverage); where runs collapse, no interval of the mean covers (read the collapse rate "
        "and the others apart). Cells with one seed have none.</p>"
    )


def _best_section(data: ReportData, t: _Tables) -> list[str]:
    if t.cells.empty:
        return []
    return [
        "<h2>Best per staleness level</h2>",
        table(
            _best_per_level(t.cells, analysis.method_bands(data.runs)),
            [
                ("staleness", "k", None),
                (
                    "best",
                    "best cell over every method: seed-mean objective (ties all named)",
                    lambda r: (
                        html.escape(r["best"])
                        + (' <b class="bad">(every run at this k collapsed)</b>' if r["all_collapsed"] else "")
                    ),
                ),
            ],
            "best-per-k",
        ),
    ]


def _claims_section(data: ReportData, t: _Tables) -> list[str]:
    if not has_claims(data.runs):
        return []
    return [
        "<h2>The paper's claims</h2>",
        markdown_html(claim_tables(data.runs, data.n_boot)),
        '<p class="note">Methods take roles by their bands in the sweep: two-channel (a grid of ≥ 2 τ_p × ≥ 2 '
        "τ_a), single-channel (one band varied), baseline (no band). Scores here are final held-out accuracy; "
        "collapse is counted apart. Intervals: Student t over seeds (paired by seed for differences); Welch t for "
        "contrasts of cells (python -m bench.coverage measures how often each covers).</p>",
    ]


def _grid_sections(data: ReportData, t: _Tables) -> list[str]:
    """The interaction heatmaps, the coupling analysis and the high-performing region."""
    if t.cells.empty:
        return ['<p class="bad">No trial finished training: nothing to plot.</p>']
    gridded = sorted(set(t.region["method"]))  # more than one cell at some lag (the long study's: one per lag)
    if not gridded:  # one heading, not three empty sections
        return [
            "<h2>Interaction heatmaps, coupling analysis, high-performing region</h2>",
            '<p class="note">None: no method was swept over more than one (τ_p, τ_a) cell.</p>',
        ]
    parts = ["<h2>Interaction heatmaps</h2>"]
    zrange = figures.colour_range(t.cells[t.cells["method"].isin(gridded)])
    for i, method in enumerate(gridded):
        parts.append(figure_div(figures.heatmaps(t.cells, method, zrange), f"heatmap-{i}", HOW_TO_READ["heatmap"]))
        parts.append(
            figure_div(figures.interaction_lines(t.cells, method), f"interaction-{i}", HOW_TO_READ["interaction"])
        )
    parts += ["<h2>Coupling analysis</h2>", *_coupling(t.coupling)]
    return parts + [
        "<h2>High-performing region</h2>",
        figure_div(figures.region_bars(t.region), "region", HOW_TO_READ["region"]),
    ]


def _coupling(coupling: pd.DataFrame) -> list[str]:
    if coupling.empty:
        return ['<p class="note">Needs at least two τ_p and two τ_a levels at one staleness level.</p>']

    def effect(name: str) -> Callable[[Any], str]:
        return lambda r: f"{r[name]:+.3f} [{num(r[name + '_low'])}, {num(r[name + '_high'])}]"

    return [
        figure_div(figures.contrasts(coupling), "contrasts", HOW_TO_READ["contrasts"]),
        table(
            coupling,
            [
                ("method", "method", lambda r: html.escape(r["method"])),
                ("staleness", "k", None),
                ("tau_policy_from", "τ_p from", None),
                ("tau_policy_to", "τ_p to", None),
                ("tau_advantage_a", "τ_a = a", None),
                ("tau_advantage_b", "τ_a = b", None),
                ("effect_a", "effect at a", effect("effect_a")),
                ("effect_b", "effect at b", effect("effect_b")),
                ("contrast", "contrast", effect("contrast")),
                (
                    "reversal",
                    "reversal",
                    lambda r: (
                        '<b class="bad">significant</b>'
                        if r["significant_reversal"]
                        else ("point estimate" if r["reversal"] else "no")
                    ),
                ),
            ],
            "coupling",
        ),
    ]


def _every_run_section(data: ReportData, t: _Tables) -> list[str]:
    if not data.runs["scored"].any():
        return []
    return [
        "<h2>Every run, objective first</h2>",
        figure_div(figures.parallel_coordinates(data.runs), "parallel", HOW_TO_READ["parallel"]),
    ]


def _methods_section(data: ReportData, t: _Tables) -> list[str]:
    has = analysis.method_bands(data.runs)

    def band(column: str, i: int) -> Callable[[Any], str]:  # a band the method lacks is no number
        return lambda r: num(r[column]) if has.get(r["method"], (True, True))[i] else "—"

    return [
        "<h2>Method comparison</h2>",
        table(
            t.methods,
            [
                ("method", "method", lambda r: html.escape(r["method"])),
                ("staleness", "k", None),
                ("n_runs", "runs", None),
                ("final_mean", "final acc (all)", None),
                ("peak_mean", "peak acc (all)", None),
                ("collapse_rate", "collapse rate (all)", None),
                ("best_tau_policy", "best τ_p", band("best_tau_policy", 0)),
                ("best_tau_advantage", "best τ_a", band("best_tau_advantage", 1)),
                ("best_final_mean", "final acc (best cell)", None),
                ("best_peak_mean", "peak acc (best cell)", None),
                ("best_collapse_rate", "collapse rate (best cell)", None),
            ],
            "methods",
        ),
    ]


def _curves_section(data: ReportData, t: _Tables) -> list[str]:
    if data.curves.empty:
        return []
    return [
        "<h2>Learning curves</h2>",
        *(
            [figure_div(figures.method_curves(t.picks, data.curves), "method-curves", HOW_TO_READ["method_curves"])]
            if t.picks
            else []
        ),
        figure_div(figures.learning_curves(data.runs, data.curves), "curves", HOW_TO_READ["curves"]),
        '<p class="note">Collapse (✕, and the "collapse" column below): held-out accuracy more than 50 % '
        "below its running peak from some evaluation to the end of the run, or a non-finite step. The same "
        'rule on the training reward of every step gives the "train collapse" column: it sees falls '
        "between two evaluations that the held-out rule cannot.</p>",
        "<h2>Stability diagnostics</h2>",
        figure_div(figures.diagnostics(data.runs, data.curves), "diagnostics", HOW_TO_READ["diagnostics"]),
    ]


def _late_section(data: ReportData, t: _Tables) -> list[str]:
    """Late training: survival against the learner step, and what each method lost from its peak and kept late."""
    if t.late.empty:
        return []

    def interval(column: str) -> Callable[[Any], str]:
        return lambda r: f"{num(r[column])} [{num(r[column + '_low'])}, {num(r[column + '_high'])}]"

    return [
        "<h2>Late in training: survival, final − peak, late-half AUC</h2>",
        figure_div(figures.survival_curves(analysis.survival(data.runs)), "survival", HOW_TO_READ["survival"]),
        table(
            t.late,
            [
                ("method", "method", lambda r: html.escape(r["method"])),
                ("staleness", "k", None),
                ("n_runs", "runs", None),
                ("n_seeds", "seeds", None),
                ("collapsed", "collapsed", None),
                ("collapse_steps", "at steps", lambda r: html.escape(r["collapse_steps"]) or "—"),
                ("final_minus_peak", "final − peak [95 % CI]", interval("final_minus_peak")),
                ("late_auc", "late-half AUC [95 % CI]", interval("late_auc")),
            ],
            "late",
        ),
        '<p class="note">final − peak: held-out accuracy at the end minus its best evaluation, seed mean (0: nothing '
        "lost). Late-half AUC: the held-out accuracy averaged over the second half of each run's steps. Intervals: "
        "Student t over seeds (scipy), one value a seed — its runs read against their cells' means, as a grid's cells "
        "share their seed — cut to what each can be ([−1, 0] and [0, 1]: a collapse's point mass would carry them "
        "past); none with one seed.</p>",
    ]


def _aggregates_section(data: ReportData, t: _Tables) -> list[str]:
    """rliable's aggregates (Agarwal et al., NeurIPS 2021) per method and lag: IQM, probability of improvement of each
    two-channel reading over each baseline, performance profiles; a grid by its selection-free picks."""
    agg = analysis.aggregates(t.picks)
    if agg.empty:
        return []
    readings, baselines = analysis.readings_and_baselines(data.runs)
    improve = analysis.improvement_table(t.picks, readings, baselines)

    return [
        "<h2>Aggregates: IQM, probability of improvement, performance profiles</h2>",
        figure_div(figures.iqm_intervals(agg, readings), "iqm", HOW_TO_READ["iqm"]),
        table(
            agg.sort_values(["staleness", "iqm"], ascending=[True, False]),  # as the figure, best first
            [
                ("method", "method", lambda r: html.escape(r["method"])),
                ("staleness", "k", None),
                ("n", "runs", None),
                (
                    "n_cells",
                    "runs from",
                    lambda r: "its cell" if r["n_cells"] == 1 else f"a grid of {r['n_cells']} cells",
                ),
                (
                    "iqm",
                    "IQM of final accuracy [95 % CI]",
                    lambda r: interval_text(r["iqm"], r["low"], r["high"], ".3f"),
                ),
            ],
            "iqm-table",
        ),
        *_improvement_matrix(improve),
        figure_div(figures.performance_profiles(t.picks, readings), "profiles", HOW_TO_READ["profiles"]),
        '<p class="note">rliable\'s definitions (Agarwal et al., 2021), computed with scipy: IQM, the mean of the '
        "middle half of a method's runs; probability of improvement, the chance that a run of the reading ends above "
        "a run of the baseline (ties count half). A method swept over a grid enters by its selection-free picks: on "
        "each seed, its runs at the cell with the best mean over the other seeds (leave-one-seed-out), so a "
        "grid's best cell is not favoured by its best-of-N; its cells are in the heatmaps. Intervals: percentile "
        "bootstrap over runs, as rliable gives them — at 5 seeds of one method's independent runs they cover ~90 % "
        "(IQM) and 86–91 % (probability of improvement) of the time for a nominal 95 % (python -m bench.coverage): "
        "read them as narrower than 95 %; a grid's picks depend on each other through the choice, which that "
        "figure does not measure. rliable itself is not a "
        "dependency: its bootstrap needs arch < 8, which does not import under pandas 3 (docs/BENCHMARKS.md).</p>",
    ]


def _improvement_matrix(improve: pd.DataFrame) -> list[str]:
    """P(a reading's run ends above a baseline's) [95 % CI]: a matrix figure, then a reading a row and a baseline a
    column, a table per k."""
    if improve.empty:
        return [
            '<p class="note">No probability of improvement: these runs hold no two-channel method beside a baseline '
            "(a method without bands) at one k.</p>"
        ]
    out = [figure_div(figures.improvement_heatmaps(improve), "improvement", HOW_TO_READ["improvement"])]
    for k, cells in improvement_text(improve).items():
        out.append(f"<h3>P(a run of the reading ends above a run of the baseline) [95 % CI], k = {k}</h3>")
        out.append(
            table(
                cells.rename_axis("method").reset_index(),
                [("method", "two-channel method", lambda r: html.escape(r["method"]))]
                + [(b, b, lambda r, b=b: r[b]) for b in cells.columns],
                f"improvement-{k}",
            )
        )
    return out


def _step_time_section(data: ReportData, t: _Tables) -> list[str]:
    esc = html.escape
    parts = [
        "<h2>Step time</h2>",
        table(
            t.times,
            [
                ("method", "method", lambda r: esc(r["method"])),
                ("staleness", "k", None),
                ("runtime", "runtime", lambda r: esc(r["runtime"])),
                ("n_runs", "runs", None),
                ("rollout_s", "rollout s", None),
                ("train_s", "learner s", None),
                ("step_s", "step s", None),
                ("speedup_vs_sync", "speed-up vs k=0", None),
                ("learner_vs_baseline", f"learner time / {data.baseline}", None),
            ],
            "step-times",
        ),
        '<p class="note">Speed-up vs k = 0 compares step times of the same method and runtime. Trials of a sweep run '
        "in-process inside one Ray task each, so their lag is simulated and does not overlap sampling with training: "
        "expect ≈ 1×. The overlapped runtime is measured by <code>python -m bench.async_speedup</code>. "
        f"The learner-time ratio is against runs of <code>{esc(data.baseline)}</code> at the same k and runtime "
        "(— where none ran). Times are wall seconds of runs that shared the machine's cores with each other (a "
        "sweep runs trials side by side): compare methods of one sweep, not figures across sweeps.</p>",
    ]
    if not t.times.empty:
        parts.append(figure_div(figures.step_time_bars(t.times), "step-time", HOW_TO_READ["step-time"]))
    return parts


def _all_runs_section(data: ReportData, t: _Tables) -> list[str]:
    esc = html.escape
    return [
        "<h2>All runs</h2>",
        table(
            data.runs,
            [
                ("run_name", "run (MLflow)", lambda r: _link(r["url"], r["run_name"] or r["run_id"])),
                ("sweep", "sweep", lambda r: esc(r["sweep"])),
                ("method", "method", lambda r: esc(r["method"])),
                ("status", "status", lambda r: esc(r["status"])),
                ("tau_policy", "τ_p", lambda r: num(r["tau_policy"]) if r["has_tau_policy"] else "—"),
                ("tau_advantage", "τ_a", lambda r: num(r["tau_advantage"]) if r["has_tau_advantage"] else "—"),
                ("staleness", "k", None),
                ("seed", "seed", None),
                ("objective", "objective", None),
                ("final_accuracy", "final", None),
                ("peak_accuracy", "peak", None),
                (
                    "collapsed",
                    "collapse",
                    lambda r: (
                        f'<span class="bad">step {num(r["collapse_step"], 0)} ({esc(r["collapse_reason"])})</span>'
                        if r["collapsed"]
                        else "—"
                    ),
                ),
                ("collapse_step_train", "train collapse", lambda r: num(r["collapse_step_train"], 0)),
                ("critic_warmup_explained_var", "critic EV after warm-up", _ev("critic_warmup_explained_var")),
                ("critic_explained_var_first", "critic EV at step 1", _ev("critic_explained_var_first")),
                (
                    "kl_step_mean",
                    "KL per step",
                    lambda r: "—" if math.isnan(r["kl_step_mean"]) else f"{r['kl_step_mean']:.2g}",
                ),
                ("ratio_in_band_mean", "tokens with ρ in [0.8, 1.25]", None),
                ("ess_drop_count", "ESS drops", lambda r: num(r["ess_drop_count"], 0)),
                ("grad_spike_count", "grad spikes", lambda r: num(r["grad_spike_count"], 0)),
                ("fail_reason", "failure", lambda r: esc(r["fail_reason"])),
            ],
            "runs",
        ),
        "<p class=\"note\">Critic EV: the share of the returns' variance the critic's values explain, "
        "1 − Var(return − value) / Var(return): 1 is a perfect critic, 0 no better than predicting the mean return, "
        "below 0 (in red) worse than that, as a critic that has not learned yet is. After warm-up: at the last of "
        "the value-only warm-up steps (— without a warm-up), the same for every cell of a seed (the warm-up runs "
        "before any policy step, so the bands do not touch it); at step 1: at the first policy update. Train collapse: "
        "the collapse rule on the training reward's 5-step mean (— when it did not fire).</p>",
    ]


def _ev(column: str) -> Callable[[Any], str]:
    """An explained variance, in red below 0 (worse than predicting the mean)."""

    def cell(r: dict) -> str:
        text = num(r[column])
        return f'<span class="bad">{text}</span>' if r[column] < 0 else text

    return cell


PLOTLY_FILE = "plotly.min.js"  # the one copy beside the reports of a folder (no network needed)

_SORT = """
document.querySelectorAll("table.sortable th").forEach(function (th) {
  th.style.cursor = "pointer"; th.title = "sort";
  th.addEventListener("click", function () {
    var col = th.cellIndex;
    var body = th.closest("table").tBodies[0], rows = Array.from(body.rows), up = th.dataset.dir !== "up";
    th.dataset.dir = up ? "up" : "down";
    var key = function (r) { var t = r.cells[col] ? r.cells[col].innerText.trim() : "";
      var v = parseFloat(t.replace("\u221e", "Infinity")); return isNaN(v) ? t : v; };
    rows.sort(function (a, b) { var x = key(a), y = key(b);
      var c = (typeof x === typeof y) ? (x < y ? -1 : x > y ? 1 : 0) : (typeof x === "number" ? -1 : 1);
      return up ? c : -c; });
    rows.forEach(function (r) { body.appendChild(r); });
  });
});
"""


_MISSING = """
if (typeof Plotly === "undefined") {
  document.getElementById("plotly-missing").hidden = false;
  document.querySelectorAll(".plotly-graph-div").forEach(function (d) {
    d.className += " missing"; d.style.height = "auto";
    d.textContent = "This figure is not drawn: plotly.js did not load (see the note at the top of the page).";
  });
}
"""


def page(title: str, parts: list[str], plotly_src: str | None = None) -> str:
    """The whole document: `title` is escaped here, `parts` are HTML already. plotly.js is loaded from
    `plotly_src` (a file beside the page) when given, else inlined; when it does not load, the page says so
    at the top and in every figure's place. Tables of class `sortable` sort on a click of their header."""
    script = (
        f'<script type="text/javascript" src="{html.escape(plotly_src, quote=True)}"></script>'
        if plotly_src
        else f'<script type="text/javascript">{get_plotlyjs()}</script>'
    )
    missing = (
        '<p id="plotly-missing" class="missing" hidden>The figures of this report need plotly.js, which it loads '
        f"from <code>{html.escape(plotly_src or 'the page')}</code> in the same folder. That file is missing or "
        "blocked, so every figure below is empty: keep the report beside it (<code>copc report</code> writes both "
        "into the reports folder; the copy in MLflow's <code>report/</code> artifacts has one beside it too).</p>"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style>{script}</head><body>"
        + missing
        + "\n".join(parts)
        + f"<script>{_MISSING}{_SORT}</script></body></html>\n"
    )


def markdown_html(text: str) -> str:
    """The Markdown that the claims section writes (#### headings, pipe tables, paragraphs) as HTML, escaped."""
    out, rows = [], []

    def flush() -> None:
        if rows:
            head, body = rows[0], [r for r in rows[2:]]
            out.append(
                '<div class="table-wrap"><table class="sortable"><thead><tr>'
                + "".join(f"<th>{html.escape(c)}</th>" for c in head)
                + "</tr></thead><tbody>"
                + "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in body)
                + "</tbody></table></div>"
            )
            rows.clear()

    for line in text.splitlines():
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
            continue
        flush()
        if line.startswith("#"):
            out.append(f"<h3>{html.escape(line.lstrip('#').strip())}</h3>")
        elif line.strip():
            out.append(f"<p>{html.escape(line.strip())}</p>")
    flush()
    return "\n".join(out)
