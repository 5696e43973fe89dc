"""Named sweep presets: a search space and the base run config it overrides.

`copc sweep --preset NAME` and the Prefect deployments (`copc serve`) use these. The claims presets
are one sweep each: COPC's (τ_p, τ_a) grid, its single-channel ablations on the same band values and
the baselines, at every staleness level; their report carries the claims section.
"""

from __future__ import annotations

from copc_core.config import RunConfig, SearchTaskConfig
from sweeps.space import SweepSpace, SweptMethod

CLAIMS_TAU_POLICY = [1.5, 2.0, 4.0]
CLAIMS_TAU_ADVANTAGE = [1.0, 2.0, 4.0]
CLAIMS_BASELINES = ["sync_ppo", "async_ppo", "decoupled_ppo", "tis", "icepop", "vtrace"]
CLAIMS_SPACE = SweepSpace(
    methods=[SweptMethod(name="copc", tau_policy=CLAIMS_TAU_POLICY, tau_advantage=CLAIMS_TAU_ADVANTAGE),
             SweptMethod(name="copc_policy_only", tau_policy=CLAIMS_TAU_POLICY),
             SweptMethod(name="copc_advantage_only", tau_advantage=CLAIMS_TAU_ADVANTAGE),
             *(SweptMethod(name=m) for m in CLAIMS_BASELINES)],
    staleness=[0, 4, 16, 64], seeds=[0, 1, 2], steps=50)

PRESETS: dict[str, tuple[SweepSpace, RunConfig]] = {
    "embedded-default": (SweepSpace(), RunConfig()),
    "claims-tool-math": (CLAIMS_SPACE, RunConfig()),
    "claims-search": (CLAIMS_SPACE, RunConfig(task=SearchTaskConfig())),
}


def sweep_preset(name: str) -> tuple[SweepSpace, RunConfig]:
    if name not in PRESETS:
        raise ValueError(f"unknown sweep preset {name!r}; presets: {', '.join(PRESETS)}")
    return PRESETS[name]
