"""Search spaces as data, and the objective computed from a run summary.

A sweep's grid is methods × their bands × staleness × seed. Each method of the axis carries the band
values it is swept over (none for a band it does not have; its registry default when not given) and
optionally a reading of the trust region (`anchor`) and lags of its own (`staleness`: two entries of one method,
each at its lags, give it other bands at other lags), so COPC's grid, its readings and the baselines form one sweep
that runs, resumes and reports as any other.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from copc_core.config import BandValue, MethodConfig, RunConfig, with_overrides
from copc_core.rl.methods import Anchor, has_band, method_names, preset
from copc_core.train.stability import RunSummary

Band = Annotated[BandValue, Field(description="τ ≥ 1; inf: no mask / no clip")]
BANDS = ("tau_policy", "tau_advantage")

# a sweep's name keys the Optuna study, the MLflow parent run and the report's file: letters, digits and
# . _ + = - (and inner spaces) only, so that it is safe in a filter string and a file name
SweepName = Annotated[
    str,
    Field(
        min_length=1,
        max_length=100,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9 ._+=-]*$",
        description="letters, digits, . _ + = - and inner spaces",
    ),
]
# how a study orders the points it has not run (sweeps/study.py: every point runs either way)
Sampler = Literal["grid", "tpe"]
MAX_GRID_POINTS = 100_000  # a grid larger than this is refused before it is built


@dataclass(frozen=True)
class SweepPoint:
    """One run of a sweep: a method entry of the space (its key), its bands (None for a band the method lacks), its lag
    (staleness k, or η under the bounded schedule) and its seed. Numbers are normalised (bands float, lag and seed
    int), so two points are equal, and hash alike, exactly when they name the same run."""

    method: str
    tau_policy: float | None
    tau_advantage: float | None
    staleness: int
    seed: int

    def __post_init__(self) -> None:
        for band in BANDS:
            value = getattr(self, band)
            object.__setattr__(self, band, None if value is None else float(value))
        object.__setattr__(self, "staleness", int(self.staleness))
        object.__setattr__(self, "seed", int(self.seed))

    @property
    def cell(self) -> tuple[str, float | None, float | None, int]:
        """The point without its seed: the cell its seeds are replicates of."""
        return self.method, self.tau_policy, self.tau_advantage, self.staleness

    def label(self, schedule: str = "lag") -> str:
        """A run's name: `copc tp=2 ta=1 k=4 s=0` (bands the method lacks left out)."""
        bands = "".join(
            f" {short}={getattr(self, b):g}"
            for short, b in (("tp", "tau_policy"), ("ta", "tau_advantage"))
            if getattr(self, b) is not None
        )
        lag = "k" if schedule == "lag" else "eta"
        return f"{self.method}{bands} {lag}={self.staleness} s={self.seed}"


def _distinct(v: list | None) -> list | None:
    if v is not None and len(set(v)) != len(v):
        raise ValueError(f"values must be distinct, got {v}")
    return v


