"""API.md §11 — Resuming.

API.md does not spell the "one line" that resumes a killed run; these tests assume
``ciclo.train_loop(..., resume=<checkpoint directory>)`` (the checkpoint callback
writing to that directory is given in ``callbacks`` as usual).
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import numpy as np
import optax
import pytest

import ciclo

N_FEATURES, N_CLASSES, BS, N_BATCHES = 4, 3, 8, 8
_rng = np.random.default_rng(0)
_W = _rng.normal(size=(N_FEATURES, N_CLASSES)).astype(np.float32)
_XS = _rng.normal(size=(N_BATCHES, BS, N_FEATURES)).astype(np.float32)
BATCHES = [(x, (x @ _W).argmax(-1).astype(np.int32)) for x in _XS]


class _DropMLP(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = False):
        x = nn.relu(nn.Dense(8)(x))
        x = nn.Dropout(0.3, deterministic=not train)(x)  # uses the RNG in the state
        return nn.Dense(N_CLASSES)(x)


_MODEL = _DropMLP()


@functools.cache
def _fresh_state():
    # states are immutable: one initial state is shared, so the steps compile once
    # adam: the optimizer state matters for an exact resume
    return ciclo.create_flax_state(
        _MODEL,
        inputs=BATCHES[0][0][:1],
        tx=optax.adam(1e-2),
        losses={"loss": optax.softmax_cross_entropy_with_integer_labels},
        key=0,
    )


def _leaves(state):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(state.params)]


@pytest.fixture(scope="module")
def uninterrupted():
    state, history, elapsed = ciclo.train_loop(_fresh_state(), BATCHES, stop=N_BATCHES)
    return state, history, elapsed


def test_restore_and_continue_equals_uninterrupted_bit_for_bit(tmp_path, uninterrupted):
    """The two-line form (restore + train_loop(elapsed=...)) with optimizer state and RNG."""
    ref_state, ref_history, _ = uninterrupted
    d = str(tmp_path / "ckpt")
    ciclo.train_loop(
        _fresh_state(),
        BATCHES,
        callbacks=[ciclo.checkpoint(d)],
        epoch_duration=5,
        stop=5,
    )
    state, elapsed = ciclo.restore(d, _fresh_state())
    assert elapsed.steps == 5
    state, history, end = ciclo.train_loop(
        state, iter(BATCHES[elapsed.steps :]), elapsed=elapsed, stop=N_BATCHES
    )
    assert end.steps == N_BATCHES
    assert int(state.step) == N_BATCHES
    for a, b in zip(_leaves(state), _leaves(ref_state)):
        np.testing.assert_array_equal(a, b)


class _Killed(Exception):
    pass


def _kill_at(n):
    def cb(state, batch, elapsed):
        if elapsed.steps == n:
            raise _Killed

    return cb


_ONE_LINE = "contract gap: no one-line resume (train_loop(resume=dir) not supported)"


def test_one_line_resume_of_a_killed_run_equals_uninterrupted(tmp_path, uninterrupted):
    ref_state, ref_history, ref_elapsed = uninterrupted
    d = str(tmp_path / "ckpt")

    def run(extra_tasks):
        return ciclo.train_loop(
            _fresh_state(),
            BATCHES,
            extra_tasks,
            callbacks=[ciclo.checkpoint(d)],
            epoch_duration=3,
            stop=N_BATCHES,
            resume=d,
        )

    with pytest.raises(_Killed):  # killed during batch 7, after the checkpoint at 6
        run({ciclo.on_train_batch_begin: [_kill_at(7)]})

    state, history, elapsed = run({})  # the same line again
    assert elapsed.steps == ref_elapsed.steps == N_BATCHES
    assert elapsed.samples == ref_elapsed.samples
    for a, b in zip(_leaves(state), _leaves(ref_state)):
        np.testing.assert_array_equal(a, b)
    # the history so far is restored: one row per step, as in the uninterrupted run
    steps, loss = history.collect("steps", "loss")
    ref_steps, ref_loss = ref_history.collect("steps", "loss")
    assert list(steps) == list(ref_steps)
    np.testing.assert_array_equal(
        np.asarray(loss, np.float32), np.asarray(ref_loss, np.float32)
    )


def test_one_line_resume_with_no_checkpoint_starts_fresh(tmp_path, uninterrupted):
    ref_state, _, _ = uninterrupted
    d = str(tmp_path / "empty")
    state, _, elapsed = ciclo.train_loop(
        _fresh_state(),
        BATCHES,
        callbacks=[ciclo.checkpoint(d)],
        stop=N_BATCHES,
        resume=d,
    )
    assert elapsed.steps == N_BATCHES
    for a, b in zip(_leaves(state), _leaves(ref_state)):
        np.testing.assert_array_equal(a, b)
