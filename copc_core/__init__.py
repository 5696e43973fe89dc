"""COPC core: the method and the learner in plain torch + pydantic.

This package imports none of ray, prefect, optuna, mlflow, pandas or plotly (tests/test_layering.py
enforces it); the layers above wire it to those.
"""
