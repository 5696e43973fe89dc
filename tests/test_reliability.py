"""Reliability and security cases of docs/RELIABILITY.md that no other module's tests cover.

Invalid configurations are generated (hypothesis) for the config tree, the flows' parameter models,
the sweep spaces and the CLI; each must be refused with a validation error naming the field before
anything starts, leaving no MLflow or Optuna store behind. Non-finite values are injected into the
three inputs of an update. A `copc train` killed with SIGKILL (in process, or with its whole local
Ray) resumes and finishes identically.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mlflow.tracking import MlflowClient
from pydantic import ValidationError

from copc_core.config import RunConfig, with_overrides
from copc_core.rl.methods import METHODS
from tests.conftest import cache_warm_start, in_process, tiny_config

below_one = st.one_of(st.floats(max_value=0.999, allow_nan=False, allow_infinity=True), st.just(math.nan))
negative_int = st.integers(max_value=-1)
unknown_method = st.text(min_size=1, max_size=12).filter(lambda s: s not in METHODS)

# (dotted RunConfig path, invalid value): every family the issue names
INVALID_OVERRIDES = st.one_of(
    st.tuples(st.just("method.tau_policy"), below_one),
    st.tuples(st.just("method.tau_advantage"), below_one),
    st.tuples(st.just("train.staleness"), negative_int),
    st.tuples(st.just("method.name"), unknown_method),
    st.tuples(st.just("train.batch_size"), st.integers(max_value=0)),
    st.tuples(st.just("train.lr"), st.one_of(st.just(math.nan), st.floats(max_value=0.0), st.floats(min_value=1.0))),
    st.tuples(st.just("train.minibatches"), st.integers(min_value=3, max_value=127).filter(lambda m: 128 % m)),
)


def _named(err: ValidationError, path: str) -> bool:
    """The error names the field: by its location, or (for cross-field rules) in its message."""
    leaf = path.split(".")[-1]
    return any(
        leaf in ".".join(map(str, e["loc"]))
        or leaf in e["msg"]
        or (leaf == "name" and "method" in e["msg"])
        or (leaf == "minibatches" and "minibatches" in e["msg"])
        for e in err.errors()
    )


@settings(max_examples=150, deadline=None)
@given(INVALID_OVERRIDES)
def test_invalid_run_configs_are_refused_naming_the_field(case):
    path, value = case
    with pytest.raises(ValidationError) as info:
        with_overrides(RunConfig(), {path: value})
    assert _named(info.value, path), (path, value, info.value.errors())


INVALID_SPACES = st.one_of(
    st.fixed_dictionaries({"tau_policy": st.lists(below_one, min_size=1, max_size=3)}),
    st.fixed_dictionaries({"tau_advantage": st.lists(below_one, min_size=1, max_size=3)}),
    st.fixed_dictionaries({"staleness": st.lists(negative_int, min_size=1, max_size=3)}),
    st.fixed_dictionaries({"seeds": st.lists(negative_int, min_size=1, max_size=3)}),
    st.fixed_dictionaries({"method": unknown_method}),
    st.fixed_dictionaries({"steps": st.integers(max_value=0)}),
    st.fixed_dictionaries({"tau_policy": st.just([])}),
    st.fixed_dictionaries({"staleness": st.integers(0, 8).map(lambda k: [k, k])}),
)


@settings(max_examples=100, deadline=None)
@given(INVALID_SPACES)
def test_invalid_sweep_spaces_are_refused_naming_the_field(bad):
    from sweeps.space import SweepSpace

    with pytest.raises(ValidationError) as info:
        SweepSpace(**bad)
    (field,) = bad
    assert _named(info.value, field), (bad, info.value.errors())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(
        st.tuples(st.just("TrainParams"), INVALID_OVERRIDES.map(lambda c: ({"config": _nested(*c)}, c[0]))),
        st.tuples(
            st.just("TrainParams"),
            st.text(max_size=8)
            .filter(lambda s: s not in ("inprocess", "ray"))
            .map(lambda r: ({"runtime": r}, "runtime")),
        ),
        st.tuples(st.just("SweepParams"), INVALID_SPACES.map(lambda b: ({"space": b}, next(iter(b))))),
        st.tuples(
            st.just("SweepParams"),
            st.text(max_size=6).filter(lambda s: s not in ("grid", "tpe")).map(lambda s: ({"sampler": s}, "sampler")),
        ),
        st.tuples(st.just("ReportParams"), st.just(({"sweeps": []}, "sweeps"))),
        st.tuples(
            st.just("AnalysisParams"),
            st.lists(below_one, min_size=1, max_size=3).map(lambda v: ({"spec": {"tau_policy": v}}, "tau_policy")),
        ),
        st.tuples(
            st.just("AnalysisParams"),
            st.one_of(st.just(math.nan), st.floats(max_value=-1e-9)).map(
                lambda v: ({"spec": {"critic_error": v}}, "critic_error")
            ),
        ),
    )
)
def test_invalid_flow_parameters_are_refused_naming_the_field(case):
    from flows import prefect_flows

    model, (payload, field) = case
    with pytest.raises(ValidationError) as info:
        getattr(prefect_flows, model).model_validate(payload)
    assert _named(info.value, field), (model, payload, info.value.errors())


def _nested(path: str, value) -> dict:
    out: dict = {}
    node = out
    *parents, leaf = path.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = value
    return out


CLI_CASES = st.one_of(
    st.tuples(
        st.just("train"),
        st.sampled_from(["--tau-policy", "--tau-advantage"]),
        st.sampled_from(["0.5", "nan", "-inf", "-3", "0.999"]),
    ),
    st.tuples(st.just("train"), st.just("--staleness"), negative_int.map(str)),
    st.tuples(st.just("train"), st.just("--batch-size"), st.sampled_from(["0", "-4", "31", "127"])),
    st.tuples(
        st.just("train"),
        st.just("--method"),
        st.from_regex(r"[a-z_]{1,10}", fullmatch=True).filter(lambda s: s not in METHODS),
    ),
    st.tuples(st.just("sweep"), st.just("--space"), INVALID_SPACES.map(json.dumps)),
    st.tuples(
        st.just("analyze"),
        st.sampled_from(["--tau-policy", "--tau-advantage"]),
        st.lists(st.sampled_from(["0.5", "nan", "x", "1,,"]), min_size=1, max_size=2).map(",".join),
    ),
    st.tuples(st.just("analyze"), st.just("--staleness"), st.sampled_from(["-1", "nan", "inf", "0.5,0.5"])),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(CLI_CASES)
def test_invalid_cli_input_exits_2_before_anything_is_written(case):
    from typer.testing import CliRunner

    from flows.cli import app

    command, option, value = case
    with tempfile.TemporaryDirectory() as tmp:
        data = pathlib.Path(tmp) / "data"
        args = [command]
        if option == "--space":
            (pathlib.Path(tmp) / "space.json").write_text(value)
            args += ["--space", str(pathlib.Path(tmp) / "space.json")]
        else:
            args += [f"{option}={value}"]
        result = CliRunner().invoke(
            app, args, env={"COPC_DATA_DIR": str(data), "MLFLOW_TRACKING_URI": "", "PREFECT_API_URL": ""}
        )
        assert result.exit_code == 2, (args, result.output)
        assert "Traceback" not in result.output and (
            "error" in result.output.lower() or "Invalid value" in result.output
        )
        written = sorted(str(p.relative_to(data)) for p in data.rglob("*")) if data.exists() else []
        assert not [w for w in written if w.startswith(("mlflow", "optuna", "runs", "cache", "mlartifacts"))], written


# ---- non-finite values in the three inputs of an update ----

POISONED_STEP = 2  # the third learner update (0-based) receives the poison


def test_a_missing_checkpoint_resumes_from_the_previous_one_with_a_warning(tiny_warm_state, tmp_path):
    """`checkpoint.pt` gone, `checkpoint.prev.pt` there: the run retrained from step 0 without a word. It resumes from
    the previous checkpoint, says so, and ends where an uninterrupted run ends."""
    from infra.checkpoints import previous_path
    from infra.local_run import train_in_process
    from tests.test_trainer import strip_times

    class Stop(Exception):
        pass

    cfg = tiny_config(steps=4)
    straight = train_in_process(cfg, tmp_path / "straight", tmp_path / "cache")

    def stop_after_two(trainer, metrics):  # checkpoints after steps 1 and 2 are on disk when it stops
        if trainer.step == 2:
            raise Stop

    run = tmp_path / "run"
    with pytest.raises(Stop):
        train_in_process(cfg, run, tmp_path / "cache", checkpoint_every=1, on_step=stop_after_two)
    (run / "checkpoint.pt").unlink()
    assert previous_path(run / "checkpoint.pt").exists()
    steps = []
    with pytest.warns(RuntimeWarning, match=r"checkpoint\.pt is unusable \(missing\); resuming from the previous one"):
        resumed = train_in_process(cfg, run, tmp_path / "cache", on_step=lambda t, m: steps.append(t.step))
    assert steps == [2, 3, 4]  # from the state after step 1, not from step 0
    timing = {k for k in type(resumed).model_fields if k.startswith("mean_") and k.endswith("_s")}
    assert resumed.model_dump(exclude=timing) == straight.model_dump(exclude=timing), timing
    histories = [json.loads((d / "history.json").read_text())["steps"] for d in (run, tmp_path / "straight")]
    assert strip_times(histories[0]) == strip_times(histories[1])


@pytest.mark.parametrize("target", ["logp_behavior", "rewards", "values"])
def test_non_finite_inputs_stop_the_run_by_name_and_no_nan_reaches_a_checkpoint(
    tiny_warm_state, tmp_path, monkeypatch, target
):
    """Through the real in-process run: rollout log-probs, rewards, or the learner's own value
    forward pass turn non-finite at one step; the run stops there with reason `non_finite`, the
    update is not applied, the checkpoint on disk is all finite, and summary.json says so."""
    from copc_core.train import learner as learner_mod
    from infra.checkpoints import load_checkpoint
    from infra.local_run import train_in_process

    calls = {"n": 0, "poison_values": False}
    step, forward = learner_mod.Learner.step, learner_mod.response_logprobs

    def poisoned_step(self, batch):
        calls["poison_values"] = target == "values" and calls["n"] == POISONED_STEP
        if calls["n"] == POISONED_STEP and target != "values":
            getattr(batch, target)[1, 0] = -math.inf if target == "logp_behavior" else math.nan
        calls["n"] += 1
        return step(self, batch)

    def poisoned_forward(model, batch, temperature):
        logp, values, entropy = forward(model, batch, temperature)
        return logp, (values * math.nan if calls["poison_values"] else values), entropy

    monkeypatch.setattr(learner_mod.Learner, "step", poisoned_step)
    monkeypatch.setattr(learner_mod, "response_logprobs", poisoned_forward)
    cfg = tiny_config(steps=5)
    summary = train_in_process(cfg, tmp_path / "run", tmp_path / "cache", checkpoint_every=1)
    assert calls["n"] == POISONED_STEP + 1  # nothing ran after the poisoned update
    assert summary.collapsed and summary.collapse_reason == "non_finite"
    assert summary.collapse_step == POISONED_STEP and summary.steps_completed == POISONED_STEP
    on_disk = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert on_disk["collapse_reason"] == "non_finite" and on_disk["collapse_step"] == POISONED_STEP
    state = load_checkpoint(tmp_path / "run" / "checkpoint.pt")
    assert state["step"] == POISONED_STEP and state["non_finite_step"] == POISONED_STEP
    tensors = [v for v in _walk(state) if isinstance(v, torch.Tensor) and v.is_floating_point()]
    assert len(tensors) > 10 and all(torch.isfinite(t).all() for t in tensors)
    history = json.loads((tmp_path / "run" / "history.json").read_text())["steps"]
    assert len(history) == POISONED_STEP and all(math.isfinite(v) for r in history for v in r.values())


def _walk(obj):
    if isinstance(obj, dict):
        for v in obj.values():
            yield from _walk(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _walk(v)
    else:
        yield obj


# ---- a killed `copc train` ----

KILLED_RUN = tiny_config(method="copc", staleness=2, steps=24)  # checkpoints at steps 10, 20 and 24


@pytest.fixture(scope="module")
def uninterrupted(tiny_warm_state):
    """The killed run's config trained whole in this process, at the runtimes' one torch thread: both runtimes'
    `copc train` equal it float for float (tests/test_ray_runtime.py holds Ray to the in-process trainer)."""
    trainer = in_process(KILLED_RUN, tiny_warm_state)
    return {"steps": trainer.history, "evals": trainer.evals}


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["inprocess", "ray"])
def test_a_run_killed_mid_way_resumes_from_its_checkpoint_and_ends_identically(
    tmp_path, runtime, tiny_warm_state, uninterrupted
):
    """SIGKILL `copc train` after its first checkpoint (step 10 of 24) — on Ray, the driver with its
    whole process group (raylet, GCS, actors); the same command resumes, and its history and
    evaluations equal those of an uninterrupted run (timings aside)."""
    from infra.checkpoints import load_checkpoint

    cfg = KILLED_RUN
    cfg_file = tmp_path / "cfg.json"
    cfg_file.write_text(cfg.model_dump_json())
    data = tmp_path / "data"
    cache_warm_start(data / "cache", cfg, tiny_warm_state)  # the reference's
    env = dict(os.environ, COPC_DATA_DIR=str(data))
    cmd = [sys.executable, "-m", "flows.cli", "train", "--config", str(cfg_file), "--runtime", runtime]
    killed = tmp_path / "killed"
    proc = subprocess.Popen(
        [*cmd, "--run-dir", str(killed)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (killed / "checkpoint.pt").exists() and proc.poll() is None:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL and not (killed / "summary.json").exists()  # killed mid-way
    checkpoint = load_checkpoint(killed / "checkpoint.pt")
    at_kill = checkpoint["step"]
    assert 0 < at_kill < cfg.train.steps
    out = subprocess.run([*cmd, "--run-dir", str(killed)], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "warm start (SFT)" not in out.stderr  # read from the cache, as the reference's
    resumed = json.loads((killed / "history.json").read_text())

    def strip(records):
        return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in records]

    assert len(resumed["steps"]) == cfg.train.steps
    assert strip(resumed["steps"]) == strip(uninterrupted["steps"])
    assert resumed["evals"] == uninterrupted["evals"]
    # resumed, not restarted: the first steps are the killed process's own records, wall times included
    assert resumed["steps"][:at_kill] == checkpoint["history"]


# ---- a server that is down ----


def _dead_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "command,env_key,needle",
    [
        (
            ["sweep", "--steps", "2", "--tracking-uri", "http://127.0.0.1:{port}"],
            None,
            "MLflow tracking server did not answer",
        ),
        (["report"], "MLFLOW_TRACKING_URI", "MLflow tracking server did not answer"),
        (["analyze"], "PREFECT_API_URL", "Prefect API (PREFECT_API_URL) did not answer"),
    ],
)
@pytest.mark.slow
def test_a_server_that_is_down_is_named_at_start_and_nothing_runs(tmp_path, command, env_key, needle):
    port = _dead_port()
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "PREFECT_API_URL")}
    env["COPC_DATA_DIR"] = str(tmp_path / "data")
    if env_key:
        env[env_key] = f"http://127.0.0.1:{port}" + ("/api" if env_key == "PREFECT_API_URL" else "")
    args = [a.format(port=port) for a in command]
    out = subprocess.run(
        [sys.executable, "-m", "flows.cli", *args], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 2 and needle in out.stderr and f"127.0.0.1:{port}" in out.stderr, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    data = tmp_path / "data"
    assert not data.exists() or not any(data.iterdir())  # no study, no MLflow store, no runs


# ---- issue: what an attacker or an unlucky user found (docs/RELIABILITY.md, "Bad input" and "Valid input") ----


def _cli(args, data, **env):
    from typer.testing import CliRunner

    from flows.cli import app

    return CliRunner().invoke(
        app, args, env={"COPC_DATA_DIR": str(data), "MLFLOW_TRACKING_URI": "", "PREFECT_API_URL": "", **env}
    )


def _nothing_written(data: pathlib.Path) -> bool:
    return not data.exists() or not [
        p for p in data.rglob("*") if p.relative_to(data).parts[0] in ("mlflow.db", "optuna.db", "runs", "cache")
    ]


BAD_CONFIG_FILES = {
    "extra field": (b'{"train": {"stepz": 3}}', "train.stepz"),
    "wrong type": (b'{"train": {"steps": "many"}}', "train.steps"),
    "NaN": (b'{"train": {"lr": NaN}}', "train.lr"),
    "1e999": (b'{"train": {"steps": 1e999}}', "train.steps"),
    "not JSON": (b"steps = 3", "Invalid JSON"),
    "not UTF-8": (b'{"train": {"steps": 3}}\xff\xfe', "not UTF-8"),
    "deep nesting": (b"[" * 100_000 + b"]" * 100_000, "config"),
    "huge": (b" " * (2 << 20), "larger than"),
    "steps 1e12": (b'{"train": {"steps": 1000000000000}}', "train.steps"),
    "batch 1e9": (b'{"train": {"batch_size": 1000000000, "minibatches": 1}}', "train.batch_size"),
    "n_embd 2^20": (b'{"model": {"n_embd": 1048576}}', "model.n_embd"),
    "threads 1e6": (b'{"train": {"torch_threads": 1000000}}', "train.torch_threads"),
    "seed 1e30": (b'{"train": {"seed": 1000000000000000000000000000000}}', "train.seed"),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIG_FILES))
def test_a_bad_config_file_exits_2_naming_the_problem_and_writes_nothing(tmp_path, case):
    content, needle = BAD_CONFIG_FILES[case]
    path = tmp_path / "config.json"
    path.write_bytes(content)
    result = _cli(["train", "--config", str(path)], tmp_path / "data")
    assert result.exit_code == 2, result.output[-2000:]
    assert needle in result.output and "Traceback" not in result.output
    assert _nothing_written(tmp_path / "data")


def test_a_device_as_config_file_is_refused_unread(tmp_path):
    result = _cli(["train", "--config", "/dev/zero"], tmp_path / "data")
    assert result.exit_code == 2 and "larger than" in result.output
    space = _cli(["sweep", "--space", "/dev/zero"], tmp_path / "data")
    assert space.exit_code == 2 and "larger than" in space.output


def test_a_huge_space_is_refused_before_it_is_built(tmp_path, monkeypatch):
    """Refused from its lists' lengths: no band pair of its million is validated (that took 28 s), no point built."""
    import flows.cli  # noqa: F401 — its presets' spaces are built on import, before the count starts
    import sweeps.space

    built = []
    monkeypatch.setattr(sweeps.space, "MethodConfig", lambda **kw: built.append(kw))
    monkeypatch.setattr(sweeps.space.SweepSpace, "grid", lambda self: built.append("grid"))
    path = tmp_path / "space.json"
    path.write_text(
        json.dumps(
            {
                "tau_policy": [1 + i / 1000 for i in range(1000)],
                "tau_advantage": [1 + i / 1000 for i in range(1000)],
                "staleness": list(range(40)),
            }
        )
    )
    result = _cli(["sweep", "--space", str(path)], tmp_path / "data")
    assert result.exit_code == 2 and "40,000,000 points" in result.output
    assert built == []
    assert _nothing_written(tmp_path / "data")


