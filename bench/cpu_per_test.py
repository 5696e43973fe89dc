"""Benchmark plugin: the machine's busy CPU-seconds and the wall seconds of each test, run one after another.

    .venv/bin/python -m pytest -m slow -p bench.cpu_per_test      # then: .venv/bin/python -m bench.cpu_per_test

Busy CPU is read from /proc/stat (all cores, all processes), so the servers, Ray and the processes a test starts
count, which pytest's `--durations` and the process tree's rusage miss; run it on an otherwise idle machine, without
`-n`: in parallel workers the figures would mix, so it refuses them. Or, beside other work, in a cgroup of its own
(cgroup v1 cpuacct; every process pytest starts stays in it, Ray's and the servers' included) — then only that
cgroup's CPU counts:

    mkdir /sys/fs/cgroup/cpuacct/pytest && echo $$ > /sys/fs/cgroup/cpuacct/pytest/cgroup.procs && .venv/bin/python ...

Writes `data/bench/cpu_per_test.json`; `main` prints the totals and the costliest tests.
"""

from __future__ import annotations

import json
import os
import pathlib
import time

import pytest

OUT = pathlib.Path("data/bench/cpu_per_test.json")
RECORDS: dict[str, tuple[float, float]] = {}


def own_cpuacct() -> pathlib.Path | None:
    """This process's cpuacct cgroup (v1) when it is not the root one, else None."""
    for line in pathlib.Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpuacct" in controllers.split(",") and path != "/":
            usage = pathlib.Path("/sys/fs/cgroup/cpuacct") / path.lstrip("/") / "cpuacct.usage"
            return usage if usage.exists() else None
    return None


CGROUP = own_cpuacct()


def busy_cpu_s() -> float:
    """Seconds of CPU this process's own cgroup has used (see the module's text), else the whole machine's busy
    seconds since boot (user, nice, system, irq, softirq, steal)."""
    if CGROUP is not None:
        return int(CGROUP.read_text()) / 1e9
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:9]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields) - idle) / os.sysconf("SC_CLK_TCK")


def pytest_configure(config):
    if config.getoption("numprocesses", None):
        raise pytest.UsageError(
            "bench.cpu_per_test reads the CPU of the whole machine (or of its cgroup), which parallel workers share: "
            "run it without -n"
        )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    cpu, wall = busy_cpu_s(), time.monotonic()
    yield
    RECORDS[item.nodeid] = (round(busy_cpu_s() - cpu, 1), round(time.monotonic() - wall, 1))


def pytest_sessionfinish(session):
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(RECORDS, indent=0))


def main(top: int = 15) -> None:
    records = json.loads(OUT.read_text())
    cpu, wall = sum(r[0] for r in records.values()), sum(r[1] for r in records.values())
    print(f"{len(records)} tests: {cpu:.0f} CPU-s in {wall:.0f} s of wall time")
    for name, (c, w) in sorted(records.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"{c:7.1f} CPU-s {w:7.1f} s  {name}")


if __name__ == "__main__":
    main()
