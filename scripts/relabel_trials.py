"""Relabel a study's finished trials whose method label no longer names what they ran.

    python scripts/relabel_trials.py --study regime-tool-math --from copc_advantage_only \
        --to "copc_advantage_only[interpolated]" [--apply]

A method's label names a point of a sweep ((method, τ_p, τ_a, k, seed) in Optuna, the `method` tag in MLflow).
When a preset's meaning changes (e.g. COPC's default reading, which its ablations follow), trials run under the
old meaning would otherwise be taken for points of the new one: a later sweep would skip them, and reports would
mix the two. This script rewrites the label of every finished trial of the study that carries `--from`, in the
Optuna storage (the trial's `method` user attribute, which a finished trial's API cannot change) and in MLflow
(the run's `method` tag and its name), after checking that each trial's MLflow run exists. Nothing is deleted;
the runs' params and `config.json` artifacts (what actually ran) are untouched. Without `--apply` it only lists.
"""

from __future__ import annotations

import argparse
import json
import sqlite3

from infra.settings import data_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--study", required=True)
    parser.add_argument("--from", dest="old", required=True)
    parser.add_argument("--to", dest="new", required=True)
    parser.add_argument("--apply", action="store_true")
    args = parser.parse_args()

    from mlflow.tracking import MlflowClient

    from infra.tracking import tracking_uri

    optuna_db = data_dir() / "optuna.db"
    client = MlflowClient(tracking_uri(data_dir(), None))
    with sqlite3.connect(optuna_db) as db:
        rows = db.execute(
            "SELECT a.trial_id, r.value_json FROM trial_user_attributes a "
            "JOIN trials t ON t.trial_id = a.trial_id JOIN studies s ON s.study_id = t.study_id "
            "LEFT JOIN trial_user_attributes r ON r.trial_id = a.trial_id AND r.key = 'mlflow_run_id' "
            "WHERE s.study_name = ? AND a.key = 'method' AND a.value_json = ? AND t.state = 'COMPLETE'",
            (args.study, json.dumps(args.old)),
        ).fetchall()
        runs = [(trial_id, json.loads(run_json)) for trial_id, run_json in rows if run_json]
        if len(runs) != len(rows):
            raise SystemExit(f"{len(rows) - len(runs)} trial(s) have no MLflow run id: nothing changed")
        found = [(trial_id, client.get_run(run_id)) for trial_id, run_id in runs]
        for trial_id, run in found:
            print(f"trial {trial_id}: MLflow run {run.info.run_id} {run.info.run_name!r} → {args.new}")
        if not args.apply:
            print(f"{len(found)} trial(s) would be relabelled; --apply to do it")
            return
        for trial_id, run in found:
            client.set_tag(run.info.run_id, "method", args.new)
            if run.info.run_name and run.info.run_name.startswith(args.old):
                client.update_run(run.info.run_id, name=args.new + run.info.run_name[len(args.old) :])
            db.execute(
                "UPDATE trial_user_attributes SET value_json = ? WHERE trial_id = ? AND key = 'method'",
                (json.dumps(args.new), trial_id),
            )
    print(f"{len(found)} trial(s) relabelled in {optuna_db} and MLflow")


if __name__ == "__main__":
    main()