@pytest.mark.parametrize(
    "args,needle",
    [
        (["sweep", "--name", "it's"], "--name"),
        (["sweep", "--name", "../../x"], "--name"),
        (["report", "--sweep", "a'b"], "sweeps"),
        (["hf-tiny", "{tmp}/m", "--layers", "-1"], "--layers"),
        (["hf-tiny", "{tmp}/m", "--hidden", "0"], "--hidden"),
        (["hf-tiny", "{tmp}/m", "--hidden", "66", "--heads", "4"], "multiple of --heads"),
        (["up", "--prefect-port", "99999"], "--prefect-port"),
    ],
)
def test_bad_names_and_numbers_exit_2(tmp_path, args, needle):
    result = _cli([a.format(tmp=tmp_path) for a in args], tmp_path / "data")
    assert result.exit_code == 2, result.output[-2000:]
    assert needle in result.output and "Traceback" not in result.output
    assert _nothing_written(tmp_path / "data") and not (tmp_path / "m").exists()


@pytest.mark.parametrize("damage", ["truncated to half", "64 KiB of random bytes"])
def test_a_damaged_store_is_named_with_what_to_do_and_left_untouched(tmp_path, damage):
    """mlflow.db cut to half (or random bytes) → `copc report`, optuna.db likewise → `copc sweep` and `copc dashboard`:
    a traceback ("database disk image is malformed"), the file not named. Each exits 2 naming the file, the way to
    recover it, and leaves its bytes as they were."""
    import optuna

    data = tmp_path / "data"
    data.mkdir()
    mlflow_db, optuna_db = data / "mlflow.db", data / "optuna.db"
    MlflowClient(f"sqlite:///{mlflow_db}").create_experiment("copc")
    optuna.create_study(study_name="s", storage=f"sqlite:///{optuna_db}")
    sound = {db: db.read_bytes() for db in (mlflow_db, optuna_db)}

    def damaged(db: pathlib.Path) -> bytes:
        body = sound[db][: len(sound[db]) // 2] if damage.startswith("truncated") else os.urandom(64 * 1024)
        db.write_bytes(body)
        return body

    for db, args in (
        (mlflow_db, ["report", "--sweep", "s"]),
        (optuna_db, ["sweep", "--name", "s", "--steps", "1", "--seeds", "0"]),
        (optuna_db, ["dashboard", "--port", "1"]),
        (optuna_db, ["migrate-study", "s"]),
    ):
        for other in sound:  # one damaged store at a time
            other.write_bytes(sound[other])
        body = damaged(db)
        result = _cli(args, data)
        assert result.exit_code == 2, (args, result.output)
        assert f"{db} is damaged" in result.output and ".recover" in result.output, result.output
        assert "Traceback" not in result.output and db.read_bytes() == body  # untouched


def test_a_report_of_nothing_creates_no_store(tmp_path):
    result = _cli(["report", "--sweep", "nope"], tmp_path / "data")
    assert result.exit_code == 2 and "no MLflow store" in result.output
    assert not (tmp_path / "data").exists()  # nothing at all is written for a report of nothing


def test_valid_edge_configs_run(tiny_warm_state):
    """No warm start at all and a single minibatch (the whole batch in one update) are valid, and train."""
    from copc_core.train.trainer import Trainer
    from copc_core.train.warmstart import warm_start

    cfg = with_overrides(tiny_config(steps=2), {"warm_start.steps": 0, "train.minibatches": 1})
    summary = Trainer(cfg, warm_start(cfg)).run()
    assert summary.steps_completed == 2 and not summary.collapse_reason == "non_finite"


def test_a_one_point_grid_runs():
    from copc_core.results import TrialResult
    from sweeps.space import SweepSpace
    from sweeps.study import open_study, pending_points, run_study
    from tests.test_sweeps import summary

    space = SweepSpace(tau_policy=[2.0], tau_advantage=[2.0], staleness=[0], seeds=[0], steps=2)
    with tempfile.TemporaryDirectory() as tmp:
        sweep = open_study("one", f"sqlite:///{tmp}/optuna.db")
        done = run_study(
            sweep,
            pending_points(sweep, space),
            lambda params, on_result: [
                on_result(i, TrialResult(summary(0.5), objective=0.5)) for i in range(len(params))
            ],
        )
        assert [d.state for d in done] == ["COMPLETE"] and pending_points(sweep, space) == []


# ---- flow parameters arrive from the Prefect API: paths and URLs are confined ----


def test_flow_path_parameters_are_confined_to_the_data_folder(tmp_path, monkeypatch):
    from flows.prefect_flows import LOCAL_CALLER, AnalysisParams, ReportParams, SweepParams, TrainParams

    data = tmp_path / "data"
    data.mkdir()
    monkeypatch.setenv("COPC_DATA_DIR", str(data))
    (data / "escape").symlink_to(tmp_path)  # a link inside that points outside
    outside = (
        [ReportParams, {"out": str(tmp_path / "x.sh")}],
        [ReportParams, {"out": "escape/x.sh"}],
        [ReportParams, {"out": "../x.sh"}],
        [TrainParams, {"data_dir": "/etc"}],
        [SweepParams, {"data_dir": str(tmp_path)}],
        [SweepParams, {"storage": f"sqlite:///{tmp_path}/o.db"}],
        [SweepParams, {"tracking_uri": str(tmp_path / "mlruns")}],
        [SweepParams, {"tracking_uri": "ftp://h/x"}],
        [AnalysisParams, {"out": "/tmp/a.html"}],
    )
    for model, params in outside:
        with pytest.raises(ValidationError, match="inside the data folder|unsupported scheme"):
            model.model_validate(params)
        assert model.model_validate(params, context=LOCAL_CALLER)  # the CLI's own user chooses freely
    assert ReportParams(out="reports/r.html").out == str(data / "reports" / "r.html")
    assert SweepParams(storage=f"sqlite:///{data}/optuna.db", tracking_uri="http://127.0.0.1:5000").storage
    for url in ("javascript:alert(1)", "data:text/html,x", 'http://x"onmouseover=1'):
        with pytest.raises(ValidationError, match="mlflow_ui"):
            ReportParams(mlflow_ui=url)
    assert not (tmp_path / "x.sh").exists()


def test_a_band_that_arrives_as_null_is_refused_and_infinity_travels_as_text():
    """`{"method.tau_advantage": -Infinity}` in copc-train's overrides ran with the default band: the Prefect API
    stores parameters through orjson, which writes every non-finite float (and a bare Infinity literal it was sent)
    as null. A null band is refused with the way to say ∞; "inf" runs ∞."""
    import orjson

    from flows.prefect_flows import SweepParams, TrainParams

    for value in (float("inf"), float("-inf"), float("nan")):
        stored = orjson.loads(orjson.dumps({"overrides": {"method.tau_advantage": value, "method.tau_policy": 2.0}}))
        assert stored["overrides"]["method.tau_advantage"] is None  # what the flow receives
        with pytest.raises(ValidationError, match='method.tau_advantage is null.*"inf"'):
            TrainParams.model_validate(stored)
        with pytest.raises(ValidationError, match="method.tau_advantage is null"):
            SweepParams.model_validate(stored)
    as_text = orjson.loads(orjson.dumps({"overrides": {"method.tau_advantage": "inf", "method.tau_policy": 2.0}}))
    method = TrainParams.model_validate(as_text).run_config().method
    assert method.tau_advantage == float("inf") and method.tau_policy == 2.0
    assert TrainParams(overrides={"train.eta": None}).run_config().train.eta is None  # other nulls keep their meaning


def test_a_store_url_names_a_file_inside_the_data_folder_whatever_its_form(tmp_path, monkeypatch):
    """SQLite's URI mode (`file:…?mode=rwc&uri=true`) opened a file outside the data folder, and a relative
    `sqlite:///rel.db` passed the check against the data folder but was opened in the server's working directory.
    Each form is refused, or rewritten to the absolute file inside the data folder that the check saw."""
    from flows.prefect_flows import SweepParams

    data, cwd = tmp_path / "data", tmp_path / "cwd"
    data.mkdir(), cwd.mkdir()
    monkeypatch.setenv("COPC_DATA_DIR", str(data))
    monkeypatch.chdir(cwd)
    for storage in (
        f"sqlite:///file:{tmp_path}/o.db?mode=rwc&uri=true",
        "sqlite:///file:o.db?mode=rwc&uri=true",
        "sqlite:///o.db?uri=true",
        "sqlite://host/o.db",
        "sqlite://",
    ):
        with pytest.raises(ValidationError, match="storage: "):
            SweepParams(storage=storage)
    assert SweepParams(storage="sqlite:///rel.db").storage == f"sqlite:///{data / 'rel.db'}"
    assert SweepParams(storage=f"sqlite:///{data}/sub/../o.db").storage == f"sqlite:///{data / 'o.db'}"
    assert SweepParams(tracking_uri="mlruns").tracking_uri == str(data / "mlruns")
    assert SweepParams(tracking_uri=f"file://{data}/mlruns").tracking_uri == f"file://{data / 'mlruns'}"
    with pytest.raises(ValidationError, match="plain path"):
        SweepParams(tracking_uri=f"file://{data}/m?x=1")
    # what a rewritten URL opens is that file: optuna makes it there, nothing in the working directory
    import optuna

    optuna.create_study(study_name="s", storage=SweepParams(storage="sqlite:///rel.db").storage)
    assert (data / "rel.db").exists() and list(cwd.iterdir()) == []


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(
        st.text(max_size=300),
        st.binary(max_size=300).map(lambda b: b.decode("latin-1")),
        st.recursive(
            st.one_of(st.none(), st.booleans(), st.floats(), st.integers(), st.text(max_size=8)),
            lambda inner: st.one_of(
                st.lists(inner, max_size=4),
                st.dictionaries(
                    st.sampled_from(
                        [
                            "method",
                            "train",
                            "model",
                            "steps",
                            "name",
                            "lr",
                            "tau_policy",
                            "seeds",
                            "staleness",
                            "space",
                            "out",
                        ]
                    ),
                    inner,
                    max_size=4,
                ),
            ),
            max_leaves=12,
        ).map(json.dumps),
    )
)
def test_the_config_space_and_flow_parsers_refuse_anything_with_a_validation_error(text):
    """Fuzzed JSON-ish input for every parser an outsider can reach: it parses, or it is refused with a
    pydantic ValidationError; nothing else escapes (no crash, no hang)."""
    from flows.prefect_flows import AnalysisParams, ReportParams, SweepParams, TrainParams
    from sweeps.space import SweepSpace

    for model in (RunConfig, SweepSpace, TrainParams, SweepParams, ReportParams, AnalysisParams):
        try:
            model.model_validate_json(text)
        except ValidationError:
            pass


