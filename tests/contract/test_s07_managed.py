"""API.md §7 — Managed API and strategies (single process, one CPU device)."""

from __future__ import annotations

import copy

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.training import train_state

import ciclo
from ciclo import managed

LR = 0.1


def _mse(params, batch):
    x, y = batch
    return jnp.mean((x @ params - y) ** 2)


@managed.train_step
def train_step(state, batch):
    logs = ciclo.logs()
    logs.add_loss("mse", _mse(state.params, batch))
    return logs, state


@managed.train_step
def two_losses_step(state, batch):
    logs = ciclo.logs()
    logs.add_loss("mse", _mse(state.params, batch))
    logs.add_loss("l2", 0.5 * jnp.sum(state.params**2))
    return logs, state


@managed.step
def eval_step(state, batch, elapsed):
    logs = ciclo.logs()
    logs.add_metric("mse", _mse(state.params, batch))
    logs.add_metric("steps", jnp.asarray(elapsed.steps))
    return logs, state


def _state(strategy="jit"):
    return managed.ManagedState.create(
        params=jnp.zeros(3), tx=optax.sgd(LR), strategy=strategy
    )


def _reference_sgd(batches, n, extra_l2=False):
    """Hand-written SGD (independent of ciclo) on the same loss."""
    params = jnp.zeros(3)
    for batch in batches[:n]:

        def loss(p, batch=batch):
            out = _mse(p, batch)
            return out + (0.5 * jnp.sum(p**2) if extra_l2 else 0.0)

        params = params - LR * jax.grad(loss)(params)
    return np.asarray(params)


def test_managed_state_is_a_flax_train_state_and_moves_strategy():
    state = _state("jit")
    assert isinstance(state, train_state.TrainState)
    moved = state.with_strategy("eager")
    assert isinstance(moved, managed.ManagedState)
    np.testing.assert_array_equal(np.asarray(moved.params), np.zeros(3))


def test_train_step_differentiates_sum_of_losses_and_applies_gradients(
    regression_batches,
):
    state = _state()
    for batch in regression_batches[:3]:
        logs, state = train_step(state, batch)
    assert int(state.step) == 3
    np.testing.assert_allclose(
        np.asarray(state.params),
        _reference_sgd(regression_batches, 3),
        rtol=1e-5,
        atol=1e-6,
    )
    assert float(logs.losses.mse) == pytest.approx(
        float(_mse(_reference_sgd(regression_batches, 2), regression_batches[2])),
        rel=1e-5,
    )

    state = _state()
    for batch in regression_batches[:3]:
        logs, state = two_losses_step(state, batch)
    np.testing.assert_allclose(
        np.asarray(state.params),
        _reference_sgd(regression_batches, 3, extra_l2=True),
        rtol=1e-5,
        atol=1e-6,
    )


def test_step_runs_without_gradients_and_receives_elapsed(regression_batches):
    state = _state()
    elapsed = ciclo.Elapsed.create(steps=7)
    logs, new_state = eval_step(state, regression_batches[0], elapsed)
    np.testing.assert_array_equal(np.asarray(new_state.params), np.zeros(3))
    assert int(new_state.step) == 0
    assert int(logs.metrics.steps) == 7
    assert float(logs.metrics.mse) == pytest.approx(
        float(_mse(jnp.zeros(3), regression_batches[0])), rel=1e-5
    )


@pytest.mark.parametrize(
    "strategy",
    ["eager", "jit", "jit_donate", "data_parallel", "data_parallel_donate", "sharded"],
)
def test_every_strategy_gives_the_same_parameters(strategy, regression_batches):
    state = _state(strategy)
    for batch in regression_batches[:3]:
        logs, state = train_step(state, batch)
    params = state.with_strategy("jit").params
    np.testing.assert_allclose(
        np.asarray(params), _reference_sgd(regression_batches, 3), rtol=1e-5, atol=1e-6
    )
    assert np.ndim(np.asarray(logs.losses.mse)) == 0


def test_managed_steps_work_as_loop_callbacks_and_state_methods(regression_batches):
    state, history, _ = ciclo.loop(
        _state(), regression_batches[:3], {ciclo.every(1): [train_step, eval_step]}
    )
    np.testing.assert_allclose(
        np.asarray(state.params),
        _reference_sgd(regression_batches, 3),
        rtol=1e-5,
        atol=1e-6,
    )
    assert [int(s) for s in history.collect("metrics.steps")] == [0, 1, 2]

    class MyState(managed.ManagedState):
        @managed.train_step
        def train_step(self, batch):
            logs = ciclo.logs()
            logs.add_loss("mse", _mse(self.params, batch))
            return logs, self

    s = MyState.create(params=jnp.zeros(3), tx=optax.sgd(LR), strategy="jit")
    for batch in regression_batches[:2]:
        logs, s = s.train_step(batch)
    np.testing.assert_allclose(
        np.asarray(s.params),
        _reference_sgd(regression_batches, 2),
        rtol=1e-5,
        atol=1e-6,
    )


def test_register_and_get_strategy(regression_batches):
    jit = ciclo.get_strategy("jit")
    assert isinstance(jit, ciclo.Strategy)
    # register a copy: the registered "jit" object itself must stay untouched
    ciclo.register_strategy("contract_jit_copy", copy.copy(ciclo.get_strategy("jit")))
    assert isinstance(ciclo.get_strategy("contract_jit_copy"), ciclo.Strategy)
    state = _state("contract_jit_copy")
    for batch in regression_batches[:2]:
        _, state = train_step(state, batch)
    np.testing.assert_allclose(
        np.asarray(state.params),
        _reference_sgd(regression_batches, 2),
        rtol=1e-5,
        atol=1e-6,
    )
    with pytest.raises((KeyError, ValueError)):
        ciclo.get_strategy("no_such_strategy_q")
