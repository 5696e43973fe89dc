"""Optuna: search spaces as data, study creation/loading, objectives from run summaries."""
