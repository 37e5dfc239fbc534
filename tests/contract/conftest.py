"""Shared tiny helpers for the contract tests (tests of /work/shared/API.md).

Everything here uses only the public surface: ``import ciclo`` and
``from ciclo import managed``.
"""

from __future__ import annotations

import numpy as np
import pytest

import ciclo


class Recorder:
    """Collects ``(tag, value)`` events in call order."""

    def __init__(self):
        self.events = []

    def __call__(self, tag, value=None):
        self.events.append((tag, value))

    def tags(self):
        return [t for t, _ in self.events]


@pytest.fixture
def recorder():
    return Recorder()


@pytest.fixture
def regression_batches():
    """8 batches of a tiny linear-regression problem: (x (4, 3), y (4,))."""
    rng = np.random.default_rng(0)
    w = np.array([1.0, -2.0, 0.5], np.float32)
    xs = rng.normal(size=(8, 4, 3)).astype(np.float32)
    return [(x, x @ w) for x in xs]


def make_elapsed(steps: int, samples: int = 0) -> ciclo.Elapsed:
    return ciclo.Elapsed.create(steps=steps, samples=samples)


@pytest.fixture
def elapsed_at():
    return make_elapsed
