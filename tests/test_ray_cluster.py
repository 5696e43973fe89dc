"""A real 2-node Ray cluster on loopback (`ray start --head` + `ray start --address`) runs a short job."""

import os
import shutil
import socket
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_node_cluster_runs_a_short_job(tmp_path):
    ray_bin = shutil.which("ray", path=os.path.dirname(sys.executable))
    assert ray_bin, "the ray CLI must be installed beside this Python"
    port = free_port()
    address = f"127.0.0.1:{port}"
    # Ray 2.60 heads enable token auth; every process of the cluster must then use it too
    env = dict(os.environ, RAY_AUTH_MODE="token")
    common = ["--num-cpus", "1", "--node-ip-address", "127.0.0.1", "--disable-usage-stats"]
    try:
        subprocess.run([ray_bin, "start", "--head", "--port", str(port), "--include-dashboard=false", *common],
                       check=True, capture_output=True, env=env, timeout=180)
        subprocess.run([ray_bin, "start", "--address", address, *common], check=True, capture_output=True, env=env,
                       timeout=180)
        job = textwrap.dedent(f"""
            import ray
            from tests.conftest import tiny_config
            from copc_core.warmstart import warm_start
            from infra.ray_runtime import RayResources, RayTrainer, init_ray
            init_ray(address={address!r})
            alive = [n for n in ray.nodes() if n["Alive"]]
            cfg = tiny_config(method="copc", staleness=1, steps=2)
            rt = RayTrainer(cfg, warm_start(cfg), RayResources(rollout_cpus=1, learner_cpus=1, timeout_s=120))
            s = rt.run()
            print("NODES", len(alive), "STEPS", s.steps_completed, "EPISODES", rt.counters.episodes_consumed)
        """)
        out = subprocess.run([sys.executable, "-c", job], capture_output=True, text=True, env=env, timeout=300,
                             cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        assert out.returncode == 0, out.stderr[-3000:]
        assert "NODES 2 STEPS 2 EPISODES 32" in out.stdout
    finally:
        subprocess.run([ray_bin, "stop", "--force"], capture_output=True, env=env, timeout=120)
