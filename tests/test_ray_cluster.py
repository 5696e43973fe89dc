"""A real 2-node Ray cluster on loopback (`ray start --head` + `ray start --address`) runs a short job.

The cluster is torn down by killing the process groups its two `ray start` commands made, never
with `ray stop`: that stops every Ray on the machine, this test session's own local Ray included
(and with it every later test that uses Ray in this process), or a user's cluster.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest
import ray

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_node_cluster_runs_a_short_job(tmp_path, local_ray):
    ray_bin = shutil.which("ray", path=os.path.dirname(sys.executable))
    assert ray_bin, "the ray CLI must be installed beside this Python"
    port = free_port()
    address = f"127.0.0.1:{port}"
    # Ray 2.60 heads enable token auth; every process of the cluster must then use it too
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RAY_AUTH_MODE": "token"}
    common = ["--num-cpus", "1", "--node-ip-address", "127.0.0.1", "--disable-usage-stats"]
    # local_ray: this test process's own Ray, which the teardown must leave alone
    groups: list[int] = []  # process group of each `ray start`: its daemons and their workers

    def start(*args: str) -> None:
        node = subprocess.Popen(
            [ray_bin, "start", *args, *common],
            env=env,
            start_new_session=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        groups.append(node.pid)
        _, err = node.communicate(timeout=180)
        assert node.returncode == 0, err[-3000:]

    try:
        start("--head", "--port", str(port), "--include-dashboard=false")
        start("--address", address)
        job = textwrap.dedent(f"""
            import ray
            from tests.conftest import tiny_config
            from copc_core.train.warmstart import warm_start
            from copc_core.config import with_overrides
            from infra.ray_runtime import RayTrainer, init_ray
            init_ray(address={address!r})
            alive = [n for n in ray.nodes() if n["Alive"]]
            cfg = tiny_config(method="copc", staleness=1, steps=2)
            rt = RayTrainer(with_overrides(cfg, {{"resources.timeout_s": 120}}), warm_start(cfg))
            s = rt.run()
            print("NODES", len(alive), "STEPS", s.steps_completed, "EPISODES", rt.counters.episodes_consumed)
        """)
        out = subprocess.run(
            [sys.executable, "-c", job],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        )
        assert out.returncode == 0, out.stderr[-3000:]
        assert "NODES 2 STEPS 2 EPISODES 32" in out.stdout
    finally:
        stop_groups(groups)
    assert ray.get(ray.remote(lambda: 41 + 1).remote(), timeout=60) == 42  # the test process's own Ray still works


def stop_groups(groups: list[int], grace_s: float = 15.0) -> None:
    """SIGTERM every process group, SIGKILL what is left after `grace_s`; return once all are gone."""

    def alive(pgid: int) -> bool:
        try:
            os.killpg(pgid, 0)
            return True
        except ProcessLookupError:
            return False

    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 30.0)):
        for pgid in filter(alive, groups):
            os.killpg(pgid, sig)
        deadline = time.monotonic() + wait_s
        while any(map(alive, groups)) and time.monotonic() < deadline:
            time.sleep(0.2)
    left = [g for g in groups if alive(g)]
    assert not left, f"process groups {left} survived SIGKILL"
