"""Side effects: Ray actors and placement, MLflow tracking, checkpoints, settings, the local stack."""
