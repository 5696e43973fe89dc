"""Benchmark: weights through Ray's object store as a dict of tensors vs one packed byte buffer.

    python -m bench.weight_transport [--rounds 200]

What a learner step pays to publish its weights (copy off the model + `ray.put`) and what a rollout
worker pays to take them (`ray.get` + `load_state_dict`), for the embedded default model and for a
wider one (4 layers, width 256). The two transports run interleaved in one process, 1 torch thread,
after a warm-up; medians. The dict of tensors is what the runtime sent before `infra/packed_weights.py`.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    import ray

    from copc_core.config import RunConfig, with_overrides
    from copc_core.engines.backends import build_model, snapshot
    from infra.packed_weights import pack, unpack
    from infra.ray_runtime import init_ray

    init_ray(num_cpus=2)
    transports = {
        "dict of tensors": (snapshot, lambda got: got),
        "packed buffer": (lambda model: pack(model.state_dict()), unpack),
    }
    print(
        f"medians of {args.rounds} interleaved rounds, ms (publish = copy + ray.put; take = ray.get + load_state_dict)"
    )
    print(f"  {'model':<31s}{'transport':<17s}{'publish':>9s}{'take':>8s}{'sum':>8s}")
    for label, overrides in (
        ("embedded default", {}),
        ("4 layers x 256 wide", {"model.n_layer": 4, "model.n_embd": 256}),
    ):
        cfg = with_overrides(RunConfig(), overrides)
        source, sink = build_model(cfg, 0), build_model(cfg, 1)
        size = sum(t.numel() * t.element_size() for t in source.state_dict().values())
        times = {name: ([], []) for name in transports}
        for r in range(args.rounds + 10):  # 10 rounds of warm-up
            for name, (publish, take) in transports.items():
                start = time.perf_counter()
                ref = ray.put(publish(source))
                mid = time.perf_counter()
                sink.load_state_dict(take(ray.get(ref)))
                end = time.perf_counter()
                del ref
                if r >= 10:
                    times[name][0].append(mid - start)
                    times[name][1].append(end - mid)
        sums = {}
        for name, (pub, tak) in times.items():
            p, t = statistics.median(pub) * 1e3, statistics.median(tak) * 1e3
            sums[name] = statistics.median(a + b for a, b in zip(pub, tak)) * 1e3
            print(f"  {label + f' ({size / 1e6:.1f} MB)':<31s}{name:<17s}{p:9.2f}{t:8.2f}{sums[name]:8.2f}")
        print(f"  {'':<31s}dict / packed: {sums['dict of tensors'] / sums['packed buffer']:.2f}x")
        assert all(torch.equal(a, b) for a, b in zip(source.state_dict().values(), sink.state_dict().values()))


if __name__ == "__main__":
    main()
