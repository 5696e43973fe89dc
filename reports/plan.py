"""The report against a sweep's plan (sweeps/plan.py): which analyses the plan named, and the plan itself.

A plan names an analysis by its id in backticks, e.g. "`coupling`" or "`late`". Each section of the report that is
an analysis is marked *planned* when a plan version recorded before any of its sweep's trials finished names it,
*named after N runs* when the first version naming it came after N finished trials, else *exploratory*; a report
whose sweeps carry no plan marks nothing (nothing was planned in the platform's sense). Over several sweeps a section
takes the earliest naming among them. Tests of several grids are corrected with Holm's step-down method
(reports.claims).
"""

from __future__ import annotations

import html
import re

# id a plan names → the title its section of the report starts with
ANALYSES = {
    "best": "Best per staleness level",
    "claims": "The paper's claims",
    "heatmaps": "Interaction heatmaps",
    "coupling": "Coupling analysis",
    "region": "High-performing region",
    "methods": "Method comparison",
    "curves": "Learning curves",
    "stability": "Stability diagnostics",
    "late": "Late in training",
    "aggregates": "Aggregates",
    "step-time": "Step time",
}


def named_analyses(text: str) -> set[str]:
    """The analysis ids a plan names in backticks."""
    return {name for name in re.findall(r"`([a-z-]+)`", text) if name in ANALYSES}


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values (each ≤ 1), in the order given: the i-th smallest p times (m − i + 1),
    made non-decreasing. Rejecting where the adjusted p ≤ α controls the family-wise error at α."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def first_named(plans: list[dict]) -> dict[str, int]:
    """Per analysis a plan names: the fewest finished trials before a version naming it (0: planned before data)."""
    out: dict[str, int] = {}
    for p in plans:
        for name in named_analyses(p["text"]):
            out[name] = min(out.get(name, p["runs_before"]), p["runs_before"])
    return out


def plan_section(plans: list[dict]) -> list[str]:
    """Each sweep's plan versions (hash, time, runs under it) and the latest text; nothing when no sweep has one."""
    if not plans:
        return []
    esc = html.escape
    rows = "".join(
        f'<tr><td class="l">{esc(p["sweep"])}</td><td>v{p["version"]}</td><td class="l"><code>{esc(p["sha256"][:12])}'
        f'</code></td><td class="l">{esc(p["at"])}</td><td>{p["runs_before"]}</td><td>{p["runs"]}</td></tr>'
        for p in plans
    )
    latest = {p["sweep"]: p for p in plans}  # versions come oldest first
    named = sorted(first_named(plans))
    texts = "".join(
        f'<h3>{esc(p["sweep"])}: plan v{p["version"]}</h3><pre class="plan">{esc(p["text"])}</pre>'
        for p in latest.values()
    )
    return [
        '<h2 id="plan">The plan, written before the data</h2>',
        '<table id="plans"><tr><th class="l">sweep</th><th>version</th><th class="l">sha256</th>'
        '<th class="l">recorded (UTC)</th><th>runs finished before it</th><th>runs under it</th></tr>'
        f"{rows}</table>",
        '<p class="note">Sections a plan names (in backticks) in a version recorded before any run finished are marked '
        '<span class="planned">planned</span>; named only in a later version, <span class="exploratory">named after '
        'N runs</span>; the others <span class="exploratory">exploratory</span>. Named: '
        + (", ".join(f"<code>{esc(n)}</code>" for n in named) or "none")
        + ". A changed plan is a new version: every version stays, with the runs that ran under it.</p>",
        texts,
    ]


def mark_sections(parts: list[str], plans: list[dict]) -> list[str]:
    """`parts` with a planned / named after N runs / exploratory mark after each analysis section's heading (none
    without a plan)."""
    if not plans:
        return parts
    named = first_named(plans)
    out = []
    for part in parts:
        if part.startswith("<h2>"):
            title = part[4:]
            for name, start in ANALYSES.items():
                if title.startswith(start):
                    after = named.get(name)
                    kind = "planned" if after == 0 else "exploratory"
                    text = {0: "planned", None: "exploratory"}.get(after, f"named after {after} runs")
                    part = (
                        f'<h2 data-analysis="{name}">{title[: -len("</h2>")]} <span class="{kind}">{text}</span></h2>'
                    )
                    break
        out.append(part)
    return out
