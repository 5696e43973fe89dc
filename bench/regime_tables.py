"""The regime's validation and claims tables, from the sweep's runs in MLflow (as the report reads them).

    python -m bench.regime_tables [--sweep regime-tool-math] [--tracking-uri URI] [--seeds 0-4]
                                  [--tau-advantage 1.25,inf] [--long] [--staleness 8] [--at-step 300]

Per (method, k): runs, final held-out accuracy and area under the curve (mean ± sd over seeds),
collapses, the realised lag in optimizer updates, and the per-token behavior-ratio distribution
(share of ρ = π_old/μ inside [0.8, 1.25], mean 1 % / 99 % quantiles of log ρ); with two or more nonzero
lags, each baseline's final accuracy between consecutive lags, paired by seed (AReaL's finding). Then, for collapsed
runs, whether an ESS drop or a grad-norm spike came before the collapse (VCPO's early warnings), and
the report's claims section (reports/claims.py) when the sweep holds a two-channel grid, and rliable's aggregates as
the report gives them (IQM per method and k, each two-channel reading's probability of improvement over each
baseline; a grid by its selection-free picks). With --long, the long
study's read-outs and claim (c) by its plan's written criteria, per lag (`claim_c_table`; a slice is not read).
With --at-step S, every run is read as if it had ended at learner step S (`at_step`: a long run's first S steps as a
fresh-seed S-step run); --confirm then prints the reference minus each method with its paired t p.
"""

from __future__ import annotations

import argparse
import math

import pandas as pd

from copc_core.rl.methods import COPC_READING
from copc_core.train.stability import area_under_curve
from infra.settings import data_dir
from infra.tracking import read_sweeps, tracking_uri
from reports.analysis import (
    aggregates,
    improvement_table,
    late_half_aucs,
    late_stage,
    method_finals,
    method_label,
    paired_difference,
    paired_p,
    readings_and_baselines,
    selection_free_scores,
    survival,
)
from reports.claims import claim_tables, improvement_text, interval_text, roles
from reports.frames import curves_frame, runs_frame


def _ms(values: pd.Series) -> str:
    values = values.dropna()
    if values.empty:
        return "—"
    return f"{values.mean():.2f}" + (f" ± {values.std():.2f}" if len(values) > 1 else "")


