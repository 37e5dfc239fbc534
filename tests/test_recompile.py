"""Issue 28: a compiled step fed batches of many shapes recompiles for each; the
loop warns once, naming the shapes and the fix."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ciclo
from ciclo import managed

SILENCE = "ciclo: the batches reaching"  # the documented message prefix


@jax.jit
def jitted_step(state, batch):
    return ciclo.logs().add_loss("loss", jnp.mean(batch)), state + 1


def batches(*sizes):
    return [np.ones((n, 2), np.float32) for n in sizes]


def test_a_jitted_step_fed_many_shapes_warns_once_naming_them_and_the_fix():
    with pytest.warns(UserWarning, match=SILENCE) as record:
        ciclo.loop(0, batches(8, 7, 6, 5, 4, 3), {ciclo.every(1): jitted_step})
    ours = [w for w in record if str(w.message).startswith(SILENCE)]
    assert len(ours) == 1  # once, not once per new shape
    message = str(ours[0].message)
    for shape in ("(8, 2)", "(7, 2)", "(6, 2)"):
        assert shape in message
    assert "jitted_step" in message
    assert "pad" in message and "drop_remainder" in message
    assert ours[0].filename == __file__  # points at the user's line


def test_a_smaller_last_batch_per_epoch_is_not_worth_a_warning():
    data = batches(8, 8, 3) * 3  # three epochs, each with a smaller last batch
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tasks = {ciclo.on_train_step: jitted_step, ciclo.on_test_step: jitted_step}
        state, _, elapsed = ciclo.train_loop(
            0, data, tasks, epoch_duration=3, test_dataset=lambda: batches(8, 5)
        )
    assert elapsed.steps == 9


def test_a_plain_python_callback_is_not_watched():
    seen = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ciclo.loop(
            None, batches(8, 7, 6, 5), {ciclo.every(1): lambda s, b: seen.append(b)}
        )
    assert len(seen) == 4


def test_the_warning_is_silenced_by_its_message():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message=SILENCE)
        state, _, _ = ciclo.loop(0, batches(8, 7, 6, 5), {ciclo.every(1): jitted_step})
    assert int(state) == 4


def test_a_managed_step_fed_many_shapes_warns():
    @managed.train_step
    def train_step(state, batch):
        return ciclo.logs().add_loss("loss", jnp.mean((state.params - batch) ** 2))

    state = managed.ManagedState.create(
        params=jnp.float32(0.0), tx=optax.sgd(0.1), strategy="jit"
    )
    with pytest.warns(UserWarning, match=SILENCE):
        ciclo.train_loop(state, batches(4, 3, 2), {ciclo.on_train_step: train_step})


@jax.jit
def dict_step(state, batch):
    return ciclo.logs().add_loss("loss", jnp.mean(batch["x"])), state + 1


def test_dict_batches_are_watched_by_their_leaf_shapes():
    many = [{"x": np.ones((n, 2), np.float32), "y": np.ones(n)} for n in (8, 7, 6, 5)]
    with pytest.warns(UserWarning, match=SILENCE) as record:
        ciclo.loop(0, many, {ciclo.every(1): dict_step})
    (ours,) = [w for w in record if str(w.message).startswith(SILENCE)]
    assert "(7, 2)" in str(ours.message) and "(7,)" in str(ours.message)
    same = [{"x": np.ones((8, 2), np.float32), "y": np.ones(8)} for _ in range(6)]
    nested = [{"x": {"a": np.ones((8, 2), np.float32)}, "y": np.ones(8)}] * 6
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, history, elapsed = ciclo.loop(0, same, {ciclo.every(1): dict_step})
        assert elapsed.samples == 48 and len(history) == 6
        nested_step = jax.jit(lambda s, b: (ciclo.logs().add_loss("l", 0.0), s + 1))
        _, _, elapsed = ciclo.loop(0, nested, {ciclo.every(1): nested_step})
        assert elapsed.samples == 48
