"""A managed step follows the state it is given: its optimizer, its apply
function and its class, whichever call made the state (API.md §7: the state
carries `tx`, `apply_fn` and the strategy; a step returns the new state)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import struct

import ciclo
from ciclo import managed


def _loss(state, batch):
    x, y = batch
    pred = x @ state.params["w"]
    return ciclo.logs().add_loss("loss", jnp.mean((pred - y) ** 2))


def _batches(n=6):
    rng = np.random.default_rng(0)
    return [
        (rng.normal(size=(4, 3)).astype(np.float32), np.ones(4, np.float32))
        for _ in range(n)
    ]


def _state(tx, strategy="jit"):
    return managed.ManagedState.create(
        params={"w": jnp.ones(3, jnp.float32)}, tx=tx, strategy=strategy
    )


@pytest.mark.parametrize("strategy", ["jit", "jit_donate"])
def test_a_new_optimizer_between_loops_is_used(strategy):
    step = managed.train_step(_loss)
    state, _, _ = ciclo.loop(
        _state(optax.sgd(0.1), strategy), _batches(3), {ciclo.every(1): step}
    )
    moved = np.asarray(state.params["w"])
    assert not np.allclose(moved, 1.0)
    frozen = optax.sgd(0.0)  # the same step, a state whose optimizer does not move
    state = state.replace(tx=frozen, opt_state=frozen.init(state.params))
    state, history, _ = ciclo.loop(state, _batches(3), {ciclo.every(1): step})
    assert state.tx is frozen
    np.testing.assert_array_equal(np.asarray(state.params["w"]), moved)
    assert len(history.collect("loss")) == 3


def test_an_optimizer_swapped_inside_the_loop_is_used_from_the_next_step():
    step = managed.train_step(_loss)
    frozen = optax.sgd(0.0)
    seen = []

    def swap(state, batch):
        seen.append(np.asarray(state.params["w"]))
        if len(seen) == 2:  # after the second step: an optimizer that does not move
            return None, state.replace(tx=frozen, opt_state=frozen.init(state.params))
        return None, state

    state, _, elapsed = ciclo.loop(
        _state(optax.sgd(0.1)), _batches(6), {ciclo.every(1): [step, swap]}
    )
    assert elapsed.steps == 6 and state.tx is frozen
    assert not np.allclose(seen[0], seen[1])  # it trained before the swap
    for later in seen[2:]:  # and not after
        np.testing.assert_array_equal(later, seen[1])
    np.testing.assert_array_equal(np.asarray(state.params["w"]), seen[1])


def test_a_step_that_returns_a_state_with_other_static_fields():
    frozen = optax.sgd(0.0)

    def fit(state, batch):
        logs = _loss(state, batch)
        return logs, state.replace(tx=frozen)  # inside the compiled step

    step = managed.step(fit)
    state, history, _ = ciclo.loop(
        _state(optax.sgd(0.1)), _batches(3), {ciclo.every(1): step}
    )
    assert state.tx is frozen and int(state.step) == 0
    assert len(history.collect("loss")) == 3


@struct.dataclass
class _Counted(managed.ManagedState):
    """A state with a field of its own (API.md §7: subclasses are states too)."""

    seen: jax.Array = 0


def test_a_subclass_with_a_field_of_its_own_keeps_it():
    def fit(state, batch):
        logs = _loss(state, batch)
        return logs, state.replace(seen=state.seen + 1)

    step = managed.train_step(fit)
    start = _Counted.create(
        params={"w": jnp.ones(3, jnp.float32)}, tx=optax.sgd(0.1), seen=jnp.int32(0)
    )
    state, history, _ = ciclo.loop(start, _batches(4), {ciclo.every(1): step})
    assert type(state) is _Counted
    assert int(state.seen) == 4 and int(state.step) == 4
    assert not np.allclose(np.asarray(state.params["w"]), 1.0)
    assert len(history.collect("loss")) == 4


@pytest.mark.parametrize("strategy", ["jit", "jit_donate", "eager"])
def test_loop_and_calls_by_hand_train_alike(strategy):
    step, tx = managed.train_step(_loss), optax.adam(0.05)
    batches = _batches(5)
    state, history, _ = ciclo.loop(
        _state(tx, strategy), batches, {ciclo.every(1): step}
    )
    by_hand = _state(tx, strategy)
    losses = []
    for batch in batches:
        logs, by_hand = step(by_hand, batch)
        losses.append(float(logs.losses.loss))
    assert type(state) is type(by_hand) is managed.ManagedState
    assert int(state.step) == int(by_hand.step) == 5
    np.testing.assert_allclose(
        np.asarray(state.params["w"]), np.asarray(by_hand.params["w"]), rtol=1e-6
    )
    np.testing.assert_allclose(history.collect("loss"), losses, rtol=1e-6)
    # the state keeps its fields, in their order
    assert list(vars(state)) == list(vars(by_hand))
    assert jax.tree.structure(state) == jax.tree.structure(by_hand)


@pytest.mark.parametrize("strategy", ["jit", "jit_donate"])
def test_alternating_optimizers_compile_once_each(strategy):
    """A run that switches between two optimizers (e.g. two phases repeated)
    traces the step once per optimizer, not at every switch."""
    traces = []

    def counted(state, batch):
        traces.append(1)  # runs while the step is traced
        return _loss(state, batch)

    step = managed.train_step(counted)
    fast, slow = optax.sgd(0.1), optax.sgd(0.01)
    state = _state(fast, strategy)
    for tx in (fast, slow, fast, slow, fast):
        state = state.replace(tx=tx, opt_state=tx.init(state.params))
        state, history, _ = ciclo.loop(state, _batches(2), {ciclo.every(1): step})
        assert state.tx is tx
        assert len(history.collect("loss")) == 2
        _, state = step(state, _batches(1)[0])  # and by hand
    assert len(traces) == 2


# -- states of other classes: every field the step leaves alone is the input's ---
@struct.dataclass
class _Tagged(managed.ManagedState):
    """A subclass with a data field a step may leave as it is and a static one."""

    seen: jax.Array = 0
    other: jax.Array = 0
    tag: str = struct.field(pytree_node=False, default="a")


def _tagged(strategy="jit"):
    return _Tagged.create(
        params={"w": jnp.ones(3, jnp.float32)},
        tx=optax.sgd(0.1),
        strategy=strategy,
        seen=jnp.int32(0),
        other=jnp.int32(0),
    )


@pytest.mark.parametrize("strategy", ["jit", "jit_donate"])
def test_a_subclass_field_the_step_leaves_alone_is_kept_and_usable(strategy):
    step = managed.train_step(_loss)  # `seen` and `tag` untouched
    start = _tagged(strategy)
    state, history, _ = ciclo.loop(start, _batches(4), {ciclo.every(1): step})
    for _ in range(2):  # and by hand, from the loop's state
        _, state = step(state, _batches(1)[0])
    assert type(state) is _Tagged and state.tag == "a"
    assert int(state.step) == 6  # and the fields it left alone readable
    assert int(state.seen) == int(state.other) == 0
    assert list(vars(state)) == list(vars(start))  # the fields, in their order
    assert jax.tree.structure(state) == jax.tree.structure(start)
    assert len(history.collect("loss")) == 4


def test_a_step_that_keeps_a_field_for_one_shape_and_changes_it_for_another():
    """Which fields a step changes may depend on what it is traced with."""

    def fit(state, batch):
        logs = _loss(state, batch)
        state = state.replace(other=state.other + 10)  # always
        if batch[0].shape[0] == 4:  # decided while traced
            state = state.replace(seen=state.seen + 1)
        return logs, state

    step = managed.step(fit)
    rng = np.random.default_rng(1)
    small = (rng.normal(size=(2, 3)).astype(np.float32), np.ones(2, np.float32))
    batches = [_batches(1)[0], small, _batches(1)[0], small, small]
    state, history, _ = ciclo.loop(_tagged(), batches, {ciclo.every(1): step})
    assert int(state.seen) == 2  # the two batches of 4 rows
    assert int(state.other) == 50
    _, state = step(state, small)
    _, state = step(state, _batches(1)[0])
    assert int(state.seen) == 3 and int(state.other) == 70
    assert type(state) is _Tagged
    assert len(history.collect("loss")) == 5


def test_a_subclass_with_a_post_init_runs_it_on_the_steps_output():
    made = []

    @struct.dataclass
    class Checked(managed.ManagedState):
        def __post_init__(self):
            made.append(type(self.step))

    step = managed.train_step(_loss)
    start = Checked.create(params={"w": jnp.ones(3, jnp.float32)}, tx=optax.sgd(0.1))
    made.clear()
    state, _, _ = ciclo.loop(start, _batches(3), {ciclo.every(1): step})
    assert type(state) is Checked and int(state.step) == 3
    assert made  # the class's own checks ran on the states the steps made


@pytest.mark.parametrize("strategy", ["jit", "jit_donate"])
def test_a_flax_state_trains_alike_in_a_loop_and_by_hand_compiling_once(strategy):
    import flax.linen as nn

    traces = []

    def mse(preds, target):
        traces.append(1)  # runs while a step is traced
        return jnp.mean((preds[:, 0] - target) ** 2)

    def make():
        return ciclo.create_flax_state(
            nn.Dense(1),
            jnp.ones((4, 3)),
            optax.adam(0.05),
            losses={"mse": mse},
            strategy=strategy,
        )

    looped, by_hand = make(), make()
    key = np.asarray(jax.random.key_data(looped.key))
    traces.clear()
    looped, history, _ = ciclo.train_loop(looped, _batches(5))
    losses = []
    for batch in _batches(5):
        logs, by_hand = by_hand.train_step(batch)
        losses.append(float(logs.losses.mse))
    assert len(traces) == 2  # once per state (each has its own config), not per step
    assert type(looped) is type(by_hand) and int(looped.step) == int(by_hand.step) == 5
    for a, b in zip(jax.tree.leaves(looped.params), jax.tree.leaves(by_hand.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)
    np.testing.assert_allclose(history.collect("losses.mse"), losses, rtol=1e-6)
    # the key each step folds `step` into is the same key, still a typed key
    assert jax.dtypes.issubdtype(looped.key.dtype, jax.dtypes.prng_key)
    np.testing.assert_array_equal(np.asarray(jax.random.key_data(looped.key)), key)
    assert int(by_hand.metric_states["avg_mse"].count) == 5  # (train_loop resets it)
    assert list(vars(looped)) == list(vars(make()))
