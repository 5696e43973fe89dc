import contextlib
import os
import pathlib
import shutil

import pytest

# In pytest-xdist's workers (the README's test command: six on two cores), one OpenMP thread in each test process and
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


@pytest.fixture(scope="session")
def tiny_warm_state():
    from copc_core.train.warmstart import warm_start

    return warm_start(tiny_config())


@pytest.fixture(scope="session")
def local_ray():
    """One local Ray for the whole test session (2 CPUs): each start costs time and, on a loaded machine,
    risks Ray's fixed startup limit; `init_ray` retries that, and nobody shuts this Ray down but here. In
    pytest-xdist's workers, the one Ray their controller started (`pytest_configure`), joined."""
    import ray

    from infra.ray_runtime import init_ray

    shared = os.environ.get(SHARED_RAY)
    init_ray(address=shared) if shared else init_ray(num_cpus=2)
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory):
    """One Prefect server (`flows.prefect_server`, as `copc up` and a command's temporary server run it) for the test
    session's `copc sweep` processes, each of which would start a temporary one (~10 s): a user with `copc up` running
    has the same. PREFECT_API_URL is left unset in this process; a test hands the URL to the processes it starts."""
    if os.environ.get(SHARED_PREFECT):  # pytest-xdist's workers: their controller's (`pytest_configure`)
        yield os.environ[SHARED_PREFECT]
        return
    from infra.local_stack import temporary_prefect_server

    with temporary_prefect_server(tmp_path_factory.mktemp("prefect-session")) as api:
        os.environ.pop("PREFECT_API_URL", None)
        yield api


SHARED_RAY, SHARED_PREFECT = "COPC_TEST_RAY_ADDRESS", "COPC_TEST_PREFECT_API"
_SHARED = contextlib.ExitStack()  # what the controller of pytest-xdist's workers runs for them, closed at its end


def pytest_configure(config):
    """Where pytest-xdist's workers run, their controller readies what they share before they start: Ray's auth
    token, one Ray and one Prefect server (named to the workers in $COPC_TEST_RAY_ADDRESS and $COPC_TEST_PREFECT_API).
    A run without workers starts its own when a test first asks (`local_ray`, `prefect_api`)."""
    if os.environ.get("PYTEST_XDIST_WORKER") or not config.getoption("numprocesses", None):
        return
    _make_ray_auth_token()
    workers = config.getoption("numprocesses")
    _share_ray_and_prefect(workers if isinstance(workers, int) else os.cpu_count())


def pytest_unconfigure(config):
    _SHARED.close()


def _make_ray_auth_token():
    """Ray's auth token made once (on a fresh machine there is none): each `ray.init` that finds none writes one (Ray
    2.60, unlocked), so workers starting Ray at once could overwrite each other's token or read a half-written one.
    Ray's own command makes it; `restrict_auth_token` keeps it 0600. Only where workers run: importing Ray costs ~2 s,
    which a run of one file without `-n` need not pay."""
    import subprocess
    import sys

    from infra.ray_runtime import restrict_auth_token

    if restrict_auth_token() is None:
        ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
        subprocess.run([ray_cli, "get-auth-token", "--generate"], capture_output=True, check=True, timeout=300)
        restrict_auth_token()


def _share_ray_and_prefect(workers: int):
    """One Ray and one Prefect server for every worker, stopped when the run ends: each worker started its own (Ray
    ~6 CPU-s, Prefect ~7.5) and kept it, idle, to the end of the run (~2 and ~1 CPU-s a minute, measured in a cgroup).
    The Ray's CPUs are the workers' former Rays' together (2 each); its logical CPUs are not the machine's, as theirs
    were not. The processes a test starts (`copc sweep`, `copc train --runtime ray`) start Rays of their own, as a
    user's do: joining this one through $RAY_ADDRESS measured more CPU, not less (each ran its trials on the shared
    Ray's CPUs at once, a worker process each, where two of their own took turns)."""
    import tempfile

    import ray

    from infra.local_stack import temporary_prefect_server
    from infra.ray_runtime import init_ray

    home = pathlib.Path(tempfile.mkdtemp(prefix="copc-tests-"))
    _SHARED.callback(shutil.rmtree, home, ignore_errors=True)  # last: an ExitStack closes in reverse
    api = _SHARED.enter_context(temporary_prefect_server(home))
    os.environ.pop("PREFECT_API_URL", None)  # a test hands the URL to the processes it starts
    os.environ[SHARED_PREFECT] = api
    init_ray(num_cpus=2 * workers)
    _SHARED.callback(ray.shutdown)
    os.environ[SHARED_RAY] = ray.get_runtime_context().gcs_address


def pytest_collection_modifyitems(config, items):
    """The slow tests first, each of pytest-xdist's workers its share, so that they end on short tests, not on one
    long test alone; and `vllm` tests need vLLM that runs here (its CPU build, or its CUDA build and a GPU): skipped,
    with the reason, where it does not."""
    items[:] = _slow_first(items, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    _skip_vllm_tests_without_vllm(items)


def _slow_first(items: list, workers: int) -> list:
    """`workers` runs of tests, each its share of the slow tests (every `workers`-th, in file order) then its share
    of the rest. `--dist worksteal` hands each worker one run of the list to start with (contiguous, equal in count)
    and steals from the end of a queue: sorted slow-first as one block, the first worker got 87 slow tests of 100
    and the others stole them late, so the run ended on long tests."""
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    fast = [item for item in items if item.get_closest_marker("slow") is None]
    return [item for w in range(workers) for item in slow[w::workers] + fast[w::workers]]


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
