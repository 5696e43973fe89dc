"""Collapse detection, early warnings and the `RunSummary` (docs/ALGORITHMS.md §5).

A run is *collapsed* when its held-out accuracy (evaluated every `eval_every` steps) falls more than
50 % below its running peak and stays there for the rest of the run, or on a non-finite loss or
gradient. The same rule on the training reward of every step (`reward/mean`, the batch's mean
outcome reward) gives `collapse_step_train` (`sustained_collapse_step`: on a trailing mean of 5 steps,
and only a fall that lasts 5 steps or more, since one low batch at the end of a run is noise): it sees
rise-and-fall episodes shorter than the evaluation interval, and is reported beside the held-out
verdict, never instead of it. Early
warnings: an ESS drop (below half its running median) and a grad-norm spike (above 5× its
running median).
"""

from __future__ import annotations

import math
import statistics

from pydantic import BaseModel, ConfigDict


def collapse_step(steps: list[int], accuracy: list[float], drop: float = 0.5) -> int | None:
    """First eval step from which accuracy stays below (1 − drop) × running peak until the end.

    Returns None when the run never collapses (or ends above the threshold). The running peak at
    eval i is max(accuracy[:i+1]); a peak of 0 cannot collapse.
    """
    if len(steps) != len(accuracy):
        raise ValueError("steps and accuracy must have the same length")
    peak, below = 0.0, []
    for acc in accuracy:
        peak = max(peak, acc)
        below.append(peak > 0 and acc < (1.0 - drop) * peak)
    first = None
    for i in range(len(below) - 1, -1, -1):
        if not below[i]:
            break
        first = i
    return None if first is None else steps[first]


TRAIN_WINDOW = 5  # steps: the training reward's trailing mean, and the shortest fall called a collapse


def sustained_collapse_step(steps: list[int], values: list[float], window: int = TRAIN_WINDOW) -> int | None:
    """`collapse_step` on the trailing mean of `window` values, kept only when at least `window` values lie in the
    collapsed tail: a batch's mean reward is noisy, and one or two low batches at the end of a run are not a
    collapse (the plain rule flagged steps 19 and 20 of 20-step runs that had not collapsed)."""
    smooth = [statistics.fmean(values[max(0, i - window + 1) : i + 1]) for i in range(len(values))]
    at = collapse_step(steps, smooth)
    return at if at is not None and len(steps) - steps.index(at) >= window else None


def spikes(values: list[float], factor: float, warmup: int = 5) -> list[int]:
    """Indices i where values[i] > factor × median(values[:i]) (after `warmup` values)."""
    return [i for i in range(warmup, len(values)) if values[i] > factor * statistics.median(values[:i])]


def drops(values: list[float], factor: float, warmup: int = 5) -> list[int]:
    """Indices i where values[i] < factor × median(values[:i]) (after `warmup` values)."""
    return [i for i in range(warmup, len(values)) if values[i] < factor * statistics.median(values[:i])]