def validation_table(runs: pd.DataFrame) -> str:
    lines = [
        "| method | k (versions) | lag (optimizer updates, realised) | runs | final accuracy | AUC | collapsed | "
        "ρ in [0.8, 1.25] | log ρ p01 / p99 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (method, k), g in runs[runs["scored"]].groupby(["method", "staleness"], sort=True):
        lines.append(
            f"| {method} | {k} | {g['staleness_updates_mean'].mean():.1f} | {len(g)} | {_ms(g['final_accuracy'])} | "
            f"{_ms(g['auc_accuracy'])} | {int(g['collapsed'].sum())}/{len(g)} | {g['ratio_in_band_mean'].mean():.3f} | "
            f"{g['log_ratio_p01_mean'].mean():+.2f} / {g['log_ratio_p99_mean'].mean():+.2f} |"
        )
    return "\n".join(lines)


def aggregate_tables(runs: pd.DataFrame) -> str:
    """The report's aggregates section in Markdown (reports/html.py `_aggregates_section`, the same functions and
    digits): the IQM of final accuracy per method and k, then per k a reading a row and a baseline a column, P(a run of
    the reading ends above a run of the baseline), each [95 % CI]."""
    picks = method_finals(runs)
    agg = aggregates(picks)
    if agg.empty:
        return ""
    lines = ["| method | k (versions) | runs | IQM of final accuracy [95 % CI] |", "|---|---|---|---|"]
    for r in agg.itertuples():
        iqm = interval_text(r.iqm, r.low, r.high, ".3f")
        lines.append(f"| {method_label(r.method, r.n_cells)} | {r.staleness} | {r.n} | {iqm} |")
    for k, cells in improvement_text(improvement_table(picks, *readings_and_baselines(runs))).items():
        lines += [
            "",
            f"P(a run of the reading ends above a run of the baseline) [95 % CI], k = {k}:",
            "",
            "| reading | " + " | ".join(cells.columns) + " |",
            "|---" * (len(cells.columns) + 1) + "|",
            *(f"| {m} | " + " | ".join(row) + " |" for m, row in zip(cells.index, cells.to_numpy())),
        ]
    return "\n".join(lines)


def lag_table(runs: pd.DataFrame) -> str:
    """AReaL's finding as a number: each one-cell method's final accuracy at the larger lag minus at the smaller one,
    paired by seed, for each pair of consecutive nonzero lags the runs hold. Empty below two such lags."""
    scored = runs[runs["scored"]]
    _, _, baselines = roles(scored)
    lags = sorted(int(k) for k in scored["staleness"].unique() if k > 0)
    if len(lags) < 2:
        return ""
    lines = []
    for lo, hi in zip(lags, lags[1:]):
        lines += [
            f"| method | final at k = {lo} | final at k = {hi} | k = {hi} − k = {lo}, paired by seed [95 % CI] "
            f"(seeds) | collapsed at k = {lo} / {hi} |",
            "|---|---|---|---|---|",
        ]
        for method in baselines:
            g = scored[scored["method"] == method]
            a, b = g[g["staleness"] == hi], g[g["staleness"] == lo]
            if a.empty or b.empty:
                continue
            n, mean, low, high = paired_difference(
                a.set_index("seed")["final_accuracy"], b.set_index("seed")["final_accuracy"]
            )
            lines.append(
                f"| {method} | {_ms(b['final_accuracy'])} | {_ms(a['final_accuracy'])} | {mean:+.2f} [{low:+.2f}, "
                f"{high:+.2f}] ({n}) | {int(b['collapsed'].sum())}/{len(b)} / {int(a['collapsed'].sum())}/{len(a)} |"
            )
        lines.append("")
    return "\n".join(lines).rstrip()


def warnings_table(runs: pd.DataFrame) -> str:
    collapsed = runs[runs["scored"] & runs["collapsed"]]
    stable = runs[runs["scored"] & ~runs["collapsed"]]
    false_alarms = int(stable["first_warning_step"].map(math.isfinite).sum())
    specificity = f" Of the {len(stable)} runs that did not collapse, {false_alarms} had a warning too."
    if collapsed.empty:
        return "No run collapsed." + specificity
    early = collapsed[collapsed["first_warning_step"] < collapsed["collapse_step"]]
    warned = collapsed[collapsed["first_warning_step"].map(math.isfinite)]
    return (
        f"{len(collapsed)} collapsed run(s); {len(warned)} had an ESS drop or a grad-norm spike at some step, "
        f"{len(early)} before the collapse step ("
        + ", ".join(
            f"{r.method} k={r.staleness} s={r.seed}: warning {r.first_warning_step:g}, collapse {r.collapse_step:g}"
            for r in collapsed.itertuples()
        )
        + ")."
        + specificity
    )


def channels_table(runs: pd.DataFrame) -> str:
    """Each COPC reading's tuned score (bands chosen on the other seeds) with both channels, with the policy
    channel only (its τ_a = 1 cells: c ≡ 1 is plain GAE) and, for the default reading, `copc_advantage_only`
    (the advantage channel only, w = 1, no mask); paired by seed against both channels."""
    scored = runs[runs["scored"]]
    readings = sorted(m for m in scored["method"].unique() if m.startswith("copc["))
    policy_only = scored[scored["method"].isin(readings) & (scored["tau_advantage"] == 1.0)]
    frame = pd.concat([scored, policy_only.assign(method=policy_only["method"] + " τ_a = 1 only")])
    families = {m: [m] for m in frame["method"].unique() if m.startswith("copc")}
    tuned = selection_free_scores(frame.assign(scored=True), families, "final_accuracy")
    tuned = tuned[tuned["kind"] == "tuned"].set_index(["family", "staleness", "seed"])["score"].sort_index()
    lines = [
        "| k | method | tuned final (seeds) | minus both channels of its reading [95 % CI] |",
        "|---|---|---|---|",
    ]
    for (family, k), s in tuned.groupby(level=["family", "staleness"]):
        s = s.droplevel(["family", "staleness"])
        # an ablation is compared with COPC of its own reading: `copc_advantage_only[behavior]` with copc[behavior]
        tagged = family.removesuffix(" τ_a = 1 only")
        reading = (
            tagged if tagged.startswith("copc[") else f"copc[{tagged.partition('[')[2].rstrip(']') or COPC_READING}]"
        )
        both = tuned.loc[(reading, k)] if (reading, k) in tuned.index.droplevel("seed") else None
        diff = "—"
        if both is not None and family != reading:
            n, mean, low, high = paired_difference(s, both)
            diff = f"{mean:+.2f} [{low:+.2f}, {high:+.2f}] ({n})"
        lines.append(f"| {k} | {family} | {s.mean():.2f} ({len(s)}) | {diff} |")
    return "\n".join(lines)


def confirmation_table(runs: pd.DataFrame, reference: str) -> str:
    """Fresh seeds: every method's final accuracy and AUC, and `reference` minus each, paired by seed."""
    scored = runs[runs["scored"]]
    lines = [
        f"| method (cell) | runs | final | AUC | collapsed | {reference} − it, final [95 % CI] (seeds) | p, paired t | "
        "… AUC [95 % CI] (seeds) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    by_seed = {
        (m, metric): g.groupby("seed")[metric].mean()
        for m, g in scored.groupby("method")
        for metric in ("final_accuracy", "auc_accuracy")
    }
    for m, g in scored.groupby("method", sort=True):
        cell = " ".join(
            f"{n} {v:g}"
            for n, v in (("τ_p", g["tau_policy"].iloc[0]), ("τ_a", g["tau_advantage"].iloc[0]))
            if math.isfinite(v)
        )
        diffs, p = [], "—"
        for metric in ("final_accuracy", "auc_accuracy"):
            if m == reference or (reference, metric) not in by_seed:
                diffs.append("—")
                continue
            n, mean, low, high = paired_difference(by_seed[reference, metric], by_seed[m, metric])
            diffs.append(f"{mean:+.2f} [{low:+.2f}, {high:+.2f}] ({n})")
            if metric == "final_accuracy":
                p = f"{paired_p(by_seed[reference, metric], by_seed[m, metric]):.3g}"
        lines.append(
            f"| {m}{f' ({cell})' if cell else ''} | {len(g)} | {_ms(g['final_accuracy'])} | {_ms(g['auc_accuracy'])} | "
            f"{int(g['collapsed'].sum())}/{len(g)} | {diffs[0]} | {p} | {diffs[1]} |"
        )
    return "\n".join(lines)


def at_step(runs: pd.DataFrame, curves: pd.DataFrame, step: int) -> pd.DataFrame:
    """The runs read as if they had ended at learner step `step`: the held-out accuracy evaluated there as the final,
    the AUC over the evaluations up to it (the runs' own rule, `area_under_curve`), a collapse only at or before it. A
    run with no evaluation at that step is not scored. No schedule depends on `train.steps`, so a longer run's first
    `step` steps are a `step`-step run's."""
    acc = curves[(curves["metric"] == "eval/accuracy") & (curves["step"] <= step)].sort_values(["run_id", "step"])
    final = acc[acc["step"] == step].set_index("run_id")["value"]
    auc = {r: area_under_curve(g["step"].tolist(), g["value"].tolist()) for r, g in acc.groupby("run_id")}
    out = runs.assign(final_accuracy=runs["run_id"].map(final), auc_accuracy=runs["run_id"].map(auc))
    return out.assign(
        collapsed=out["collapsed"] & (out["collapse_step"] <= step),
        scored=out["scored"] & out["final_accuracy"].notna(),
    )


def _survival_at(surv: pd.DataFrame, step: int) -> float:
    """A Kaplan–Meier curve's value at `step` (the last change at or before it); NaN past its longest run."""
    return float(surv[surv["step"] <= step]["surviving"].iloc[-1]) if step <= surv["step"].max() else math.nan


def _ci(mean: float, low: float, high: float, sign: str = "+") -> str:
    """`+0.12 [+0.05, +0.20]`; no interval where none could be drawn (one seed)."""
    text = f"{mean:{sign}.2f}"
    return text + (f" [{low:{sign}.2f}, {high:{sign}.2f}]" if math.isfinite(low) else "")


def long_table(runs: pd.DataFrame, curves: pd.DataFrame, marks: tuple[int, ...] = (300, 600, 1000)) -> str:
    """The long study's read-outs (docs/journal/2026-12-06-1-long-study-plan.md): per (method, k), collapses and
    their steps, the share not yet collapsed at `marks`, final accuracy, final − peak and late-half AUC; then each
    COPC reading minus each other method, paired by seed, on final accuracy and late-half AUC."""
    scored = runs[runs["scored"]]
    late, surv = late_stage(scored, curves), survival(scored)
    lines = [
        "| method | k | runs | collapsed (steps) | not collapsed at "
        + " / ".join(f"{m:,}" for m in marks)
        + " | final | final − peak [95 % CI] | late-half AUC [95 % CI] |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in late.itertuples():
        s = surv[(surv["method"] == r.method) & (surv["staleness"] == r.staleness)]
        g = scored[(scored["method"] == r.method) & (scored["staleness"] == r.staleness)]
        lines.append(
            f"| {r.method} | {r.staleness} | {r.n_runs} | {r.collapsed}"
            + (f" ({r.collapse_steps})" if r.collapsed else "")
            + " | "
            + " / ".join(f"{v:.2f}" if math.isfinite(v) else "—" for v in (_survival_at(s, m) for m in marks))
            + f" | {_ms(g['final_accuracy'])}"
            + f" | {_ci(r.final_minus_peak, r.final_minus_peak_low, r.final_minus_peak_high)}"
            + f" | {_ci(r.late_auc, r.late_auc_low, r.late_auc_high, '')} |"
        )
    scored = scored.assign(late_auc=late_half_aucs(scored, curves))
    readings = sorted(m for m in scored["method"].unique() if m.startswith("copc"))
    for k, at in scored.groupby("staleness", sort=True):
        for metric, name in (("final_accuracy", "final accuracy"), ("late_auc", "late-half AUC")):
            others = sorted(set(at["method"]) - set(readings))
            lines += ["", f"Each reading minus each method at k = {k}, {name}, paired by seed [95 % CI] (seeds):", ""]
            lines += ["| reading | " + " | ".join(others) + " |", "|---|" + "---|" * len(others)]
            for reading in readings:
                mine = at[at["method"] == reading].set_index("seed")[metric]
                cells = []
                for other in others:
                    n, mean, low, high = paired_difference(mine, at[at["method"] == other].set_index("seed")[metric])
                    cells.append(f"{_ci(mean, low, high)} ({n})" if n else "—")
                lines.append(f"| {reading} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


LATE_AFTER = 300  # the 300-step study's horizon: a collapse past it is late (the long study's plan)
FEW_BASELINES = 3  # the plan's refuting clause: at most this many baselines collapse in 2 or more of 5 runs


def claim_c_table(runs: pd.DataFrame, expected: dict[int, list[str]], seeds: int = 5) -> str:
    """Claim (c) by the long study's written criteria (docs/journal/2026-12-06-1-long-study-plan.md), per k over the
    methods `expected` there (COPC's readings, `copc[...]`, and the baselines): *confirmed* if some reading collapses
    in at most 1 of its runs while more than half of the baselines collapse in 2 or more past step 300; *refuted* if
    no reading collapses less often than the least-collapsing baseline, or at most 3 baselines collapse in 2 or more
    (at any step); otherwise *partly*. Read only once every expected method has `seeds` runs (a slice: not read)."""
    scored = runs[runs["scored"]]
    lines = [
        "| k | methods with all their runs | readings' collapses | least-collapsing baseline | baselines collapsing "
        f"in ≥ 2 runs (past step {LATE_AFTER}) | claim (c) |",
        "|---|---|---|---|---|---|",
    ]
    for k, methods in sorted(expected.items()):
        at = scored[scored["staleness"] == k]
        late = at["collapsed"] & (at["collapse_step"] > LATE_AFTER)
        runs_of = at.groupby("method").size()
        falls = at.groupby("method")["collapsed"].sum()
        late_falls = late.groupby(at["method"]).sum()
        readings = [m for m in methods if m.startswith("copc[")]
        baselines = [m for m in methods if m not in readings]
        done = [m for m in methods if runs_of.get(m, 0) >= seeds]
        least = min((int(falls[b]) for b in baselines if b in falls.index), default=None)  # of those that ran
        two = [b for b in baselines if falls.get(b, 0) >= 2]
        two_late = [b for b in baselines if late_falls.get(b, 0) >= 2]
        holds = []
        if any(falls.get(r, 0) <= 1 for r in readings) and len(two_late) > len(baselines) / 2:
            holds.append("confirmed")
        if least is None or not any(falls.get(r, 0) < least for r in readings) or len(two) <= FEW_BASELINES:
            holds.append("refuted")
        verdict = (
            " and ".join(holds) or "partly"
            if len(done) == len(methods)
            else f"not read: a slice ({len(done)} of {len(methods)} methods)"
        )
        lines.append(
            f"| {k} | {len(done)} of {len(methods)} | "
            + ", ".join(f"{r.removeprefix('copc')} {int(falls.get(r, 0))}/{int(runs_of.get(r, 0))}" for r in readings)
            + f" | {'—' if least is None else least} | {len(two)} of {len(baselines)} ({len(two_late)}) | {verdict} |"
        )
    return "\n".join(lines)


def long_expected(sweep: str, runs: pd.DataFrame) -> dict[int, list[str]]:
    """The methods a long study runs at each k: its preset's grid when the sweep is a preset, else the runs' own."""
    from sweeps.presets import PRESETS

    if sweep in PRESETS:
        grid = PRESETS[sweep][0].grid()
        return {k: sorted({p.method for p in grid if p.staleness == k}) for k in sorted({p.staleness for p in grid})}
    return {int(k): sorted(g["method"].unique()) for k, g in runs.groupby("staleness")}


def _seeds(text: str) -> list[int]:
    """'0-4' or '0,1,2' → seeds."""
    if "-" in text:
        low, high = text.split("-")
        return list(range(int(low), int(high) + 1))
    return [int(s) for s in text.split(",")]


def cut_grids(runs: pd.DataFrame, tau_advantage: list[float]) -> pd.DataFrame:
    """The two-channel grids (reports.claims.roles) cut to these τ_a values; every other method's runs are kept
    whatever their bands. To print a slice that was read before more cells ran."""
    two_channel = runs["method"].isin(roles(runs)[0])
    return runs[~two_channel | runs["tau_advantage"].isin(tau_advantage)]


def has_grid(runs: pd.DataFrame) -> bool:
    """Whether the runs hold a two-channel grid: its coupling tables print even without a baseline beside it
    (a confirmation on fresh seeds may run the grid alone)."""
    return bool(roles(runs[runs["scored"]])[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", default="regime-tool-math")
    parser.add_argument("--tracking-uri", default=None)
    parser.add_argument("--seeds", type=_seeds, default=None, help="the runs of these seeds only, e.g. 0-4 or 0,1,2")
    parser.add_argument(
        "--tau-advantage",
        type=lambda text: [float(v) for v in text.split(",")],
        default=None,
        help="cut the two-channel grids to these τ_a values, e.g. 1.25,inf (other methods are kept)",
    )
    parser.add_argument(
        "--confirm", type=_seeds, default=None, help="fresh seeds (e.g. 5-9): only the confirmation table of their runs"
    )
    parser.add_argument(
        "--long", action="store_true", help="the long study's read-outs only: survival, final − peak, late-half AUC"
    )
    parser.add_argument(
        "--reference", default=f"copc[{COPC_READING}]", help="the method the confirmation compares with each other one"
    )
    parser.add_argument("--staleness", type=_seeds, default=None, help="the runs at these lags k only, e.g. 8")
    parser.add_argument(
        "--at-step", type=int, default=None, help="read every run as if it had ended at this learner step (`at_step`)"
    )
    args = parser.parse_args()
    uri = tracking_uri(data_dir(), args.tracking_uri)
    curves_needed = args.long or args.at_step is not None
    found = read_sweeps(uri, [args.sweep], ["eval/accuracy"] if curves_needed else [])
    runs = runs_frame(found["trials"], found["experiment_id"], "http://127.0.0.1:5000")
    if args.staleness is not None:
        runs = runs[runs["staleness"].isin(args.staleness)]
    if args.at_step is not None:
        runs = at_step(runs, curves_frame(found["trials"]), args.at_step)
        print(f"(every run read as if it had ended at learner step {args.at_step})\n")
    if args.confirm is not None:
        runs = runs[runs["seed"].isin(args.confirm)]
        print(f"### {args.sweep}, seeds {args.confirm}: {int(runs['scored'].sum())} finished runs (MLflow {uri})\n")
        print(confirmation_table(runs, args.reference))
        return
    if args.seeds is not None:
        runs = runs[runs["seed"].isin(args.seeds)]
    if args.long:
        print(f"### {args.sweep}: {int(runs['scored'].sum())} finished runs (MLflow {uri})\n")
        print(long_table(runs, curves_frame(found["trials"])))
        print("\nClaim (c) by the long study's plan (docs/journal/2026-12-06-1-long-study-plan.md):\n")
        print(claim_c_table(runs, long_expected(args.sweep, runs)))
        return
    if args.tau_advantage is not None:
        runs = cut_grids(runs, args.tau_advantage)
    print(f"### {args.sweep}: {int(runs['scored'].sum())} finished runs (MLflow {uri})\n")
    print(validation_table(runs))
    lags = lag_table(runs)
    if lags:
        print("\nThe baselines between lags (final accuracy, the larger lag minus the smaller):\n")
        print(lags)
    print()
    print(warnings_table(runs))
    if has_grid(runs):  # has_claims(runs) implies it
        print()
        print(claim_tables(runs))
        print("\n#### The channels: both, the policy side only, the advantage side only\n")
        print(channels_table(runs))
    aggregated = aggregate_tables(runs)
    if aggregated:
        print("\n#### Aggregates (rliable's, as the report gives them)\n")
        print(aggregated)


if __name__ == "__main__":
    main()
