"""Host cost of placing one batch for each strategy, on 4 forced CPU devices.

    python benchmarks/placement.py [--repeats 7] [--calls 300]

For an `(x, y)` digits-sized batch (x float32 (64, 64), y int32 (64,)) and a fused
one (K=8 stacked), reports µs per placement (median of `repeats`, each the mean of
`calls` calls, each waited for) of:
  - `jax.device_put(batch)` (the reference: one plain transfer to one device);
  - `jax.device_put(batch, NamedSharding(mesh, P("data")))` (one batched call);
  - the same per leaf with `jax.make_array_from_process_local_data` (how
    `sharded` placed a batch before: one call per leaf);
  - the same per leaf with `jax.make_array_from_callback` (each device's slice, a
    view, handed to one batched transfer: what `data_parallel` and `sharded` do);
  - what a managed step does for each strategy (`Strategy.place_batch`, or
    `place_steps` for the fused batch).
Results go in benchmarks/RESULTS.md by hand, with the machine and date.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import platform
import statistics
import time

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import ciclo


def timed(fn, batch, calls):
    jax.block_until_ready(fn(batch))  # compile / warm up
    start = time.perf_counter()
    for _ in range(calls):
        jax.block_until_ready(fn(batch))
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    assert jax.device_count() == 4, jax.devices()
    rng = np.random.default_rng(0)
    batch = (
        rng.normal(size=(64, 64)).astype(np.float32),
        rng.integers(0, 10, size=64).astype(np.int32),
    )
    fused = tuple(np.stack([x] * 8) for x in batch)
    mesh = Mesh(np.array(jax.devices()), ("data",))
    data = NamedSharding(mesh, P("data"))
    cases = {
        "device_put (one device)": (lambda b: jax.device_put(b), batch),
        "device_put (tree, NamedSharding)": (lambda b: jax.device_put(b, data), batch),
        "per leaf make_array_from_process_local_data (sharded before)": (
            lambda b: jax.tree.map(
                lambda x: jax.make_array_from_process_local_data(data, x), b
            ),
            batch,
        ),
        "per leaf make_array_from_callback": (
            lambda b: [
                jax.make_array_from_callback(x.shape, data, x.__getitem__) for x in b
            ],
            batch,
        ),
    }
    for name in ["jit", "data_parallel", "sharded"]:
        strategy = ciclo.get_strategy(name)
        if name == "jit":  # leaves the batch to the jitted call: what read-ahead does
            cases["jit (read-ahead: device_put)"] = (lambda b: jax.device_put(b), batch)
            continue
        cases[name] = (strategy.place_batch, batch)
        cases[f"{name}, fused K=8"] = (strategy.place_steps, fused)
    results = {k: [] for k in cases}
    for _ in range(args.repeats):  # interleaved, so load hits every case alike
        for key, (fn, b) in cases.items():
            results[key].append(timed(fn, b, args.calls))
    print(
        f"# {platform.node()} {platform.machine()}, jax {jax.__version__}, "
        f"{jax.device_count()} forced CPU devices, load average "
        f"{os.getloadavg()[0]:.1f} at the end"
    )
    reference = statistics.median(results["device_put (one device)"])
    for key, values in results.items():
        us = statistics.median(values)
        print(f"| {key} | {us:.0f} | {us / reference:.2f}x |")


if __name__ == "__main__":
    main()
