"""`elapsed.samples` counts every batch's samples (API.md §1, §3): the largest
first axis of its leaves, whatever the batch's form, also when consecutive
batches change shape and when a batch object is reused with other arrays."""

from __future__ import annotations

import numpy as np
import pytest

import ciclo


def _samples_seen(batches, **kwargs):
    seen = []

    def step(state, batch, elapsed):
        seen.append(elapsed.samples)

    _, history, elapsed = ciclo.loop(
        None, iter(batches), {ciclo.every(1): step}, **kwargs
    )
    return seen, elapsed.samples


def _pair(n, m=None):
    return (np.zeros((n, 3), np.float32), np.zeros(m if m is not None else n))


@pytest.mark.parametrize(
    "batches, counts",
    [
        # the last batch smaller, then full ones again
        ([_pair(8), _pair(8), _pair(3), _pair(8)], [8, 8, 3, 8]),
        # the largest first axis of the leaves decides
        ([_pair(4, 9), _pair(4, 2), _pair(4, 9)], [9, 4, 9]),
        # dicts, a single array, a nested batch
        ([{"x": np.zeros((5, 2))}, {"x": np.zeros((6, 2))}], [5, 6]),
        ([np.zeros((7, 2)), np.zeros((7, 2)), np.zeros((2, 2))], [7, 7, 2]),
        (
            [((np.zeros((3, 1)),), np.zeros(3)), ((np.zeros((4, 1)),), np.zeros(4))],
            [3, 4],
        ),
        # leaves without a shape count as one sample
        ([(1.0, 2.0), (np.zeros(5), 1.0)], [1, 5]),
    ],
)
def test_samples_follow_each_batch(batches, counts):
    seen, total = _samples_seen(batches)
    assert seen == list(np.cumsum([0, *counts[:-1]]))
    assert total == sum(counts)


def test_a_reused_batch_object_is_counted_by_its_current_arrays():
    batch = {"x": np.zeros((4, 2))}

    def batches():
        for n in (4, 4, 9, 1):
            batch["x"] = np.zeros((n, 2))  # the same dict, other arrays
            yield batch

    _, total = _samples_seen(batches())
    assert total == 4 + 4 + 9 + 1


def test_batch_size_fn_is_asked_for_every_batch():
    asked = []

    def size(shapes):
        asked.append(shapes)
        return 10

    _, total = _samples_seen([_pair(2)] * 3, batch_size_fn=size)
    assert total == 30
    assert len(asked) == 3


def test_recompile_warning_still_counts_distinct_shapes():
    import jax

    step = jax.jit(
        lambda state, batch: (ciclo.logs().add_metric("n", batch.sum()), state)
    )
    shapes = [np.zeros((n, 2)) for n in range(1, 12)]
    with pytest.warns(Warning, match="shapes"):
        ciclo.loop(0, iter(shapes), {ciclo.every(1): step})


def test_two_alternating_shapes_do_not_warn():
    import warnings

    import jax

    step = jax.jit(
        lambda state, batch: (ciclo.logs().add_metric("n", batch.sum()), state)
    )
    shapes = [np.zeros((n, 2)) for n in (8, 8, 3, 8, 3, 8)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, history, _ = ciclo.loop(0, iter(shapes), {ciclo.every(1): step})
    assert len(history) == 6
