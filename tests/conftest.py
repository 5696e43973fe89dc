import os
import sys

import pytest

# In pytest-xdist's workers (the README's test command: three on two cores), one OpenMP thread in each test process and
# in the processes it starts, set before torch is imported: two a process cost 2 CPU-minutes of the run
# (docs/BENCHMARKS.md). Training processes set their own count (`train.torch_threads`, 1 by default). A run without
# workers (the vLLM lane, whose CPU engine has its own thread binding) keeps the default.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

from copc_core.config import MethodConfig, RunConfig, ToolMathTaskConfig, TrainConfig, WarmStartConfig  # noqa: E402


def tiny_config(method: str = "copc", staleness: int = 0, steps: int = 4, seed: int = 0, **method_kw) -> RunConfig:
    """A run small enough for unit tests (seconds), same code paths as the default."""
    return RunConfig(
        method=MethodConfig(name=method, **method_kw),
        task=ToolMathTaskConfig(n_eval=16),
        warm_start=WarmStartConfig(steps=30, batch_size=32),
        train=TrainConfig(steps=steps, batch_size=16, minibatches=2, eval_every=2, staleness=staleness, seed=seed),
    )


def in_process(cfg: RunConfig, warm: dict):
    """`cfg` trained whole in this process at one torch thread, the Ray actors' and `copc train`'s default: the same
    reductions, so the same floats as theirs. Returns the trainer."""
    import torch

    from copc_core.train.trainer import Trainer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        trainer = Trainer(cfg, warm)
        trainer.run()
        return trainer
    finally:
        torch.set_num_threads(threads)


def cache_warm_start(cache_dir, config: RunConfig, state: dict) -> None:
    """`state` put where `cached_warm_start` looks for `config`'s warm start: the run reads it instead of training
    its SFT."""
    from infra.checkpoints import save_checkpoint, warm_start_path

    save_checkpoint(warm_start_path(cache_dir, config), state)


@pytest.fixture(scope="session")
def tiny_warm_state():
    from copc_core.train.warmstart import warm_start

    return warm_start(tiny_config())


@pytest.fixture
def local_ray():
    """A local Ray in this process (2 CPUs), started by the first test that needs it (`init_ray` retries a start
    that misses Ray's fixed startup limit on a loaded machine) and kept for the tests after it of the same module;
    `pytest_runtest_teardown` below stops it."""
    from infra.ray_runtime import init_ray

    init_ray(num_cpus=2)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """A Ray this process started (a `local_ray` test, a sweep run in process) stops once the next test is of another
    module, or none is left, after the test's own fixtures are torn down (even when one of them fails): an idle local
    Ray costs ~3 CPU-s a minute, and of six workers four kept one idle to the end of the run (docs/BENCHMARKS.md); the
    next module that needs one starts its own (~6 CPU-s)."""
    try:
        return (yield)
    finally:
        if nextitem is None or getattr(nextitem, "module", None) is not getattr(item, "module", None):
            ray = sys.modules.get("ray")
            if ray is not None and ray.is_initialized():
                ray.shutdown()


@pytest.fixture(scope="session")
def used_stores(request, tmp_path_factory):
    """A used Prefect database and MLflow store to copy into a test's data folder (tests/stack_helpers.py
    UsedStores): each made once a run, shared by pytest-xdist's workers, whose own temporary folders are
    `<the run's>/popen-gwN`: the run's is their parent."""
    from tests.stack_helpers import UsedStores

    base = tmp_path_factory.getbasetemp()
    run_folder = base.parent if hasattr(request.config, "workerinput") else base
    return UsedStores(run_folder / "used-stores")


@pytest.fixture(scope="module")
def prefect_api(tmp_path_factory, used_stores):
    """One Prefect server (`flows.prefect_server`, as `copc up` and a command's temporary server run it) for a module's
    `copc sweep` processes, each of which would start a temporary one (~10 s): a user with `copc up` running has the
    same. Per module, not per session: it stops once a worker moves on (idle, it costs ~1 CPU-s a minute). Its
    PREFECT_API_URL is left unset in this process; a test hands the URL to the processes it starts. Its database is a
    used one (`used_stores`)."""
    from infra.local_stack import temporary_prefect_server

    data = tmp_path_factory.mktemp("prefect-session")
    used_stores.prefect(data, temporary=True)
    with temporary_prefect_server(data) as api:
        os.environ.pop("PREFECT_API_URL", None)
        yield api


def pytest_configure(config):
    """Ray's auth token made once, before pytest-xdist's workers start (on a fresh machine there is none): each
    `ray.init` that finds none writes one (Ray 2.60, unlocked), so workers starting Ray at once could overwrite each
    other's token or read a half-written one. Ray's own command makes it; `restrict_auth_token` keeps it 0600. Only
    where workers run: importing Ray costs ~2 s, which a run of one file without `-n` need not pay."""
    if os.environ.get("PYTEST_XDIST_WORKER") or not config.getoption("numprocesses", None):
        return
    import subprocess
    import sys

    from infra.ray_runtime import restrict_auth_token

    if restrict_auth_token() is None:
        ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
        subprocess.run([ray_cli, "get-auth-token", "--generate"], capture_output=True, check=True, timeout=300)
        restrict_auth_token()


# The files whose tests take longest from start to end, mostly waiting on servers, flow runs or a second Ray node
# (~145 s and ~55 s in a three-worker run): first of all. Started in file order they began after ~290 s and the run
# ended on them, one worker busy and two idle for ~50 s (docs/BENCHMARKS.md). First, both go to the first worker
# (pytest-xdist's worksteal hands each worker a third of the list), one after the other, done by ~210 s.
LONGEST_FIRST = ("test_prefect_browser.py", "test_ray_cluster.py")


def pytest_collection_modifyitems(config, items):
    """The slow tests first (those of LONGEST_FIRST before the others; each file's order kept), so that pytest-xdist's
    workers (the README's test command) end on short tests, not on one long test alone; and `vllm` tests need vLLM
    that runs here (its CPU build, or its CUDA build and a GPU): skipped, with the reason, where it does not."""
    items.sort(key=lambda item: (item.get_closest_marker("slow") is None, item.path.name not in LONGEST_FIRST))
    _skip_vllm_tests_without_vllm(items)


def _skip_vllm_tests_without_vllm(items):
    from copc_core.engines.vllm_engine import vllm_unavailable_reason

    reason = vllm_unavailable_reason()
    if reason is None:
        return
    if os.environ.get("COPC_REQUIRE_VLLM"):  # the vLLM lane of .ci/run: a skip there would hide a broken install
        raise pytest.UsageError(f"COPC_REQUIRE_VLLM is set but vLLM cannot run here: {reason}")
    for item in items:
        if "vllm" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=f"vllm test: {reason}"))


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium for the tests of what a person sees (tests/browser.py), one per test module."""
    import shutil

    from tests.browser import chromium

    driver, profile = chromium()
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)
