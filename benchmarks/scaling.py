"""`jit` vs `data_parallel` vs `sharded` on 4 forced CPU devices.

    python benchmarks/scaling.py [--steps 512] [--batch 128] [--rounds 3]

The digits MLP (64→128→10, Adam) of `vs_raw.py` trained with `ciclo.loop` and a
`managed.train_step` under each strategy, unfused and fused (`steps_per_call`),
on `--xla_force_host_platform_device_count=4` (set before jax is imported). On a
CPU the 4 "devices" share the machine's cores, so this measures the strategies'
overhead (placement, collectives), not a speed-up. Median of `--rounds`
interleaved rounds. Results go in benchmarks/RESULTS.md by hand.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (
    "--xla_force_host_platform_device_count=4 --xla_cpu_multi_thread_eigen=false"
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import platform
import time

import jax
import numpy as np
from vs_raw import TX, _fit, init_params

import ciclo
from ciclo import managed


def batches(size: int) -> list[tuple[np.ndarray, np.ndarray]]:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x, y = (x / 16.0).astype(np.float32), y.astype(np.int32)
    return [
        (x[i : i + size], y[i : i + size]) for i in range(0, len(x) - size + 1, size)
    ]


def run(strategy, step, data, steps):
    state = managed.ManagedState.create(params=init_params(), tx=TX, strategy=strategy)
    stream = (data[i % len(data)] for i in range(steps))
    state, history, _ = ciclo.loop(state, stream, {ciclo.every(1): step})
    jax.block_until_ready(state)
    history.collect("loss")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=512)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--k", type=int, default=16)
    args = parser.parse_args()
    assert jax.device_count() == 4, jax.devices()
    data = batches(args.batch)
    single = managed.train_step(_fit)
    fused = managed.train_step(_fit, steps_per_call=args.k)
    variants = {
        (s, label): step
        for s in ("jit", "data_parallel", "sharded")
        for label, step in (("1", single), (str(args.k), fused))
    }
    for (strategy, _), step in variants.items():
        run(strategy, step, data, 2 * args.k)  # compile
    times = {key: [] for key in variants}
    for _ in range(args.rounds):
        for (strategy, label), step in variants.items():
            start = time.perf_counter()
            run(strategy, step, data, args.steps)
            times[(strategy, label)].append(time.perf_counter() - start)
    print(
        f"# {platform.node()} | {os.cpu_count()} cpus | jax {jax.__version__} | 4 forced "
        f"CPU devices | batch {args.batch} | {args.steps} steps x {args.rounds} rounds, "
        f"median | {time.strftime('%Y-%m-%d')}"
    )
    print()
    jit = float(np.median(times[("jit", "1")]))
    print("| strategy | steps_per_call | steps/s | samples/s | × jit (unfused) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for (strategy, label), t in times.items():
        m = float(np.median(t))
        print(
            f"| {strategy} | {label} | {args.steps / m:,.0f} | "
            f"{args.steps * args.batch / m:,.0f} | {jit / m:.2f} |"
        )


if __name__ == "__main__":
    main()