class RunSummary(BaseModel):
    """What a run reports to sweeps and reports.

    Accuracy is held-out accuracy of temperature-1 samples (`eval/accuracy`); `*_greedy` is argmax.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    steps_completed: int
    warm_start_accuracy: float
    final_accuracy: float
    peak_accuracy: float
    auc_accuracy: float  # mean accuracy over the run (trapezoid over eval steps / span)
    final_accuracy_greedy: float
    collapsed: bool
    collapse_step: int | None
    collapse_reason: str | None  # "accuracy" | "non_finite" | None
    collapse_step_train: int | None  # the collapse rule on the per-step training reward
    ess_drop_steps: list[int]
    grad_norm_spike_steps: list[int]
    mean_step_s: float
    mean_rollout_s: float
    mean_train_s: float
    staleness_mean: float  # realised lag in versions (learner steps)
    staleness_max: float
    staleness_updates_mean: float  # the same in optimizer updates (the unit the papers count in)
    kl_step_mean: float | None  # mean over steps of policy/kl_step (None: not measured)
    critic_explained_var_first: float | None  # critic/explained_var at the first policy step
    critic_warmup_explained_var: float | None  # at the last critic warm-up step (None: no warm-up)
    # per-token behavior ratios ρ = π_old/μ, means over steps: the share inside [0.8, 1.25], and log ρ's 1 % and
    # 99 % quantiles (None: not measured, e.g. a summary logged before these existed)
    ratio_in_band_mean: float | None = None
    log_ratio_p01_mean: float | None = None
    log_ratio_p99_mean: float | None = None


def area_under_curve(steps: list[int], accuracy: list[float]) -> float:
    """Trapezoid-rule mean of accuracy over [steps[0], steps[-1]] (the value itself for one point)."""
    if len(steps) == 1:
        return accuracy[0]
    area = sum((s1 - s0) * (a0 + a1) / 2 for s0, s1, a0, a1 in zip(steps, steps[1:], accuracy, accuracy[1:]))
    return area / (steps[-1] - steps[0])


def summarise(
    evals: list[dict[str, float]],
    history: list[dict[str, float]],
    non_finite_step: int | None,
    warmup: list[dict[str, float]] = (),
) -> RunSummary:
    """Build the summary from eval records ({step, eval/accuracy, eval/accuracy_greedy}), step metrics
    and the critic warm-up records."""
    steps = [int(e["step"]) for e in evals]
    acc = [e["eval/accuracy"] for e in evals]
    step_acc = collapse_step(steps, acc)
    reason = "non_finite" if non_finite_step is not None else ("accuracy" if step_acc is not None else None)
    at = non_finite_step if non_finite_step is not None else step_acc

    def mean(key: str) -> float:
        vals = [h[key] for h in history if key in h]
        return sum(vals) / len(vals) if vals else 0.0

    rewarded = [h for h in history if "reward/mean" in h]
    train_collapse = sustained_collapse_step([int(h["step"]) for h in rewarded], [h["reward/mean"] for h in rewarded])
    kl = [h["policy/kl_step"] for h in history if "policy/kl_step" in h]

    ess = [h["correction/ess"] for h in history]

    def mean_or_none(key: str) -> float | None:
        vals = [h[key] for h in history if key in h]
        return sum(vals) / len(vals) if vals else None

    grad = [h["actor/grad_norm"] for h in history]
    return RunSummary(
        steps_completed=len(history),
        warm_start_accuracy=acc[0],
        final_accuracy=acc[-1],
        peak_accuracy=max(acc),
        auc_accuracy=area_under_curve(steps, acc),
        final_accuracy_greedy=evals[-1].get(
            "eval/accuracy_greedy", math.nan
        ),  # NaN: a run stopped early, greedy "final"
        collapsed=reason is not None,
        collapse_step=at,
        collapse_reason=reason,
        collapse_step_train=train_collapse,
        ess_drop_steps=[int(history[i]["step"]) for i in drops(ess, 0.5)],
        grad_norm_spike_steps=[int(history[i]["step"]) for i in spikes(grad, 5.0)],
        mean_step_s=mean("time/step_s"),
        mean_rollout_s=mean("time/rollout_s"),
        mean_train_s=mean("time/train_s"),
        staleness_mean=mean("staleness/mean"),
        staleness_max=max((h["staleness/max"] for h in history), default=0.0),
        staleness_updates_mean=mean("staleness/updates"),
        kl_step_mean=sum(kl) / len(kl) if kl else None,
        critic_explained_var_first=history[0]["critic/explained_var"] if history else None,
        critic_warmup_explained_var=warmup[-1]["critic/explained_var"] if warmup else None,
        ratio_in_band_mean=mean_or_none("staleness/ratio_in_band"),
        log_ratio_p01_mean=mean_or_none("staleness/log_ratio_p01"),
        log_ratio_p99_mean=mean_or_none("staleness/log_ratio_p99"),
    )