@pytest.mark.slow
def test_a_full_disk_stops_train_with_the_file_named_and_the_rerun_completes(tmp_path):
    """A full disk (a 5 MiB tmpfs) ended `copc train` with a traceback (`RuntimeError … unexpected pos` from
    torch.save). The file system's refusal is made here by a file-size limit (RLIMIT_FSIZE, EFBIG) between the sizes
    of the other files (the warm-start cache, MLflow's store) and of the run's checkpoint, so the checkpoint is the
    write refused: exit 2 naming it, no
    traceback, no partial file; the same command with the limit lifted completes."""
    import resource

    cfg = tmp_path / "tiny.json"
    cfg.write_text(tiny_config(steps=4).model_dump_json())
    env = dict(os.environ, MLFLOW_TRACKING_URI="", PREFECT_API_URL="")

    def train(data, limit=None):
        def limited():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

        return subprocess.run(
            [sys.executable, "-m", "flows.cli", "train", "--config", str(cfg)],
            env=env | {"COPC_DATA_DIR": str(data)},
            preexec_fn=limited if limit else None,
            capture_output=True,
            text=True,
            timeout=600,
        )

    sizes = tmp_path / "sizes"  # the files' sizes, from an unlimited run of the same config
    assert train(sizes).returncode == 0
    (warm,) = (sizes / "cache").glob("warmstart-*.pt")
    (checkpoint,) = (sizes / "runs").glob("*/checkpoint.pt")
    others = max(warm.stat().st_size, (sizes / "mlflow.db").stat().st_size)  # the other files it writes, the largest
    assert others < checkpoint.stat().st_size
    data = tmp_path / "data"
    full = train(data, (others + checkpoint.stat().st_size) // 2)
    assert full.returncode == 2, full.stderr[-3000:]
    assert "Traceback" not in full.stderr and "a write was refused" in full.stderr and "checkpoint.pt" in full.stderr
    run_dir = next((data / "runs").iterdir())
    assert not list(run_dir.glob("*.tmp")) and not (run_dir / "checkpoint.pt").exists()  # nothing half-written
    again = train(data)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["steps_completed"] == 4


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.one_of(
        st.text(max_size=80),
        st.builds(
            lambda scheme, body: f"{scheme}{body}",
            st.sampled_from(["sqlite:///", "sqlite://", "file://", "sqlite:///file:", "sqlite:////", ""]),
            st.text(alphabet="ab./?=&:%~-_/ \\x00", max_size=40),
        ),
    )
)
def test_a_fuzzed_store_url_is_refused_or_names_a_file_inside_the_data_folder(tmp_path_factory, text):
    """Whatever the copc-sweep form's `storage` and `tracking_uri` say, the store they open is a file inside the data
    folder, a server the caller names (http(s), PostgreSQL, MySQL), or a validation error."""
    from flows.prefect_flows import SweepParams
    from infra.settings import data_root

    before = os.environ.get("COPC_DATA_DIR")
    os.environ["COPC_DATA_DIR"] = str(tmp_path_factory.getbasetemp() / "fuzz-data")
    try:
        root = data_root()
        for field in ("storage", "tracking_uri"):
            try:
                value = getattr(SweepParams(**{field: text}), field)
            except (ValidationError, ValueError):
                continue
            scheme = value.split("://", 1)[0] if "://" in value else ""
            if scheme in ("http", "https", "postgresql", "postgresql+psycopg2", "mysql", "mysql+pymysql", "databricks"):
                continue
            path = pathlib.Path(value.removeprefix("sqlite:///").removeprefix("file://"))
            assert path.is_absolute() and (path == root or root in path.parents), (text, value)
            assert "?" not in value, (text, value)
    finally:
        if before is None:
            os.environ.pop("COPC_DATA_DIR", None)
        else:
            os.environ["COPC_DATA_DIR"] = before
