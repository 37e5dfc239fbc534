"""The History brings every logged device value to the host exactly as logged
(API.md §4): scalars of one dtype, of several dtypes, the same array logged
under two names, and non-scalars, in loops longer than the lagged transfer's
window, read back equal to the values the steps computed."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ciclo

STEPS = 300  # several lagged transfers (64 rows each by default)


def _run(make_logs):
    def step(state, batch):
        return make_logs(state), state + 1

    _, history, _ = ciclo.loop(0, range(STEPS), {ciclo.every(1): jax.jit(step)})
    return history


def test_scalars_of_one_dtype_are_exact():
    history = _run(lambda i: ciclo.logs().add_metric("a", i * 2.0).add_loss("b", i / 4))
    assert history.collect("a") == [i * 2.0 for i in range(STEPS)]
    assert history.collect("b") == pytest.approx([i / 4 for i in range(STEPS)])


def test_a_value_logged_under_two_names_reads_the_same_twice():
    def logs(i):
        x = jnp.float32(i) * 3
        return ciclo.logs().add_metric("x", x).add_metric("y", x)

    history = _run(logs)
    assert (
        history.collect("x") == history.collect("y") == [3.0 * i for i in range(STEPS)]
    )


def test_columns_of_different_dtypes_keep_their_values():
    def logs(i):
        return (
            ciclo.logs()
            .add_metric("count", jnp.int32(i))
            .add_metric("half", jnp.float32(i) / 2)
            .add_metric("vector", jnp.stack([i, i + 1]))
        )

    history = _run(logs)
    assert history.collect("count") == list(range(STEPS))
    assert all(type(v) is int for v in history.collect("count"))
    assert history.collect("half") == [i / 2 for i in range(STEPS)]
    vectors = history.collect("vector")
    assert [np.asarray(v).tolist() for v in vectors] == [
        [i, i + 1] for i in range(STEPS)
    ]


def test_a_column_whose_dtype_changes_keeps_each_value():
    def step(state, batch):
        value = jnp.int32(batch) if batch % 2 else jnp.float32(batch) + 0.5
        return ciclo.logs().add_metric("v", value), state

    _, history, _ = ciclo.loop(0, range(200), {ciclo.every(1): step})
    assert history.collect("v") == [i if i % 2 else i + 0.5 for i in range(200)]


def test_signed_unsigned_and_large_integers_keep_their_values():
    def logs(i):
        return (
            ciclo.logs()
            .add_metric("negative", -jnp.int32(i) * 1_000_003)
            .add_metric("small", jnp.uint8(i % 256))
            .add_metric(
                "wide",
                jnp.asarray(4_000_000_000, jnp.uint32) - jnp.asarray(i, jnp.uint32),
            )
        )

    history = _run(logs)
    assert history.collect("negative") == [-i * 1_000_003 for i in range(STEPS)]
    assert history.collect("small") == [i % 256 for i in range(STEPS)]
    assert history.collect("wide") == [4_000_000_000 - i for i in range(STEPS)]
    assert all(type(v) is int for v in history.collect("wide"))