class SweptMethod(BaseModel):
    """One method of a sweep, the band values it is swept over, and the sweep's lags it runs at (all unless given)."""

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="strings")

    name: str = Field(
        "copc", json_schema_extra={"enum": method_names()}, description="a registry method (`copc methods`)"
    )
    tau_policy: list[Band] | None = Field(
        None, min_length=1, description="τ_p values (None: the method's own, or none if it has no τ_p)"
    )
    tau_advantage: list[Band] | None = Field(None, min_length=1, description="τ_a values (None: as τ_p)")
    anchor: Anchor | None = Field(None, description="reading of the trust region's anchor (None: the method's)")
    staleness: list[Annotated[int, Field(ge=0, le=1024)]] | None = Field(
        None,
        min_length=1,
        description="the sweep's lags this entry runs at (None: every one); two entries of one method, each at its "
        "own lags, give it other bands at other lags",
    )
    label: str | None = Field(
        None,
        min_length=1,
        max_length=60,
        pattern=r"^[A-Za-z0-9_.\[\]=+ -]+$",
        description="name in tables and the report (default: name, with [anchor] if set)",
    )

    _distinct_bands = field_validator("tau_policy", "tau_advantage", "staleness")(
        classmethod(lambda cls, v: _distinct(v))
    )

    @model_validator(mode="after")
    def _valid(self) -> SweptMethod:
        if len(self.tau_policy or [None]) * len(self.tau_advantage or [None]) > MAX_GRID_POINTS:
            return self  # the space refuses it by its size, before anything is built (each pair took ~28 µs here)
        for tp, ta in self.bands():
            MethodConfig(name=self.name, tau_policy=tp, tau_advantage=ta, anchor=self.anchor)  # names the problem
        return self

    @property
    def key(self) -> str:
        return self.label or (f"{self.name}[{self.anchor}]" if self.anchor else self.name)

    def bands(self) -> list[tuple[float | None, float | None]]:
        return list(itertools.product(self.tau_policy or [None], self.tau_advantage or [None]))

    def lags(self, staleness: list[int]) -> list[int]:
        """The sweep's staleness levels this entry runs at: its own if it names them, an on-policy method 0 only."""
        mine = staleness if self.staleness is None else [k for k in staleness if k in self.staleness]
        return [k for k in mine if k == 0 or not preset(self.name).on_policy]


