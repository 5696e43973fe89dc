"""Named sweep presets: a search space and the base run config it overrides.

`copc sweep --preset NAME` and the Prefect deployments (`copc serve`) use these; `bench.claims` takes
its COPC grid and base config from the claims presets, so the two always run the same points.
"""

from __future__ import annotations

from copc_core.config import RunConfig, SearchTaskConfig
from sweeps.space import SweepSpace

CLAIMS_TAU_POLICY = [1.5, 2.0, 4.0]
CLAIMS_TAU_ADVANTAGE = [1.0, 2.0, 4.0]
CLAIMS_SPACE = SweepSpace(tau_policy=CLAIMS_TAU_POLICY, tau_advantage=CLAIMS_TAU_ADVANTAGE,
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
