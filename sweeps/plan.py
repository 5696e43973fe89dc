"""A sweep's plan: the analyses and criteria written before its data, kept with the study as versions.

A plan is text (Markdown). `copc sweep --plan FILE` (or the Prefect form's `plan` field) records it on the Optuna
study before the sweep's first trial: its text, SHA-256, the time and how many trials had finished (0 for a plan
written before the data), as version 1; the same text again changes nothing; another text becomes the next version,
and every version stays. Each trial records the version current when its sweep process started, and the MLflow parent
run holds every version as an artifact (`plan/v<N>.md`), so the report reads them from MLflow alone. A plan names an
analysis of the report by its id in backticks (`coupling`, see `reports.plan.ANALYSES`): the report marks that
section *planned* when a version recorded before any trial finished names it, *named after N runs* when only a later
version does, and *exploratory* otherwise; the coupling tables' additive-null tests are corrected together (Holm).
Two sweep processes that record different texts at the same moment may both write the same next version (the last
write wins on the study; MLflow refuses the second text under that version): record a plan with one process.
"""

from __future__ import annotations

import datetime
import hashlib
from dataclasses import asdict, dataclass

import optuna

PLANS = "plans"  # study user attribute: the list of versions, oldest first
PLAN_VERSION = "plan_version"  # trial user attribute: the version current when the trial was asked
MAX_PLAN_CHARS = 64 * 1024


@dataclass(frozen=True)
class Plan:
    version: int
    sha256: str
    at: str  # when this version was first recorded (UTC, ISO 8601)
    text: str
    runs_before: int = 0  # trials of the study that had finished when it was recorded (0: before the data)


def plan_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def check_plan(text: str) -> str:
    """The plan text, or ValueError saying why it cannot be one (empty, too long)."""
    if not text.strip():
        raise ValueError("the plan is empty")
    if len(text) > MAX_PLAN_CHARS:
        raise ValueError(f"the plan has {len(text):,} characters; at most {MAX_PLAN_CHARS:,}")
    return text


def study_plans(study) -> list[Plan]:
    """Every version recorded on an Optuna study, oldest first."""
    return [Plan(**p) for p in study.user_attrs.get(PLANS, [])]


def record_plan(study, text: str) -> Plan:
    """Record `text` as the study's current plan: the latest version when it is that text, else a new version."""
    plans = study_plans(study)
    digest = plan_hash(check_plan(text))
    if plans and plans[-1].sha256 == digest:
        return plans[-1]
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    finished = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))
    plan = Plan(len(plans) + 1, digest, now, text, finished)
    study.set_user_attr(PLANS, [asdict(p) for p in [*plans, plan]])
    return plan
