"""Declared column schemas of the report frames, checked wherever a frame is built.

A schema maps column → kind: "str", "float", "int" or "bool". `validate` refuses a frame with a
missing or undeclared column, or a column of another kind, naming the frame and the column.
"""

from __future__ import annotations

import pandas as pd

_KIND_CHECKS = {
    "str": lambda s: (
        pd.api.types.is_string_dtype(s) or (s.dtype == object and s.map(lambda v: isinstance(v, str)).all())
    ),
    "float": pd.api.types.is_float_dtype,
    "int": pd.api.types.is_integer_dtype,
    "bool": pd.api.types.is_bool_dtype,
}

RUNS = {
    "run_id": "str",
    "run_name": "str",
    "sweep": "str",
    "status": "str",
    "method": "str",
    "runtime": "str",
    "tau_policy": "float",
    "tau_advantage": "float",
    "has_tau_policy": "bool",  # the method has that band (a band it lacks reads as ∞ in the column beside)
    "has_tau_advantage": "bool",
    "staleness": "int",
    "seed": "int",
    "steps": "int",  # learner steps the run was set to train (-1: not logged)
    "scored": "bool",  # the run finished training and has an objective
    "objective": "float",
    "final_accuracy": "float",
    "peak_accuracy": "float",
    "auc_accuracy": "float",
    "warm_start_accuracy": "float",
    "collapsed": "bool",
    "collapse_step": "float",
    "collapse_reason": "str",
    "collapse_step_train": "float",  # the collapse rule on the per-step training reward
    "ess_drop_count": "float",
    "grad_spike_count": "float",
    "first_warning_step": "float",  # the first ESS-drop or grad-norm-spike step (NaN: none)
    "mean_step_s": "float",
    "mean_rollout_s": "float",
    "mean_train_s": "float",
    "staleness_mean": "float",
    "staleness_max": "float",
    "staleness_updates_mean": "float",
    "kl_step_mean": "float",
    "ratio_in_band_mean": "float",
    "log_ratio_p01_mean": "float",
    "log_ratio_p99_mean": "float",
    "critic_explained_var_first": "float",
    "critic_warmup_explained_var": "float",
    "fail_reason": "str",
    "url": "str",
}

CURVES = {"run_id": "str", "metric": "str", "step": "int", "value": "float"}

CELLS = {
    "method": "str",
    "staleness": "int",
    "tau_policy": "float",
    "tau_advantage": "float",
    "n": "int",
    "mean": "float",
    "sd": "float",
    "ci_low": "float",
    "ci_high": "float",
    "collapse_rate": "float",
    "collapse_low": "float",
    "collapse_high": "float",
    "final_mean": "float",
    "peak_mean": "float",
}

COUPLING = {
    "method": "str",
    "staleness": "int",
    "tau_policy_from": "float",
    "tau_policy_to": "float",
    "tau_advantage_a": "float",
    "tau_advantage_b": "float",
    "n_min": "int",
    "effect_a": "float",
    "effect_a_low": "float",
    "effect_a_high": "float",
    "effect_b": "float",
    "effect_b_low": "float",
    "effect_b_high": "float",
    "contrast": "float",
    "contrast_low": "float",
    "contrast_high": "float",
    "reversal": "bool",
    "significant_reversal": "bool",
    "significant_interaction": "bool",
}

INTERACTION = {
    "method": "str",
    "staleness": "int",
    "fraction": "float",
    "fraction_low": "float",
    "fraction_high": "float",
    "n_min": "int",
}

ADDITIVE_NULL = {
    "method": "str",
    "staleness": "int",
    "fraction": "float",
    "null_median": "float",  # the interaction share seed noise alone gives around the additive fit
    "p_value": "float",
    "n_min": "int",
}

SEED_SCORES = {  # one row per (family of methods, k, kind, seed)
    "family": "str",
    "staleness": "int",
    "kind": "str",  # "tuned": the cell chosen on the other seeds | "untuned": the mean over every cell
    "seed": "int",
    "cell": "str",  # the cell scored ("all" for an untuned score)
    "score": "float",
    "cells": "int",  # cells it was chosen from, or averaged over
}

REGION = {
    "method": "str",
    "staleness": "int",
    "n_cells": "int",
    "n_within": "int",
    "fraction": "float",
    "best": "float",
    "best_tau_policy": "float",
    "best_tau_advantage": "float",
}

METHODS = {
    "method": "str",
    "staleness": "int",
    "n_runs": "int",
    "collapse_rate": "float",
    "final_mean": "float",
    "peak_mean": "float",
    "best_tau_policy": "float",
    "best_tau_advantage": "float",
    "best_objective": "float",
    "best_final_mean": "float",
    "best_peak_mean": "float",
    "best_collapse_rate": "float",
}

STEP_TIMES = {
    "method": "str",
    "staleness": "int",
    "runtime": "str",
    "n_runs": "int",
    "rollout_s": "float",
    "train_s": "float",
    "step_s": "float",
    "rollout_s_sd": "float",  # sd over the runs of the row (NaN: one run)
    "train_s_sd": "float",
    "step_s_sd": "float",
    "speedup_vs_sync": "float",
    "learner_vs_baseline": "float",
}

BIAS_VARIANCE = {
    "method": "str",
    "staleness": "float",
    "tau_policy": "float",
    "tau_advantage": "float",
    "bias_norm": "float",
    "policy_term": "float",
    "advantage_term": "float",
    "cross_term": "float",
    "variance": "float",
    "amplification": "float",
    "mse": "float",
}

SURVIVAL = {  # Kaplan–Meier: the share of a method's runs not yet collapsed, per (method, k), a row per step it changes
    "method": "str",
    "staleness": "int",
    "step": "int",
    "surviving": "float",
    "low": "float",  # 95 % pointwise: Clopper–Pearson on the effective number of runs, by seed
    "high": "float",
    "at_risk": "int",  # runs neither collapsed nor ended before this step
}

LATE = {  # per (method, k): what happens late in training
    "method": "str",
    "staleness": "int",
    "n_runs": "int",
    "n_seeds": "int",  # the intervals are over seeds: a seed's runs (a grid's cells) averaged first
    "collapsed": "int",
    "collapse_steps": "str",  # the collapsed runs' steps, ascending
    "final_minus_peak": "float",  # seed mean of final − peak held-out accuracy (≤ 0: how much was lost)
    "final_minus_peak_low": "float",
    "final_minus_peak_high": "float",
    "late_auc": "float",  # seed mean of the held-out accuracy's area over the second half of training, per step
    "late_auc_low": "float",
    "late_auc_high": "float",
}

OPTIMA = {"staleness": "float", "metric": "str", "tau_advantage": "float", "best_tau_policy": "float", "value": "float"}


class SchemaError(ValueError):
    """A report frame does not have its declared columns."""


def validate(frame: pd.DataFrame, schema: dict[str, str], name: str) -> pd.DataFrame:
    missing = [c for c in schema if c not in frame.columns]
    extra = [c for c in frame.columns if c not in schema]
    if missing or extra:
        raise SchemaError(f"{name} frame: missing columns {missing}, undeclared columns {extra}")
    for column, kind in schema.items():
        if len(frame) and not _KIND_CHECKS[kind](frame[column]):
            raise SchemaError(f"{name} frame: column {column!r} should be {kind}, is {frame[column].dtype}")
    return frame[list(schema)]


def empty(schema: dict[str, str]) -> pd.DataFrame:
    dtypes = {"str": object, "float": float, "int": "int64", "bool": bool}
    return pd.DataFrame({c: pd.Series(dtype=dtypes[k]) for c, k in schema.items()})
