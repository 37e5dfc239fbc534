"""The managed API on one device: `ManagedState`, `managed.train_step`, `managed.step`."""

from __future__ import annotations

import _managed_model as m
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ciclo
from ciclo import managed
from ciclo._strategies import Jit as _Jit  # the registered "jit" class


def scalar_state(strategy: str = "jit", value: float = 0.0) -> managed.ManagedState:
    return managed.ManagedState.create(
        params=jnp.asarray(value), tx=optax.sgd(1.0), strategy=strategy
    )


def test_create_places_state_and_keeps_strategy_static():
    state = m.create("jit")
    assert state.strategy == "jit"
    assert "jit" not in jax.tree.leaves(state)
    assert int(state.step) == 0
    with pytest.raises(ValueError, match="Unknown strategy 'gpu'.*'sharded'"):
        m.create("gpu")


def test_train_step_differentiates_the_sum_of_the_losses():
    @managed.train_step
    def step(state, batch):
        logs = ciclo.logs()
        logs.add_loss("a", state.params**2)  # d/dp = 2p
        logs.add_loss("b", 3.0 * state.params)  # d/dp = 3
        return logs, state

    logs, state = step(scalar_state(value=2.0), None)
    # sgd(1.0): p - (2p + 3) = 2 - 7
    assert float(state.params) == pytest.approx(-5.0)
    assert int(state.step) == 1
    assert float(logs.losses.a) == pytest.approx(4.0)


def test_train_step_without_a_loss_is_an_error_naming_what_was_logged():
    @managed.train_step
    def step(state, batch):
        logs = ciclo.logs()
        logs.add_metric("accuracy", 1.0)
        return logs, state

    with pytest.raises(ValueError, match=r"logged no loss.*metrics\.accuracy"):
        step(scalar_state(), None)


def test_train_step_with_a_non_scalar_loss_is_an_error_naming_it():
    @managed.train_step
    def step(state, batch):
        logs = ciclo.logs()
        logs.add_loss("per_sample", state.params * jnp.ones(3))
        return logs, state

    with pytest.raises(TypeError, match=r"'losses\.per_sample' .* shape \(3,\)"):
        step(scalar_state(), None)


def test_step_runs_without_gradients_and_returns_the_functions_state():
    @managed.step
    def count(state, batch):
        logs = ciclo.logs()
        logs.add_metric("mean", jnp.mean(batch * state.params))
        return logs, state.replace(step=state.step + 1)

    state = scalar_state(value=2.0)
    logs, state = count(state, jnp.arange(4.0))
    assert float(logs.metrics.mean) == pytest.approx(3.0)
    assert float(state.params) == 2.0 and int(state.step) == 1


def test_both_signatures_work_by_hand_and_in_a_loop():
    @managed.step
    def two(state, batch):
        return None, state

    @managed.step
    def three(state, batch, elapsed):
        logs = ciclo.logs()
        logs.add_metric("seen", elapsed.steps if elapsed is not None else -1)
        return logs, state

    state = scalar_state()
    assert two(state, 1.0)[0] == {}
    assert int(three(state, 1.0)[0].metrics.seen) == -1
    assert int(three(state, 1.0, ciclo.Elapsed.create(steps=7))[0].metrics.seen) == 7
    _, history, _ = ciclo.loop(state, [1.0] * 3, {ciclo.every(1): [two, three]})
    assert history.collect("seen") == [0, 1, 2]


def test_compiled_once_per_strategy_not_per_step():
    m.TRACES.clear()
    state, history = m.train(m.create("jit"), m.dataset(steps=5))
    assert m.TRACES == ["jit"]
    assert history.collect("steps_seen") == [0, 1, 2, 3, 4]
    assert int(state.step) == 5


def test_eager_runs_python_every_step_and_matches_jit():
    data = m.dataset(steps=2)
    m.TRACES.clear()
    eager, _ = m.train(m.create("eager"), data)
    assert m.TRACES == ["eager", "eager"]
    jitted, _ = m.train(m.create("jit"), data)
    for a, b in zip(jax.tree.leaves(eager.params), jax.tree.leaves(jitted.params)):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_jit_donate_consumes_the_input_and_matches_jit():
    data = m.dataset(steps=2)
    initial = m.create("jit_donate")
    donated, _ = m.train(initial, data)
    assert jax.tree.leaves(initial.params)[0].is_deleted()
    jitted, _ = m.train(m.create("jit"), data)
    for a, b in zip(jax.tree.leaves(donated.params), jax.tree.leaves(jitted.params)):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_with_strategy_moves_between_single_device_strategies():
    state = m.create("jit")
    moved = state.with_strategy("eager").with_strategy("sharded").with_strategy("jit")
    assert moved.strategy == "jit"
    assert state.with_strategy("jit") is state
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(moved.params)):
        np.testing.assert_array_equal(a, b)


def test_managed_step_as_a_state_method():
    class Counter(managed.ManagedState):
        @managed.train_step
        def train_step(self, batch):
            logs = ciclo.logs()
            logs.add_loss("loss", jnp.mean((self.params - batch) ** 2))
            return logs, self

    state = Counter.create(params=jnp.zeros(()), tx=optax.sgd(0.25))
    _, state = state.train_step(jnp.ones(2))
    assert float(state.params) == pytest.approx(0.5)
    state, history, _ = ciclo.loop(
        state, [jnp.ones(2)] * 2, {ciclo.every(1): Counter.train_step}
    )
    assert int(state.step) == 3 and len(history) == 2