class SweepSpace(BaseModel):
    """A joint grid over methods (each with its (τ_p, τ_a) values) × staleness × seed, and how to score a run.

    Staleness is a controlled lag k (`schedule: lag`) or a bound η on free-running sampling
    (`schedule: bounded`, whose trials run on the Ray runtime, one at a time). The older one-method form
    (`method`, `tau_policy`, `tau_advantage` at the top) is read as a one-entry `methods`; band lists at
    the top apply to every listed method that has that band and gives none of its own.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="strings")

    methods: list[SweptMethod] = Field(
        default_factory=lambda: [SweptMethod(tau_policy=[1.5, 2.0, 4.0], tau_advantage=[1.0, 2.0, 4.0])],
        min_length=1,
        max_length=100,
    )
    staleness: list[Annotated[int, Field(ge=0, le=1024)]] = Field(default_factory=lambda: [0, 4], min_length=1)
    schedule: Literal["lag", "bounded"] = Field(
        "lag",
        description="lag: staleness values are controlled lags k; "
        "bounded: they are staleness bounds η (free-"
        "running sampling on the Ray runtime)",
    )
    seeds: list[Annotated[int, Field(ge=0, le=2**31 - 1)]] = Field(default_factory=lambda: [0], min_length=1)
    steps: int = Field(60, ge=1, le=1_000_000)
    objective: Literal["final", "peak", "auc"] = "final"
    collapse_penalty: float = Field(0.5, ge=0.0, le=1.0, description="subtracted from a collapsed run's score")
    warm_start_per_seed: bool = Field(
        False,
        description="each seed its own SFT warm start (warm_start.seed = the run's seed, one cached per seed): the "
        "seed axis then varies the starting model as well as RL sampling; the held-out set stays fixed",
    )

    @model_validator(mode="before")
    @classmethod
    def _one_method_form(cls, data: Any) -> Any:  # noqa: C901 — reads the older one-method JSON form: one branch per shape it accepts
        if not isinstance(data, dict):
            return data
        data = dict(data)
        shared = {b: data.pop(b) for b in BANDS if b in data}
        if "method" in data:
            if "methods" in data:
                raise ValueError("give `methods` or `method`, not both")
            data["methods"] = [data.pop("method")]
        if not shared:
            return data
        given = data.get("methods", [{"name": "copc"}])
        if not isinstance(given, list):
            return data  # the field's own validation names the problem
        entries = []
        for m in given:
            m = {"name": m} if isinstance(m, str) else (m.model_dump() if isinstance(m, SweptMethod) else m)
            if not isinstance(m, dict) or not isinstance(m.get("name", "copc"), str):
                return data
            entries.append(dict(m))
        for band, values in shared.items():
            takers = [m for m in entries if has_band(preset(m.get("name", "copc")), band) and m.get(band) is None]
            if values is not None and not takers and not any(m.get(band) for m in entries):
                raise ValueError(f"{band} given, but no method of the sweep has that band")
            for m in takers:
                m[band] = values
        data["methods"] = entries
        return data

    @field_validator("methods", mode="before")
    @classmethod
    def _names(cls, v: Any) -> Any:
        return [{"name": m} if isinstance(m, str) else m for m in v] if isinstance(v, list) else v

    @field_validator("staleness", "seeds")
    @classmethod
    def _distinct_levels(cls, v: list) -> list:
        return _distinct(v)

    @model_validator(mode="after")
    def _valid_points(self) -> SweepSpace:
        for a, b in itertools.combinations(self.methods, 2):
            if a.key != b.key:
                continue
            lags = set(a.staleness or self.staleness) & set(b.staleness or self.staleness) & set(self.staleness)
            if (a.name, a.anchor) != (b.name, b.anchor) or lags:
                raise ValueError(
                    "methods must be distinct (give a `label` to tell two entries apart, or each entry of one method "
                    f"its own `staleness`), got {a.key} twice"
                )
        size = sum(len(m.bands()) * len(m.lags(self.staleness)) for m in self.methods) * len(self.seeds)
        if size > MAX_GRID_POINTS:
            raise ValueError(f"the grid has {size:,} points; at most {MAX_GRID_POINTS:,} are allowed")
        if size == 0:
            raise ValueError(
                "the grid is empty (an on-policy method runs at staleness 0 only, an entry with lags of its own at "
                "those only)"
            )
        return self

    def method(self, key: str) -> SweptMethod:
        """The entry of this key (entries of one key share their method and reading: any one of them)."""
        return next(m for m in self.methods if m.key == key)

    def method_keys(self) -> list[str]:
        """The methods' keys, each once, in the order of their entries. (Not `keys`: `dict(space)`, as Prefect reads a
        flow's pydantic parameters, would take the model for a mapping.)"""
        return list(dict.fromkeys(m.key for m in self.methods))

    def grid(self) -> list[SweepPoint]:
        """Every point of the space, methods first, seeds last."""
        return [
            SweepPoint(m.key, tp, ta, k, s)
            for m in self.methods
            for tp, ta in m.bands()
            for k in m.lags(self.staleness)
            for s in self.seeds
        ]

    def run_config(self, base: RunConfig, point: SweepPoint) -> RunConfig:
        entry = self.method(point.method)
        lag = "train.staleness" if self.schedule == "lag" else "train.eta"
        reading = {"method.anchor": entry.anchor} if entry.anchor else {}
        return with_overrides(
            base,
            {
                "method.name": entry.name,
                "method.tau_policy": point.tau_policy,
                "method.tau_advantage": point.tau_advantage,
                **reading,
                lag: point.staleness,
                "train.seed": point.seed,
                "train.steps": self.steps,
                **({"warm_start.seed": point.seed} if self.warm_start_per_seed else {}),
            },
        )

    def score(self, summary: RunSummary) -> float:
        """The objective of one run: final / peak / auc held-out accuracy, minus the penalty when it collapsed."""
        return objective_value(summary, self.objective, self.collapse_penalty)


def objective_value(summary: RunSummary, objective: str, collapse_penalty: float) -> float:
    score = {"final": summary.final_accuracy, "peak": summary.peak_accuracy, "auc": summary.auc_accuracy}[objective]
    return score - (collapse_penalty if summary.collapsed else 0.0)


