"""Shared by the Flax tests and their subprocess worker: digits data and models.

Kept free of pytest so the worker (run with forced CPU devices) can import it.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from sklearn.datasets import load_digits

TRAIN_SIZE = 1437  # the rest (360 samples) is the test set
TEST_BATCH = 60


def digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`(x_train, y_train, x_test, y_test)`: 8x8 digits scaled to [0, 1], flat."""
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    y = y.astype(np.int32)
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
    return x[:TRAIN_SIZE], y[:TRAIN_SIZE], x[TRAIN_SIZE:], y[TRAIN_SIZE:]


def train_batches(x, y, batch: int = 64, seed: int = 0) -> Iterator[tuple]:
    """Endless shuffled `(inputs, labels)` batches (epochs without remainder)."""
    rng = np.random.default_rng(seed)
    while True:
        order = rng.permutation(len(x))
        for i in range(0, len(x) - batch + 1, batch):
            idx = order[i : i + batch]
            yield x[idx], y[idx]


def eval_batches(x, y, batch: int = TEST_BATCH) -> list[tuple]:
    """The whole set in equal batches (`len(x)` must be a multiple of `batch`)."""
    return [(x[i : i + batch], y[i : i + batch]) for i in range(0, len(x), batch)]


def assert_flax_states_equal(a, b) -> None:
    """The values of two `FlaxState`s equal: params, batch_stats, opt_state, key,
    step, collections and metric states (typed keys compared by key data)."""
    import jax

    def data(x):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        return np.asarray(x)

    assert a.strategy == b.strategy
    for field in (
        "params",
        "batch_stats",
        "opt_state",
        "key",
        "step",
        "collections",
        "metric_states",
    ):
        x, y = getattr(a, field), getattr(b, field)
        assert jax.tree.structure(x) == jax.tree.structure(y), field
        for u, v in zip(jax.tree.leaves(x), jax.tree.leaves(y), strict=True):
            np.testing.assert_array_equal(data(u), data(v), err_msg=field)


def checkpoint_round_trip(make, batches, directory):
    """Trains `make(key=7)` 3 steps saving with `ciclo.checkpoint`, restores into
    `make(key=0)`; returns `(trained, restored, elapsed)`."""
    import ciclo

    ckpt = ciclo.checkpoint(directory)
    trained, _, _ = ciclo.train_loop(
        make(key=7), batches, callbacks=[ckpt], epoch_duration=3, stop=3
    )
    restored, elapsed = ciclo.restore(directory, make(key=0))
    return trained, restored, elapsed


def running_means(values, steps, epoch_duration: int) -> list[float]:
    """The running mean of `values` (logged at `steps`) since the last reset, the
    stateful metrics being reset every `epoch_duration` steps (at epoch ends)."""
    out, since = [], []
    for step, value in zip(steps, values, strict=True):
        if step % epoch_duration == 0:
            since = []
        since.append(float(value))
        out.append(sum(since) / len(since))
    return out
