"""The RL math in plain torch: tensors, advantage estimators, corrections, losses, diagnostics, and the method
registry (`methods.py`) that dispatches on them."""