def objective_name(space: SweepSpace) -> str:
    """The objective in words: `final accuracy − 0.5 if collapsed`."""
    return f"{space.objective} accuracy − {space.collapse_penalty:g} if collapsed"


def parse_methods(text: str) -> list[dict[str, str]]:
    """'copc,copc[behavior],async_ppo' → SweptMethod fields (a reading of the trust region's anchor in brackets)."""
    out = []
    for part in text.split(","):
        name, _, rest = part.strip().partition("[")
        entry = {"name": name}
        if rest:
            if not rest.endswith("]"):
                raise ValueError(f"methods: {part!r} is not NAME or NAME[ANCHOR]")
            entry["anchor"] = rest[:-1]
        out.append(entry)
    return out


def methods_notice(space: SweepSpace, grown: SweepSpace, methods: str | None, named: str = "--methods") -> str | None:
    """What `grown = with_axes(space, methods, ...)` did without a word, said: a method named otherwise than the space's
    entries of it (`copc` where a preset has `copc[recomputed]`, ...) is a new entry at the registry's defaults, not
    those entries' cells; a method of the grown sweep with no point at its lags (an on-policy one at k > 0, entries at
    lags of their own) does not run. `named`: what the methods axis is called where it was given (`--methods`, the
    form's `methods`). None when neither happened."""
    lines = []
    for m in parse_methods(methods) if methods else []:  # every name valid: `grown` was made of them
        key = SweptMethod(**m).key
        spelled = [k for k in space.method_keys() if space.method(k).name == m["name"]]
        if key not in spelled and spelled:
            lines.append(
                f"{named}: {key} is not an entry of this sweep (it has {', '.join(spelled)}): it runs as a new "
                "entry, a band not given taking the registry's default, not those entries' cells"
            )
    running = {p.method for p in grown.grid()}
    for key in grown.method_keys():
        if key not in running:
            own = sorted({k for e in grown.methods if e.key == key for k in e.staleness or []})
            why = (
                f"its entries run at k = {', '.join(map(str, own))} only"
                if own
                else "an on-policy method runs at 0 only"
            )
            lines.append(f"{key} has no point at staleness {grown.staleness} ({why}): it does not run")
    return "\n".join(lines) or None


def with_axes(
    space: SweepSpace,
    methods: str | None = None,
    tau_policy: list[float] | None = None,
    tau_advantage: list[float] | None = None,
    staleness: list[int] | None = None,
    seeds: list[int] | None = None,
    steps: int | None = None,
) -> SweepSpace:
    """`space` with the axes given replaced (`copc sweep`'s flags, the Prefect form's fields), re-validated; band values
    apply to every method of the sweep that has that band; `methods` naming a method of the space keeps its bands.
    Raises ValueError naming what is wrong."""
    data = space.model_dump(mode="json")
    if methods is not None:  # a method the space has keeps its entry (its bands: a preset's cells); a new one, defaults
        has: dict[str, list[dict]] = {}
        for entry in space.methods:
            has.setdefault(entry.key, []).append(entry.model_dump(mode="json"))
        named = [(m, SweptMethod(**m).key if m["name"] in method_names() else None) for m in parse_methods(methods)]
        keys = [key or m["name"] for m, key in named]
        if twice := sorted({key for key in keys if keys.count(key) > 1}):
            raise ValueError(f"methods: {', '.join(twice)} named twice")
        data["methods"] = [e for m, key in named for e in has.get(key, [m])]
    for band, values in zip(BANDS, (tau_policy, tau_advantage)):
        if values is None:
            continue
        takers = [m for m in data["methods"] if m["name"] in method_names() and has_band(preset(m["name"]), band)]
        if not takers:
            raise ValueError(f"{band} given, but no method of the sweep has that band")
        for m in takers:
            m[band] = values
    for key, value in (("staleness", staleness), ("seeds", seeds), ("steps", steps)):
        if value is not None:
            data[key] = value
    return SweepSpace.model_validate(data)
