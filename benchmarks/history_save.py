"""How long a checkpoint's save blocks the loop's thread as the history grows.

    python benchmarks/history_save.py [--sizes 4000 400000 1000000] [--saves 7]

For each size N: a `History` of N rows (the elapsed fields plus two logged
scalars, as a loop logging a loss and an accuracy leaves it) and a
`ciclo.checkpoint` (asynchronous saves, `keep=2`) of a tiny state. A first save
writes the history so far (untimed); then, `--saves` times: 1,000 new rows are
committed, the previous save is waited for (as training between saves would
let it finish; untimed), and the save of the state with its history is timed
on the calling thread (`blocks`), then the wait for its background writing
(`background`). The same save without a history gives orbax's own floor. The
table reports medians (ms) and the range. Uses the public API only, so it runs
against any ciclo version (`PYTHONPATH=<other checkout>`) for a before/after.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

import ciclo

NEW_ROWS = 1_000


def grow(history: ciclo.History, rows: int, rng: np.random.Generator) -> None:
    """Commits `rows` rows of two host scalars (loss, accuracy) to `history`."""
    start = len(history)
    losses, accuracies = rng.random(rows).tolist(), rng.random(rows).tolist()
    for i in range(rows):
        logs = ciclo.logs()
        logs.add_loss("loss", losses[i])
        logs.add_metric("accuracy", accuracies[i])
        history.commit(ciclo.Elapsed.create(steps=start + i), logs)


def measure(size: int, saves: int, with_history: bool) -> tuple[list, list]:
    """`(blocks, background)` in ms over `saves` saves after 1,000 new rows each."""
    rng = np.random.default_rng(0)
    history = ciclo.history()
    grow(history, size, rng)
    state = {"w": jnp.zeros(4)}
    blocks, background = [], []
    with tempfile.TemporaryDirectory() as directory:
        ckpt = ciclo.checkpoint(directory, keep=2)
        kwargs = {"history": history} if with_history else {}

        def save() -> None:
            elapsed = ciclo.Elapsed.create(steps=len(history))
            ckpt(elapsed, state, consumed=True, **kwargs)

        save()  # the whole history so far
        for _ in range(saves):
            grow(history, NEW_ROWS, rng)
            ckpt.wait()  # the previous save, finished while "training"
            t0 = time.perf_counter()
            save()
            t1 = time.perf_counter()
            ckpt.wait()
            t2 = time.perf_counter()
            blocks.append((t1 - t0) * 1e3)
            background.append((t2 - t1) * 1e3)
        ckpt.close()
    return blocks, background


def said(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=[4_000, 400_000, 1_000_000]
    )
    parser.add_argument("--saves", type=int, default=7)
    args = parser.parse_args()
    print(
        f"# {platform.node()} {platform.machine()}, jax {jax.__version__}, "
        f"{jax.devices()[0].platform}, ciclo from {os.path.dirname(ciclo.__file__)}, "
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, load "
        f"{os.getloadavg()[0]:.1f}"
    )
    print("| rows of history | save blocks, ms | background, ms |")
    print("| ---: | ---: | ---: |")
    floor, _ = measure(args.sizes[0], args.saves, with_history=False)
    print(f"| no history (orbax alone) | {said(floor)} | |", flush=True)
    for size in args.sizes:
        blocks, background = measure(size, args.saves, with_history=True)
        print(f"| {size:,} | {said(blocks)} | {said(background)} |", flush=True)


if __name__ == "__main__":
    main()
