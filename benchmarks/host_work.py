"""ciclo's host work per step, in microseconds, without the device's noise.

    PYTHONPATH=. python benchmarks/host_work.py [--steps 4096] [--rounds 9]

`observers.py` times a jitted step: on a small shared VM the device's work (the
step, run by XLA's threads on the same cores) moves its wall-clock and process
CPU figures by tens of µs between runs, more than the observers cost. Here the
step does no device work: it logs two device scalars computed before the run
(a distinct pair per step, as a compiled step's outputs are), so the loop does
all of its host work (the input stage, schedules, the commit, the History's
lagged stack-and-copy of those scalars, the observers' rows) and nothing else.
Each variant's figure is the **main thread's CPU time** per step (the time the
loop's host work takes; XLA's own threads are not counted), the **minimum** over
interleaved rounds (noise only adds), after a warm-up. "raw" is a plain Python
loop calling the same step and keeping its logs: the floor a loop costs.

Compare two trees (base against the working tree) with PYTHONPATH, in one
session: the figures of one machine move less between runs a minute apart than
between machines.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax
import jax.numpy as jnp
import numpy as np
import observers

import ciclo


def device_scalars(steps: int) -> tuple[list, list]:
    """`steps` distinct pairs of computed device scalars (loss, accuracy)."""
    step = jax.jit(lambda x: (x + 1.0, x.sum(), x.mean()))
    x, losses, accuracies = jnp.ones(4), [], []
    for _ in range(steps):
        x, loss, accuracy = step(x)
        losses.append(loss)
        accuracies.append(accuracy)
    jax.block_until_ready((losses, accuracies))
    return losses, accuracies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    steps = args.steps
    losses, accuracies = device_scalars(steps)
    batches = [(np.zeros((32, 64), np.float32), np.zeros(32, np.int32))] * steps
    at = [0]

    def train_step(state, batch):
        i = at[0]
        at[0] = i + 1
        logs = ciclo.logs().add_loss("loss", losses[i])
        return logs.add_metric("accuracy", accuracies[i]), state

    def raw():
        kept = []
        for batch in batches:
            logs, _ = train_step(None, batch)
            kept.append(logs)

    names = ["bare loop", "csv_logger", "jsonl_logger"]
    if observers._has_tensorboard():
        names.append("tensorboard")
    names += ["lr_monitor(schedule)", "all four"]
    variants = {
        "raw": raw,
        **{name: observers.observed(train_step, name, batches) for name in names},
    }
    variants["train_loop + keras_bar"] = observers.with_bar(train_step, batches)
    variants["train_loop + keras_bar, generator"] = observers.with_bar(
        train_step, batches, generator=True
    )
    best = dict.fromkeys(variants, float("inf"))
    for run in variants.values():  # warm-up: compilation, first-time setup
        at[0] = 0
        run()
    order = list(variants)
    for r in range(args.rounds):
        for name in order[r % len(order) :] + order[: r % len(order)]:
            at[0] = 0
            start = time.thread_time()
            variants[name]()
            used = (time.thread_time() - start) / steps * 1e6
            best[name] = min(best[name], used)
    print(
        f"# {platform.node() or 'host'} | {platform.machine()} | {os.cpu_count()} cpus"
        f" | jax {jax.__version__} | python {sys.version.split()[0]} | "
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC | ciclo from "
        f"{os.path.dirname(ciclo.__file__)} | {steps} steps, min of {args.rounds} "
        f"rounds, main-thread CPU"
    )
    print("\n| variant | µs/step | added to the bare loop |")
    print("| --- | ---: | ---: |")
    for name in variants:
        added = best[name] - best["bare loop"]
        shown = "" if name in ("raw", "bare loop") else f"{added:+.1f}"
        if name == "bare loop":
            shown = f"(+{best[name] - best['raw']:.1f} over raw)"
        print(f"| {name} | {best[name]:.1f} | {shown} |")


if __name__ == "__main__":
    main()
