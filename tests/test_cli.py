import json
import math
import os
import subprocess
import sys

import pytest

from copc_core.config import RunConfig
from tests.conftest import tiny_config


def copc(*args, data_dir, timeout=300, **extra_env):
    """`copc ARGS` as a user runs it: a process of its own (the entry point's exit codes, a fresh interpreter)."""
    env = dict(os.environ, COPC_DATA_DIR=str(data_dir), **extra_env)
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *args], capture_output=True, text=True, env=env, timeout=timeout
    )


def copc_here(*args, data_dir, **extra_env) -> subprocess.CompletedProcess:
    """`copc ARGS` inside this process (typer's test runner), for the checks of arguments that end before anything
    starts: the exit code and output `copc` gives, without ~2 s of interpreter and imports per case; an exception
    other than an exit is raised here (a process would print its traceback).
    `test_the_entry_point_exits_2_on_a_bad_argument_as_the_in_process_runner_does` holds the two to one another."""
    from typer.testing import CliRunner

    from flows.cli import app

    env = {"COPC_DATA_DIR": str(data_dir), "MLFLOW_TRACKING_URI": "", "PREFECT_API_URL": "", **extra_env}
    result = CliRunner().invoke(app, list(args), env=env)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


@pytest.fixture
def used_mlflow_store(tmp_path, used_stores):
    """The data folder's MLflow store as a folder used before holds it (~1.4 CPU-s of migrations fewer a test): for the
    tests about something else; the tiny run end to end starts on a fresh folder."""
    used_stores.mlflow(tmp_path / "mlflow.db")


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--staleness", "-1"], "train.staleness"),
        (["--method", "ppo9"], "valid methods: sync_ppo"),
        (["--tau-policy", "0.5"], "method.tau_policy"),
        (["--tau-advantage", "nan"], "method.tau_advantage"),
        (["--method", "sync_ppo", "--staleness", "4"], "on-policy"),
        (["--method", "tis", "--tau-policy", "2"], "has no tau_policy"),
        (["--batch-size", "0"], "train.batch_size"),
        (["--batch-size", "31"], "divisible by minibatches"),
        (["--task", "maze"], "unknown task 'maze'"),
        (["--preset", "huge"], "unknown run preset 'huge'; presets: embedded-default"),
        (["--hf-model", ""], "model.hf_model"),
        (["--device", "tpu"], "Invalid value for '--device'"),
        (["--rollout-workers", "0"], "resources.rollout_workers"),
        (["--preset", "scale-out-qwen2.5-0.5b"], "needs a GPU machine"),
        (["--anchor", "proximal"], "Invalid value for '--anchor'"),
        (["--lag", "sometimes"], "Invalid value for '--lag'"),
        (["--eta", "2", "--staleness", "4"], "two schedules"),
        (["--eta", "-1"], "train.eta"),
        (["--critic-warmup-steps", "-3"], "train.critic_warmup_steps"),
    ],
)
def test_bad_arguments_exit_2_with_a_clear_message_before_anything_runs(tmp_path, args, needle):
    out = copc_here("train", *args, data_dir=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert needle in out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "runs").exists() and not (tmp_path / "cache").exists()


def test_a_rollout_engine_that_cannot_run_here_exits_2_before_anything_runs(tmp_path):
    """The default venv has no vLLM: a vLLM run says so, and how to get it, before the warm start."""
    from copc_core.engines.vllm_engine import vllm_unavailable_reason

    reason = vllm_unavailable_reason("cpu")
    if reason is None:
        pytest.skip("vLLM runs here")
    cfg = tmp_path / "vllm.json"
    cfg.write_text(
        RunConfig(
            model={"backend": "hf", "hf_model": str(tmp_path / "m"), "device": "cpu", "rollout_engine": "vllm"}
        ).model_dump_json()
    )
    out = copc("train", "--config", str(cfg), data_dir=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"the vLLM rollout engine cannot run here: {reason}" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "runs").exists()  # nothing started


