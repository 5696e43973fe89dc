"""The regime's validation and claims tables, from the sweep's runs in MLflow (as the report reads them).

    python -m bench.regime_tables [--sweep regime-tool-math] [--tracking-uri URI]

Per (method, k): runs, final held-out accuracy and area under the curve (mean ± sd over seeds),
collapses, the realised lag in optimizer updates, and the per-token behavior-ratio distribution
(share of ρ = π_old/μ inside [0.8, 1.25], mean 1 % / 99 % quantiles of log ρ). Then, for collapsed
runs, whether an ESS drop or a grad-norm spike came before the collapse (VCPO's early warnings), and
the report's claims section (reports/claims.py) when the sweep holds a two-channel grid.
"""

from __future__ import annotations

import argparse
import math

import pandas as pd

from infra.settings import data_dir
from infra.tracking import read_sweeps, tracking_uri
from reports.claims import claim_tables, has_claims
from reports.frames import runs_frame


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", default="regime-tool-math")
    parser.add_argument("--tracking-uri", default=None)
    args = parser.parse_args()
    uri = tracking_uri(data_dir(), args.tracking_uri)
    found = read_sweeps(uri, [args.sweep], [])
    runs = runs_frame(found["trials"], found["experiment_id"], "http://127.0.0.1:5000")
    print(f"### {args.sweep}: {int(runs['scored'].sum())} finished runs (MLflow {uri})\n")
    print(validation_table(runs))
    print()
    print(warnings_table(runs))
    if has_claims(runs):
        print()
        print(claim_tables(runs))


if __name__ == "__main__":
    main()
