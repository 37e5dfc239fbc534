"""What ciclo's observers add per step to a loop: the metric writers and `lr_monitor`.

    python benchmarks/observers.py [--steps 2000] [--rounds 7]

A jitted no-op step logging 2 device scalars (loss, accuracy) under `ciclo.loop`,
fed numpy batches, alone and with observers: `csv_logger`, `jsonl_logger`,
`tensorboard` (when tensorboardX is installed) and `lr_monitor(schedule)` (an optax
warmup-cosine schedule), each alone, and all four together. The variants are run
paired and interleaved: each round runs every variant once (in a rotated order)
and each variant's cost is taken against the bare loop of the same round; the table
reports the median over rounds of the microseconds per step added (and the range),
in wall-clock time and in this process's CPU time (all its threads), which a
machine loaded by other processes disturbs less. A run ends with every row
on disk (the writers close at the loop's end) and on the host (the history read).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import os
import platform
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import ciclo


def make_batches(steps: int, batch: int = 32) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch, 64)).astype(np.float32)
    y = rng.integers(0, 10, size=(batch,)).astype(np.int32)
    return [(x, y)] * steps


@jax.jit
def _noop(x, y):
    return jnp.float32(0.5) + 0 * x[0, 0], jnp.float32(0.25) + 0 * y[0]


def train_step(state, batch):
    loss, accuracy = _noop(*batch)
    return ciclo.logs().add_loss("loss", loss).add_metric("accuracy", accuracy), state


SCHEDULE = optax.warmup_cosine_decay_schedule(0.0, 1e-3, 100, 10_000)


def _has_tensorboard() -> bool:
    try:
        import tensorboardX  # noqa: F401
    except ImportError:
        return False
    return True


def observers(name: str, directory: str) -> list:
    """Fresh observer objects of a variant (a new directory each run)."""
    made = {
        "csv_logger": lambda: ciclo.csv_logger(os.path.join(directory, "log.csv")),
        "jsonl_logger": lambda: ciclo.jsonl_logger(
            os.path.join(directory, "log.jsonl")
        ),
        "tensorboard": lambda: ciclo.tensorboard(os.path.join(directory, "tb")),
        "lr_monitor(schedule)": lambda: ciclo.lr_monitor(SCHEDULE),
    }
    if name == "all four":
        names = ["lr_monitor(schedule)", "csv_logger", "jsonl_logger"]
        if _has_tensorboard():
            names.append("tensorboard")
        return [made[n]() for n in names]
    return [] if name == "bare loop" else [made[name]()]


def observed(step, name: str, batches: list):
    """A run of `step` under `ciclo.loop` with the observers of variant `name`
    (new ones each run), ending with every row on disk and on the host."""

    def run() -> None:
        with tempfile.TemporaryDirectory() as directory:
            tasks = {ciclo.every(1): [step, *observers(name, directory)]}
            _, history, _ = ciclo.loop(None, batches, tasks)
            history.collect("steps")

    return run


def with_bar(step, batches: list, generator: bool = False):
    """A run of `step` in `ciclo.train_loop` with a `keras_bar` (its output
    discarded); `generator`: the batches come from a generator (as in
    `vs_raw.py`), so each is copied before the next is read."""

    def run() -> None:
        with contextlib.redirect_stdout(io.StringIO()):
            _, history, _ = ciclo.train_loop(
                None,
                (b for b in batches) if generator else batches,
                {ciclo.on_train_step: step},
                callbacks=[ciclo.keras_bar(total=len(batches))],
            )
            history.collect("steps")

    return run


def seconds(name: str, batches: list) -> tuple[float, float]:
    """Wall-clock and CPU seconds (this process, all threads) of one run."""
    with tempfile.TemporaryDirectory() as directory:
        tasks = {ciclo.every(1): [train_step, *observers(name, directory)]}
        start, cpu = time.perf_counter(), time.process_time()
        _, history, _ = ciclo.loop(None, batches, tasks)
        history.collect("steps")  # the last lagged rows on the host
        return time.perf_counter() - start, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", help="also write the per-round µs/step here")
    args = parser.parse_args()
    variants = ["bare loop", "csv_logger", "jsonl_logger"]
    if _has_tensorboard():
        variants.append("tensorboard")
    variants += ["lr_monitor(schedule)", "all four"]
    batches = make_batches(args.steps)
    for name in variants:  # compile and warm every path outside the timing
        seconds(name, batches[:300])  # past the history's first transfers
    times: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(args.rounds):
        order = variants[r % len(variants) :] + variants[: r % len(variants)]
        for name in order:
            wall, used = seconds(name, batches)
            times[name].append(wall / args.steps * 1e6)
            cpu[name].append(used / args.steps * 1e6)
    print(
        f"# {platform.node() or 'host'} | {platform.machine()} | {os.cpu_count()} cpus"
        f" | device: {jax.devices()[0].platform} | jax {jax.__version__} | "
        f"python {sys.version.split()[0]} | "
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC | "
        f"{args.steps} steps x {args.rounds} rounds, interleaved"
    )
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"wall": times, "cpu": cpu}, file)
    for title, table in (("wall-clock", times), ("CPU time (process)", cpu)):
        print(f"\n{title}:\n")
        print(
            "| variant | µs/step (median) | µs/step added (median of pairs) | range |"
        )
        print("| --- | ---: | ---: | ---: |")
        bare = table["bare loop"]
        for name in variants:
            added = [t - b for t, b in zip(table[name], bare, strict=True)]
            print(
                f"| {name} | {statistics.median(table[name]):.1f} | "
                f"{statistics.median(added):+.1f} | "
                f"{min(added):+.1f} – {max(added):+.1f} |"
            )


if __name__ == "__main__":
    main()