@pytest.mark.slow
def test_tiny_run_end_to_end_and_rerun_resumes(tmp_path):
    cfg_file = tmp_path / "tiny.json"
    cfg_file.write_text(tiny_config(method="copc", staleness=1, steps=3).model_dump_json())
    run_dir = tmp_path / "run"
    out = copc("train", "--config", str(cfg_file), "--run-dir", str(run_dir), data_dir=tmp_path)
    assert out.returncode == 0, out.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps_completed"] == 3
    assert "warm start (SFT)" in out.stderr and "RL" in out.stderr  # progress bars
    assert len(list((tmp_path / "cache").glob("warmstart-*.pt"))) == 1
    again = copc("train", "--config", str(cfg_file), "--run-dir", str(run_dir), data_dir=tmp_path)
    assert again.returncode == 0
    assert json.loads((run_dir / "summary.json").read_text()) == summary
    # the run is in MLflow (kind train) with its curves and summary, once: the rerun found it
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("copc")
    (run,) = client.search_runs([exp.experiment_id], "tags.copc_kind = 'train'")
    assert run.info.run_id in out.stdout and run.info.run_id in again.stdout
    assert run.data.metrics["summary/steps_completed"] == 3 and run.data.tags["run_dir"] == str(run_dir)
    assert len(client.get_metric_history(run.info.run_id, "reward/mean")) == 3
    assert run.data.params["train.staleness"] == "1" and run.data.tags["machine.python"]