def test_stateful_metrics_come_back_computed():
    clu_metrics = pytest.importorskip("clu.metrics", reason="needs ciclo[flax] (clu)")

    @managed.step
    def evaluate(state, batch):
        logs = ciclo.logs()
        logs.add_stateful_metric("avg", clu_metrics.Average.from_model_output(batch))
        return logs, state

    logs, _ = evaluate(scalar_state(), jnp.arange(4.0))
    assert isinstance(logs.stateful_metrics.avg, jax.Array)
    assert float(logs.stateful_metrics.avg) == pytest.approx(1.5)


def test_bad_inputs_are_clear_errors():
    @managed.step
    def three_values(state, batch):
        return None, state, 1

    with pytest.raises(TypeError, match="must return \\(logs, state\\)"):
        three_values(scalar_state(), None)
    with pytest.raises(TypeError, match="needs a ciclo.managed.ManagedState"):
        three_values({"params": 1.0}, None)


def test_donating_strategy_donates_in_training_but_not_in_evaluation():
    @managed.step
    def evaluate(state, batch):
        x, y = batch
        logs = ciclo.logs()
        logs.add_metric(
            "accuracy", jnp.mean(jnp.argmax(m.apply(state.params, x), -1) == y)
        )
        return logs, state

    state = m.create("jit_donate")
    before = jax.tree.leaves(state.params)[0]
    data = m.dataset(steps=4)
    # the test loop evaluates the train state at each epoch end and discards its own
    # state; had evaluation donated, the next train step would get deleted buffers
    state, history, _ = ciclo.train_loop(
        state,
        data,
        {ciclo.on_train_step: [m.train_step], ciclo.on_test_step: [evaluate]},
        test_dataset=lambda: data[:2],
        epoch_duration=2,
    )
    assert before.is_deleted()
    assert int(state.step) == 4
    assert len(history.collect("accuracy_test")) == 2


def count_compiles(fn) -> int:
    """How many XLA compilations `fn()` triggers."""
    events = []

    def listener(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            events.append(event)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        fn()
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    return len(events)


def test_data_parallel_placement_compiles_once_not_per_place_state():
    strategy = ciclo.get_strategy("data_parallel")
    host = m.create("jit")
    strategy.place_state(host)  # the first placement of this structure compiles
    assert count_compiles(lambda: [strategy.place_state(host) for _ in range(3)]) == 0


@pytest.mark.parametrize("name", ["jit_donate", "data_parallel_donate"])
def test_donating_strategy_copies_the_callers_arrays_even_when_aliased(name):
    @managed.train_step
    def step(state, batch):
        logs = ciclo.logs()
        logs.add_loss("loss", jnp.sum(state.params["a"] * state.params["b"]))
        return logs, state

    shared = jnp.ones(3)
    state = managed.ManagedState.create(
        params={"a": shared, "b": shared}, tx=optax.sgd(0.5), strategy=name
    )
    _, state = step(state, None)
    assert not shared.is_deleted()
    np.testing.assert_allclose(state.with_strategy("jit").params["a"], [0.5, 0.5, 0.5])


def test_create_accepts_a_strategy_object_equal_to_the_registered_one():
    state = managed.ManagedState.create(
        params=jnp.zeros(2), tx=optax.sgd(0.1), strategy=_Jit()
    )
    assert state.strategy == "jit" and not ciclo.get_strategy("jit").donate
    with pytest.raises(ValueError, match="already registered"):
        managed.ManagedState.create(
            params=jnp.zeros(2),
            tx=optax.sgd(0.1),
            strategy=_Jit("jit", donate=True),
        )


def test_managed_state_is_built_as_a_frozen_dataclass_in_every_way():
    import dataclasses

    from flax import struct

    state = managed.ManagedState.create(
        params={"w": jnp.ones(3)}, tx=optax.sgd(0.1), strategy="jit"
    )
    names = [f.name for f in dataclasses.fields(state)]
    by_keyword = managed.ManagedState(**{n: getattr(state, n) for n in names})
    positional = managed.ManagedState(
        state.step, state.apply_fn, state.params, state.tx, state.opt_state,
        state.strategy,
    )  # fmt: skip
    leaves, treedef = jax.tree.flatten(state)
    rebuilt = jax.tree.unflatten(treedef, leaves)
    for other in (by_keyword, positional, rebuilt):
        assert other == state and vars(other).keys() == vars(state).keys()
    assert positional.param_specs == () and state.replace(step=4).step == 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.step = 1
    with pytest.raises(TypeError):
        managed.ManagedState(state.step, state.apply_fn, state.params)

    class WithCount(managed.ManagedState):
        count: int = struct.field(pytree_node=False, default=0, kw_only=True)

    sub = WithCount.create(params={"w": jnp.ones(3)}, tx=optax.sgd(0.1), count=3)
    leaves, treedef = jax.tree.flatten(sub)
    assert jax.tree.unflatten(treedef, leaves).count == 3
    assert sub.replace(step=2).count == 3
