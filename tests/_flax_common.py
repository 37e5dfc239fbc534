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
