"""Interpreter cost of `ciclo.loop` per step, fed real `(x, y)` numpy batches.

    python benchmarks/overhead.py [--steps 20000] [--repeats 5]

Reports microseconds per step (best of `repeats`) for:
  1. an empty callback;
  2. a jitted callback returning a 2-entry `Logs` of device scalars (loss, accuracy)
     — history commit and its lagged fetch included;
  3. five callbacks (the jitted logging one plus four empty ones);
and, with `--history-steps`, the bytes history keeps per logged scalar over 10**6
steps. Results go in benchmarks/RESULTS.md by hand, with the machine and date.
"""

from __future__ import annotations

import argparse
import platform
import time
import tracemalloc

import jax
import jax.numpy as jnp
import numpy as np

import ciclo


def make_batches(steps: int, batch: int = 32) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch, 64)).astype(np.float32)
    y = rng.integers(0, 10, size=(batch,)).astype(np.int32)
    return [(x, y)] * steps


def empty(state, batch):
    return None


@jax.jit
def _device_logs(x, y):
    return jnp.mean(x), jnp.mean((x[:, 0] > 0) == (y > 4))


_LOSS, _ACCURACY = jnp.float32(0.5), jnp.float32(0.25)


def device_logs(state, batch):
    """Returns device scalars already computed: the interpreter's cost alone."""
    logs = ciclo.logs()
    logs.add_loss("loss", _LOSS)
    logs.add_metric("accuracy", _ACCURACY)
    return logs


def logging_step(state, batch):
    loss, accuracy = _device_logs(*batch)
    logs = ciclo.logs()
    logs.add_loss("loss", loss)
    logs.add_metric("accuracy", accuracy)
    return logs


def us_per_step(tasks: dict, batches: list, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        _, history, _ = ciclo.loop(None, batches, tasks)
        if len(history):
            history.collect("steps")  # the last lagged rows reach the host
        best = min(best, time.perf_counter() - start)
    return best / len(batches) * 1e6


def history_bytes_per_scalar(steps: int) -> float:
    logs = ciclo.logs()
    logs.add_loss("loss", 0.5)
    logs.add_metric("accuracy", 0.25)
    history = ciclo.history()
    elapsed = ciclo.Elapsed.create()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for _ in range(steps):
        history.commit(elapsed, logs)
        elapsed = elapsed.update(32)
    history.collect("steps")
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return (after - before) / (steps * 6)  # 2 entries + 4 elapsed fields per row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--history-steps", type=int, default=0)
    args = parser.parse_args()
    batches = make_batches(args.steps)
    logging_step(None, batches[0])  # compile outside the timing
    print(f"{platform.processor() or platform.machine()}, jax {jax.__version__}")
    print(f"steps per run: {args.steps}, best of {args.repeats}")
    rows = [
        ("empty callback", {ciclo.every(1): [empty]}),
        ("2-entry device Logs", {ciclo.every(1): [device_logs]}),
        ("5 callbacks (1 logging)", {ciclo.every(1): [device_logs] + [empty] * 4}),
        ("jitted step + 2-entry Logs", {ciclo.every(1): [logging_step]}),
    ]
    for name, tasks in rows:
        print(f"{name:28s} {us_per_step(tasks, batches, args.repeats):6.2f} us/step")
    best = float("inf")
    for _ in range(args.repeats):
        start = time.perf_counter()
        for x, y in batches:
            out = _device_logs(x, y)
        jax.block_until_ready(out)
        best = min(best, time.perf_counter() - start)
    print(
        f"{'(jitted step alone, for loop)':28s} {best / len(batches) * 1e6:6.2f} us/step"
    )
    if args.history_steps:
        size = history_bytes_per_scalar(args.history_steps)
        print(f"history: {size:.1f} bytes per logged scalar at {args.history_steps}")


if __name__ == "__main__":
    main()
