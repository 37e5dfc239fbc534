"""API.md §12 — Compatibility with Ciclo 0.1 (code written for cgarciae/ciclo 0.1.x)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ciclo
from ciclo import managed

clu_metrics = pytest.importorskip("clu.metrics")

_X = np.ones((4, 3), np.float32)
_Y = np.full((4,), 2.0, np.float32)
BATCH = (_X, _Y)


def _state(cls=managed.ManagedState, strategy="jit", **fields):
    return cls.create(
        params=jnp.zeros(3), tx=optax.sgd(0.1), strategy=strategy, **fields
    )


def _mse(params):
    return jnp.mean((_X @ params - _Y) ** 2)


# ------------------------------------------------------------------- Logs chaining


def test_logs_add_chaining_as_in_0_1():
    logs = ciclo.logs().add_loss("loss", 1.0).add_metric("acc", 0.5).add_output("o", 3)
    assert logs["losses"]["loss"] == 1.0
    assert logs["metrics"]["acc"] == 0.5
    assert logs["outputs"]["o"] == 3


def test_logs_dict_argument_forms_of_0_1():
    logs = ciclo.logs()
    logs.add_metrics({"acc": 0.5, "f1": 0.25})
    logs.add_losses({"l1": 1.0}, add_metrics=True)
    assert dict(logs["metrics"]) == {"acc": 0.5, "f1": 0.25, "l1": 1.0}
    assert dict(logs["losses"]) == {"l1": 1.0}


# ------------------------------------------------------------------- inject, callbacks


def test_inject_passes_the_first_n_arguments():
    assert ciclo.inject(lambda a, b: (a, b), 1, 2, 3, 4) == (1, 2)
    assert ciclo.inject(lambda: "none", 1, 2) == "none"

    class C:
        def m(self, a):
            return a

    assert ciclo.inject(C().m, "x", "y") == "x"


def test_callbacks_inner_loop():
    def inner(state):
        return ciclo.loop(state, range(3), {ciclo.every(1): [lambda s, b: _m(v=b)]})

    _, history, _ = ciclo.loop(
        0, range(1), {ciclo.every(1): [ciclo.callbacks.inner_loop("valid", inner)]}
    )
    assert history.collect("v_valid") == [2]


def _m(**values):
    logs = ciclo.logs()
    for k, v in values.items():
        logs.add_metric(k, v)
    return logs


# ------------------------------------------------------------------- managed steps


def test_managed_train_step_returning_logs_only():
    @managed.train_step
    def step(state, batch):
        logs = ciclo.logs()
        logs.add_loss("mse", _mse(state.params))
        return logs

    logs, state = step(_state(), BATCH)
    expected = -0.1 * jax.grad(_mse)(jnp.zeros(3))
    np.testing.assert_allclose(
        np.asarray(state.params), np.asarray(expected), rtol=1e-5
    )
    assert float(logs.losses.mse) == pytest.approx(4.0)


def test_managed_step_of_arity_one_returning_a_state():
    @managed.step
    def only_state(state):
        return state.replace(step=state.step + 5)

    logs, s1 = only_state(_state(), BATCH)
    assert int(s1.step) == 5


def test_managed_step_with_elapsed_returning_none():
    @managed.step
    def returns_none(state, batch, elapsed):
        return None

    s0 = _state().replace(step=3)
    logs, s1 = returns_none(s0, BATCH, ciclo.Elapsed.create())
    assert int(s1.step) == 3


def test_managed_step_returning_logs_and_none_state():
    @managed.step
    def tuple_none_state(state, batch):
        return _m(s=jnp.sum(batch[0])), None

    s0 = _state().replace(step=3)
    logs, s1 = tuple_none_state(s0, BATCH)
    assert int(s1.step) == 3
    assert float(logs.metrics.s) == 12.0


def test_managed_steps_spread_with_double_star():
    @managed.train_step
    def step(state, batch):
        logs = ciclo.logs()
        logs.add_loss("mse", _mse(state.params))
        return logs, state

    spread = {**step}
    assert len(spread) == 1
    ((sched, cbs),) = spread.items()
    assert all(sched(ciclo.Elapsed.create(steps=i)) for i in range(3))
    state, history, _ = ciclo.loop(_state(), [BATCH] * 3, {**step})
    assert int(state.step) == 3
    assert len(history.collect("mse")) == 3


class _MetricState(managed.ManagedState):
    mean_value: clu_metrics.Average = None


def test_stateful_metrics_merged_into_the_state():
    @managed.step
    def step(state, batch):
        logs = ciclo.logs()
        logs.add_stateful_metric(
            "mean_value", clu_metrics.Average.from_model_output(jnp.asarray(batch))
        )
        return logs, state

    state = _state(_MetricState, mean_value=clu_metrics.Average.empty())
    logs, state = step(state, jnp.asarray([1.0, 3.0]))
    logs, state = step(state, jnp.asarray([5.0, 7.0]))
    assert float(state.mean_value.compute()) == pytest.approx(
        4.0
    )  # accumulated in the state
    assert float(logs["stateful_metrics"]["mean_value"]) == pytest.approx(
        4.0
    )  # logged computed


# ------------------------------------------------------------------- create_flax_state


def test_create_flax_state_logs_avg_loss_metrics():
    import flax.linen as nn

    state = ciclo.create_flax_state(
        nn.Dense(2),
        inputs=_X[:1],
        tx=optax.sgd(0.1),
        losses={"loss": optax.softmax_cross_entropy_with_integer_labels},
    )
    labels = np.array([0, 1, 0, 1], np.int32)
    l1, state = state.train_step((_X, labels))
    l2, state = state.train_step((_X, labels))
    assert float(l2.entry_value("avg_loss")) == pytest.approx(
        (float(l1.losses.loss) + float(l2.losses.loss)) / 2, rel=1e-5
    )


# ------------------------------------------------------------------- strategies


def test_strategies_lift_batch_size():
    assert ciclo.get_strategy("eager").lift_batch_size(8) == 8
    assert ciclo.get_strategy("jit").lift_batch_size(8) == 8
    assert (
        ciclo.get_strategy("data_parallel").lift_batch_size(8)
        == 8 * jax.local_device_count()
    )
