"""Small tensor helpers shared by the math modules: shape checks and masked reductions.

Masks are float tensors holding 0/1 (1 = a token the policy sampled). Masking is by
multiplication, so values at masked positions must be finite; the learner sanitises its batch
once at the boundary (`TrajectoryBatch` validation), not in every function.
"""

from __future__ import annotations

from torch import Tensor

# Natural log of the largest ratio we ever exponentiate; ρ = exp(clamp(log ρ, ±LOG_RATIO_CLAMP)).
LOG_RATIO_CLAMP = 20.0


def check_same_shape(**tensors: Tensor) -> None:
    """Raise ValueError naming the tensors when their shapes differ."""
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) > 1:
        raise ValueError(f"shape mismatch: {shapes}")


def check_float_mask(mask: Tensor) -> None:
    """Raise TypeError unless `mask` is a floating tensor (values 0/1)."""
    if not mask.dtype.is_floating_point:
        raise TypeError(f"mask must be a float tensor of 0/1, got {mask.dtype}")


def masked_sum(x: Tensor, mask: Tensor) -> Tensor:
    """Σ x·mask. Shapes: x, mask [...] → scalar."""
    return (x * mask).sum()


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of x over mask (0 for an empty mask). Shapes: x, mask [...] → scalar."""
    return masked_sum(x, mask) / mask.sum().clamp(min=1)


class NonFiniteError(FloatingPointError):
    """NaN/inf where the learner needs finite numbers (batch inputs, losses, gradients)."""