@pytest.mark.slow
def test_a_damaged_checkpoint_resumes_from_the_previous_one_or_exits_2_naming_it(tmp_path, used_mlflow_store):
    from infra.checkpoints import previous_path

    cfg_file = tmp_path / "tiny.json"
    cfg_file.write_text(tiny_config(method="copc", staleness=1, steps=12).model_dump_json())  # checkpoints at 10, 12
    run_dir = tmp_path / "run"
    assert copc("train", "--config", str(cfg_file), "--run-dir", str(run_dir), data_dir=tmp_path).returncode == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    checkpoint = run_dir / "checkpoint.pt"
    data = bytearray(checkpoint.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 4096] = bytes(4096)  # 4 KB zeroed inside the file
    checkpoint.write_bytes(bytes(data))
    again = copc("train", "--config", str(cfg_file), "--run-dir", str(run_dir), data_dir=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "unusable" in again.stderr and "previous one" in again.stderr
    timeless = lambda d: {k: v for k, v in d.items() if not k.startswith("mean_") or not k.endswith("_s")}  # noqa: E731
    # the same run, steps 11 and 12 taken again from the step-10 checkpoint
    assert timeless(json.loads((run_dir / "summary.json").read_text())) == timeless(summary)
    for path in (checkpoint, previous_path(checkpoint)):
        path.write_bytes(b"")
    broken = copc("train", "--config", str(cfg_file), "--run-dir", str(run_dir), data_dir=tmp_path)
    assert broken.returncode == 2 and str(checkpoint) in broken.stderr and "Traceback" not in broken.stderr


def test_methods_lists_the_registry(tmp_path):
    from copc_core.rl.methods import METHODS, describe, method_spec

    out = copc_here("methods", data_dir=tmp_path)
    assert out.returncode == 0
    for name, row in METHODS.items():  # every row: what it runs (anchor, rule, loss, estimator) and its source
        assert f"{name}\n    {row.description}\n    runs: {describe(method_spec(name))}" in out.stdout
        assert f"source: {row.source}" in out.stdout
    # copc at its default band and reading
    assert f"copc\n    {METHODS['copc'].description}\n    runs: anchor recomputed; ρ ∈ [0.5, 2]" in out.stdout
    for reading in ("behavior", "recomputed", "interpolated"):
        assert f"    {reading} " in out.stdout


@pytest.mark.slow
def test_train_flags_reach_the_config(tmp_path, used_mlflow_store):
    cfg_file = tmp_path / "tiny.json"
    cfg_file.write_text(tiny_config(method="copc", staleness=1, steps=2).model_dump_json())
    run_dir = tmp_path / "run"
    out = copc(
        "train",
        "--config",
        str(cfg_file),
        "--run-dir",
        str(run_dir),
        "--anchor",
        "interpolated",
        "--lag",
        "uniform",
        "--separate-critic",
        "--critic-warmup-steps",
        "2",
        data_dir=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    config = json.loads((run_dir / "config.json").read_text())
    assert config["method"]["anchor"] == "interpolated" and config["train"]["lag"] == "uniform"
    assert config["model"]["separate_critic"] and config["train"]["critic_warmup_steps"] == 2
    assert "critic warm-up" in out.stderr  # its progress bar
    summary = json.loads((run_dir / "summary.json").read_text())
    history = json.loads((run_dir / "history.json").read_text())
    assert len(history["critic_warmup"]) == 2
    assert summary["critic_warmup_explained_var"] == history["critic_warmup"][-1]["critic/explained_var"]


@pytest.mark.slow
def test_tiny_run_on_the_ray_runtime(tmp_path, used_mlflow_store):
    cfg_file = tmp_path / "tiny.json"
    cfg_file.write_text(tiny_config(method="copc", staleness=1, steps=2).model_dump_json())
    out = copc(
        "train", "--config", str(cfg_file), "--run-dir", str(tmp_path / "run"), "--runtime", "ray", data_dir=tmp_path
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps_completed"] == 2 and summary["staleness_max"] == 1.0


def test_the_entry_point_exits_2_on_a_bad_argument_as_the_in_process_runner_does(tmp_path):
    """What `copc_here` stands for: a process of its own gives the same exit code and message."""
    args = ("train", "--runtime", "spark")
    out, here = copc(*args, data_dir=tmp_path), copc_here(*args, data_dir=tmp_path)
    assert out.returncode == here.returncode == 2 and "Invalid value for '--runtime'" in out.stderr, out.stderr
    assert out.stderr.splitlines()[-3:] == here.stderr.splitlines()[-3:]


def test_report_of_an_unknown_sweep_exits_2_naming_it(tmp_path):
    out = copc_here("report", "--sweep", "nope", data_dir=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "no MLflow store at" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "reports").exists() and not (tmp_path / "mlflow.db").exists()
    from infra.tracking import Tracker

    Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", artifact_dir=tmp_path / "mlartifacts").parent_run("known", {})
    out = copc_here("report", "--sweep", "nope", data_dir=tmp_path)
    assert out.returncode == 2 and "no sweep named 'nope'" in out.stderr and "known: known" in out.stderr
    assert not (tmp_path / "reports").exists()


@pytest.mark.slow
def test_train_task_search_switches_the_task_section(tmp_path, used_mlflow_store):
    from copc_core.config import SearchTaskConfig, WarmStartConfig

    cfg = tiny_config(steps=1).model_copy(update={"warm_start": WarmStartConfig(steps=2, batch_size=8)})
    cfg_file = tmp_path / "tiny.json"
    cfg_file.write_text(cfg.model_dump_json())
    out = copc(
        "train", "--config", str(cfg_file), "--task", "search", "--run-dir", str(tmp_path / "run"), data_dir=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert "task search" in out.stdout
    written = json.loads((tmp_path / "run" / "config.json").read_text())
    assert written["task"] == SearchTaskConfig().model_dump(mode="json")
    assert written["train"] == cfg.model_dump(mode="json")["train"]  # the rest of the file is kept


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--methods", "tis", "--tau-policy", "2"], "no method of the sweep has that band"),
        (["--methods", "nope"], "unknown method 'nope'"),
        (["--methods", "copc[sideways]"], "anchor"),
        (["--methods", "copc[behavior"], "is not NAME or NAME[ANCHOR]"),
        (["--methods", "sync_ppo", "--staleness", "4"], "the grid is empty"),
        (["--seeds", "0,x"], "--seeds takes comma-separated integers"),
        (["--staleness", "-1"], "staleness"),
        (["--tau-advantage", "0.5"], "tau_advantage"),
        (["--max-parallel", "0"], "max-parallel"),
    ],
)
def test_sweep_axis_flags_are_checked_before_anything_runs(tmp_path, args, needle):
    out = copc_here("sweep", *args, data_dir=tmp_path)
    assert out.returncode == 2 and needle in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "optuna.db").exists() and not (tmp_path / "mlflow.db").exists()


def test_sweep_axis_flags_build_the_space():
    from flows.cli import _space_with_axes
    from sweeps.space import SweepSpace

    space = _space_with_axes(SweepSpace(), "copc,copc[behavior],tis", "1.5,inf", "1,1.25", "0,16", "0,1,2", 7)
    assert [m.key for m in space.methods] == ["copc", "copc[behavior]", "tis"]
    assert space.methods[1].tau_policy == [1.5, float("inf")] and space.methods[1].tau_advantage == [1.0, 1.25]
    assert space.methods[2].tau_policy is None and space.staleness == [0, 16] and space.seeds == [0, 1, 2]
    assert space.steps == 7 and len(space.grid()) == (4 + 4 + 1) * 2 * 3


def test_sweep_ray_address_is_the_ray_its_trials_run_on(tmp_path, monkeypatch):
    """`copc sweep --ray-address` sets $RAY_ADDRESS, which the sweep's `init_ray` joins (tests/test_ray_runtime.py)."""
    import contextlib

    import flows.cli
    import flows.prefect_flows

    seen = []

    def flow(params):
        seen.append(os.environ["RAY_ADDRESS"])
        raise SystemExit(0)

    monkeypatch.setenv("RAY_ADDRESS", "")  # restored after the test, whatever the command sets
    monkeypatch.setattr(flows.cli, "_prefect_api", contextlib.nullcontext)
    monkeypatch.setattr(flows.prefect_flows, "copc_sweep", flow)
    out = copc_here("sweep", "--ray-address", "10.0.0.5:6379", "--steps", "1", "--seeds", "0", data_dir=tmp_path)
    assert out.returncode == 0 and seen == ["10.0.0.5:6379"], out.stdout + out.stderr


def test_sweep_says_when_a_method_named_is_not_the_presets_entry_of_it(tmp_path, monkeypatch):
    """`--methods copc` on a regime preset (whose entries are `copc[reading]`) runs the registry's defaults: said on
    stderr before the sweep starts, and by the Prefect form's flow in its log (SweepParams.methods_notice)."""
    import contextlib
    import types

    import flows.cli
    import flows.prefect_flows
    import flows.sweep_job

    copc_sweep = flows.prefect_flows.copc_sweep
    SweepParams = flows.prefect_flows.SweepParams
    monkeypatch.setattr(flows.cli, "_prefect_api", contextlib.nullcontext)
    monkeypatch.setattr(flows.prefect_flows, "copc_sweep", lambda params: (_ for _ in ()).throw(SystemExit(0)))
    args = ("sweep", "--preset", "regime-search", "--seeds", "0", "--staleness", "8")
    out = copc_here(*args, "--methods", "copc,tis", data_dir=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "--methods: copc is not an entry of this sweep (it has copc[recomputed]" in out.stderr
    assert "copc is not" not in copc_here(*args, "--methods", "copc[recomputed],tis", data_dir=tmp_path).stderr
    idle = copc_here(*args, "--methods", "sync_ppo,tis", data_dir=tmp_path)  # was a StopIteration traceback
    assert idle.returncode == 0 and "sync_ppo has no point at staleness [8]" in idle.stderr, idle.stderr

    said = []  # the Prefect form's flow says it in its log, as the form's field is called

    class Stop(Exception):
        pass

    monkeypatch.setattr(flows.prefect_flows, "get_run_logger", lambda: types.SimpleNamespace(warning=said.append))
    monkeypatch.setattr(flows.sweep_job, "run_sweep", lambda *a, **k: (_ for _ in ()).throw(Stop()))
    with pytest.raises(Stop):
        copc_sweep.fn(SweepParams(preset="regime-search", methods="copc,tis", staleness=[8]))
    assert said == [out.stderr.strip().replace("--methods:", "methods:", 1)]


def test_sweep_with_an_unknown_preset_exits_2_naming_the_presets(tmp_path):
    out = copc_here("sweep", "--preset", "nope", data_dir=tmp_path)
    assert out.returncode == 2 and "unknown sweep preset 'nope'" in out.stderr and "claims-search" in out.stderr
    assert not (tmp_path / "optuna.db").exists() and not (tmp_path / "mlflow.db").exists()


def test_every_sweep_preset_has_a_deployment_with_its_space_and_base():
    from flows.prefect_flows import SweepParams, deployments
    from sweeps.presets import PRESETS

    by_name = {(d.flow_name, d.name): d for d in deployments()}
    for name, (space, base) in PRESETS.items():
        params = SweepParams.model_validate(by_name["copc-sweep", name].parameters["params"])
        assert params.resolved() == (name, space, base) and params.space is None and params.base is None
    assert PRESETS["claims-search"][1].task.name == "search"


def test_every_deployments_parameters_satisfy_the_schema_prefect_checks_them_against():
    """Prefect refuses a deployment whose parameters fail its JSON schema (422): a band of ∞ is written as the
    string "Infinity", which a plain number schema refused, so `copc serve` failed on the regime preset."""
    import jsonschema

    from flows.prefect_flows import deployments
    from sweeps.presets import PRESETS

    assert any(math.isinf(t) for m in PRESETS["regime-tool-math"][0].methods for t in m.tau_advantage or [])
    import orjson  # Prefect's client encodes parameters with orjson

    from flows.prefect_flows import SweepParams, _as_json, copc_sweep

    infinite = SweepParams(tau_advantage=[1.0, math.inf])  # a band of ∞ typed into the sweep form
    extra = copc_sweep.to_deployment(name="inf", parameters={"params": _as_json(infinite)})
    for d in [*deployments(), extra]:
        sent = orjson.loads(orjson.dumps(d.parameters))
        jsonschema.validate(sent, d._parameter_openapi_schema.model_dump_for_openapi())


@pytest.mark.slow
def test_a_tiny_hf_model_is_written_and_trained_through_the_cli(tmp_path, used_mlflow_store):
    """`copc hf-tiny` builds a model from a config (no download); `copc train --hf-model` runs COPC on it."""
    model_dir = tmp_path / "tiny-hf"
    out = copc("hf-tiny", str(model_dir), "--hidden", "32", data_dir=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (model_dir / "config.json").exists() and (model_dir / "tokenizer.json").exists()
    cfg_file = tmp_path / "tiny.json"
    cfg_file.write_text(tiny_config(method="copc", staleness=1, steps=2).model_dump_json())
    out = copc(
        "train",
        "--config",
        str(cfg_file),
        "--hf-model",
        str(model_dir),
        "--run-dir",
        str(tmp_path / "run"),
        data_dir=tmp_path,
        timeout=600,
        HF_HUB_OFFLINE="1",
    )
    assert out.returncode == 0, out.stdout + out.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps_completed"] == 2 and summary["staleness_max"] == 1.0
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["model"]["backend"] == "hf" and saved["model"]["hf_model"] == str(model_dir)


def test_the_run_presets_validate_and_size_the_cluster():
    from copc_core.train.run_presets import RUN_PRESETS

    for name, cfg in RUN_PRESETS.items():
        assert type(cfg).model_validate_json(cfg.model_dump_json()) == cfg
        if name.startswith("scale-out"):
            m, r = cfg.model, cfg.resources
            assert (m.backend, m.rollout_engine, m.device) == ("hf", "vllm", "cuda") and m.hf_model.startswith("Qwen/")
            assert r.rollout_gpus == 1 and r.learner_gpus == 1 and cfg.train.staleness > 0


def test_train_help_shows_the_defaults_of_the_flags_it_leaves_to_the_config(tmp_path):
    from copc_core.train.run_presets import run_preset

    out = copc_here("train", "--help", data_dir=tmp_path, COLUMNS="250")
    d = run_preset("embedded-default")  # what `copc train` runs with no --preset or --config
    for text in (
        f"(default {d.train.lr})",
        f"(default {d.train.steps})",
        f"(default {d.train.lag})",
        f"(default {d.method.name})",
        f"(default {d.method.tau_policy})",
        "(default: the method's; see",  # the anchor
    ):
        assert text in out.stdout, text


def test_sweep_help_names_every_preset_and_shows_the_reading_in_brackets(tmp_path):
    from sweeps.presets import PRESETS

    out = copc_here("sweep", "--help", data_dir=tmp_path, COLUMNS="250")
    assert out.returncode == 0, out.stderr
    for name in PRESETS:
        assert name in out.stdout, name
    assert "copc,copc[behavior],async_ppo,tis" in out.stdout


def test_the_train_form_is_a_preset_and_dotted_overrides_or_a_whole_config():
    from pydantic import ValidationError

    from copc_core.train.run_presets import run_preset
    from flows.prefect_flows import TrainParams

    short = TrainParams(preset="embedded-search", overrides={"method.name": "tis", "train.staleness": 4})
    expected = run_preset("embedded-search").model_dump()
    expected["method"]["name"], expected["train"]["staleness"] = "tis", 4
    expected["method"]["tau_policy"] = expected["method"]["tau_advantage"] = None  # TIS has neither band
    assert short.run_config().model_dump() == expected
    whole = TrainParams(config=tiny_config(steps=2), overrides={"train.seed": 7})
    assert whole.run_config().train.steps == 2 and whole.run_config().train.seed == 7
    with pytest.raises(ValidationError, match="no config field 'stalenes' in 'train.stalenes'"):
        TrainParams(overrides={"train.stalenes": 4})
    with pytest.raises(ValidationError, match="train.staleness"):
        TrainParams(overrides={"train.staleness": -4})
    with pytest.raises(ValidationError, match="preset"):
        TrainParams(preset="huge")


def test_copc_train_by_default_is_a_trial_of_the_default_sweep_and_a_cells_flags_rerun_that_cell():
    """`copc train` ran RunConfig()'s defaults (lr 3e-4, batch 128, shared critic, no critic warm-up), not the study's
    regime the default sweep runs: a run could not be set beside a sweep cell and built a warm start of its own."""
    from copc_core.train.warmstart import warm_start_key
    from flows.cli import train_config
    from sweeps.presets import sweep_preset
    from sweeps.space import SweepPoint, with_axes

    space, base = sweep_preset("embedded-default")
    for p in space.grid():
        flags = {
            "method.tau_policy": p.tau_policy,
            "method.tau_advantage": p.tau_advantage,
            "train.staleness": p.staleness,
            "train.seed": p.seed,
        }
        assert train_config(None, None, None, flags) == space.run_config(base, p)  # the same run, the same hash
    default = train_config(None, None, None, {})
    cell = SweepPoint("copc", 4.0, 1.0, 32, 0)
    assert default.config_hash() == space.run_config(base, cell).config_hash()
    assert warm_start_key(default) == warm_start_key(space.run_config(base, space.grid()[0]))  # its warm start reused
    assert default.model.separate_critic and default.train.critic_warmup_steps == 100 and default.train.lr == 1e-4
    # the search task's default: the same cell of `copc sweep --preset regime-search --methods copc`
    search_space, search_base = sweep_preset("regime-search")
    point = SweepPoint("copc", 4.0, 1.0, 32, 0)
    assert train_config(None, None, "search", {}) == with_axes(search_space, "copc").run_config(search_base, point)


def test_the_sweep_form_is_a_preset_the_axes_and_overrides_resolved_as_the_cli_resolves_its_flags(tmp_path):
    from prefect.utilities.collections import visit_collection
    from pydantic import ValidationError

    from copc_core.config import with_overrides
    from flows.prefect_flows import SweepParams
    from sweeps.presets import sweep_preset
    from sweeps.space import with_axes

    form = SweepParams(
        preset="regime-search",
        methods="copc[behavior],tis",
        tau_policy=[4.0, math.inf],
        seeds=[7],
        steps=50,
        overrides={"train.lr": 5e-5},
    )
    space, base = sweep_preset("regime-search")
    name, got_space, got_base = form.resolved()
    assert name == "regime-search" and got_base == with_overrides(base, {"train.lr": 5e-5})
    assert got_space == with_axes(space, "copc[behavior],tis", [4.0, math.inf], None, None, [7], 50)
    assert [m.key for m in got_space.methods] == ["copc[behavior]", "tis"] and got_space.seeds == [7]
    assert got_space.methods[0].tau_policy == [4.0, math.inf] and got_space.methods[1].tau_policy is None
    assert SweepParams().resolved() == ("embedded-default", *sweep_preset("embedded-default"))  # empty: the preset
    # the form as the flow engine resolves its parameter (a SweepSpace with keys() once read as a mapping here)
    whole = SweepParams(space=got_space, base=got_base)
    assert visit_collection(whole, visit_fn=lambda x: x, return_data=True) == whole
    for bad, field in (
        ({"methods": "copc;rm -rf"}, "methods"),
        ({"methods": "ppo9"}, "valid methods"),
        ({"methods": "tis", "tau_policy": [2.0]}, "no method of the sweep has that band"),
        ({"overrides": {"train.stepz": 3}}, "stepz"),
        ({"seeds": [-1]}, "seeds"),
        ({"preset": "huge"}, "preset"),
    ):
        with pytest.raises(ValidationError, match=field):
            SweepParams(**bad)


def test_a_plan_that_cannot_be_one_exits_2_before_anything_runs(tmp_path):
    """`copc sweep --plan FILE`: an empty file, a missing one or one over 64 K characters is named, nothing written."""
    empty, huge = tmp_path / "empty.md", tmp_path / "huge.md"
    empty.write_text("  \n")
    huge.write_text("x" * (64 * 1024 + 1))
    for path, needle in (
        (empty, "the plan is empty"),
        (huge, "65,537 characters; at most 65,536"),
        (tmp_path / "no.md", "cannot read"),
    ):
        out = copc_here("sweep", "--plan", str(path), data_dir=tmp_path)
        assert out.returncode == 2 and needle in out.stderr and str(path) in out.stderr, out.stderr
    assert not (tmp_path / "optuna.db").exists() and not (tmp_path / "mlflow.db").exists()
