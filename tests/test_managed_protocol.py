"""The managed API as a callback, the strategy protocol's public guarantees, and the
Flax state's `avg_<loss>` / gradient options (one device; the 4-device checks are in
`_strategies_worker.py`)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ciclo
from ciclo import managed

cm = pytest.importorskip("clu.metrics", reason="needs ciclo[flax] (clu)")


def scalar_state(strategy="jit", value=0.0, cls=managed.ManagedState, **fields):
    return cls.create(
        params=jnp.asarray(value), tx=optax.sgd(1.0), strategy=strategy, **fields
    )


# -- strategies -------------------------------------------------------------------
def test_register_strategy_keeps_the_callers_name():
    mine = ciclo.Strategy("original")
    ciclo.register_strategy("alias_one", mine, overwrite=True)
    ciclo.register_strategy("alias_two", mine, overwrite=True)
    assert mine.name == "original"
    assert ciclo.get_strategy("alias_one") is ciclo.get_strategy("alias_two") is mine
    state = scalar_state(mine)  # used under the name it is registered with
    assert state.strategy == "alias_one"


def test_register_strategy_errors_name_what_is_missing():
    with pytest.raises(TypeError, match=r"lacks .*'wrap'"):
        ciclo.register_strategy("broken2", object())
    with pytest.raises(TypeError, match="non-empty str"):
        ciclo.register_strategy("", ciclo.Strategy())


def test_data_parallel_builds_its_mesh_once(monkeypatch):
    built = []

    class CountingMesh(jax.sharding.Mesh):
        def __new__(cls, *args, **kwargs):
            built.append(args)
            return super().__new__(cls, *args, **kwargs)

    monkeypatch.setattr(jax.sharding, "Mesh", CountingMesh)
    fresh = type(ciclo.get_strategy("data_parallel"))("dp_mesh_once")
    ciclo.register_strategy("dp_mesh_once", fresh, overwrite=True)

    @managed.train_step
    def fit(state, batch):
        return ciclo.logs().add_loss("loss", jnp.mean((state.params - batch) ** 2))

    state = scalar_state("dp_mesh_once")
    for _ in range(4):
        logs, state = fit(state, np.ones(2, np.float32))
    state.with_strategy("jit").with_strategy("dp_mesh_once")
    assert len(built) == 1
    assert float(logs.losses.loss) >= 0.0


def test_lift_batch_size():
    assert ciclo.get_strategy("jit").lift_batch_size(32) == 32
    assert ciclo.get_strategy("eager").lift_batch_size(32) == 32
    dp = ciclo.get_strategy("data_parallel")
    assert dp.lift_batch_size(32) == 32 * jax.local_device_count()
    assert ciclo.get_strategy("sharded").lift_batch_size(8) == 8 * jax.device_count()


# -- managed steps as callbacks -----------------------------------------------------
def _loss(state):
    return ciclo.logs().add_loss("loss", (state.params - 3.0) ** 2)


CONVENTIONS = {
    # f(state) -> logs
    "state->logs": lambda state: _loss(state),
    # f(state, batch) -> (logs, state)
    "state,batch->(logs,state)": lambda state, batch: (_loss(state), state),
    # f(state, batch, elapsed) -> (None-free logs, state) using elapsed
    "state,batch,elapsed->logs": lambda state, batch, elapsed: _loss(state).add_metric(
        "seen", elapsed.steps
    ),
}


@pytest.mark.parametrize("strategy", ["eager", "jit"])
@pytest.mark.parametrize("name", list(CONVENTIONS))
def test_train_step_accepts_every_arity_and_return_convention(strategy, name):
    fit = managed.train_step(CONVENTIONS[name])
    state, history, _ = ciclo.loop(scalar_state(strategy), [1.0] * 3, {**fit})
    # sgd(1.0) on (p - 3)^2 from 0: p -> 6 -> -0 ... check against the closed form
    p = 0.0
    for _ in range(3):
        p = p - 2 * (p - 3.0)
    assert float(state.params) == pytest.approx(p)
    assert int(state.step) == 3
    assert len(history.collect("loss")) == 3
    if "elapsed" in name:
        assert history.collect("seen") == [0, 1, 2]


@pytest.mark.parametrize("strategy", ["eager", "jit"])
def test_step_returning_only_a_state_or_only_logs(strategy):
    @managed.step
    def bump(state):
        return state.replace(step=state.step + 1)

    @managed.step
    def report(state, batch):
        return ciclo.logs().add_metric("p", state.params + batch)

    state = scalar_state(strategy, value=1.0)
    logs, state = bump(state)
    assert logs == {} and int(state.step) == 1
    logs, same = report(state, 2.0)
    assert float(logs.metrics.p) == 3.0
    assert float(same.params) == 1.0 and int(same.step) == 1


def test_managed_step_spreads_as_a_loop_element():
    @managed.train_step
    def fit(state, batch):
        return _loss(state)

    spread = {**fit}
    assert list(spread.values()) == [[fit]]
    (schedule,) = spread
    assert all(schedule(ciclo.Elapsed.create(steps=s)) for s in range(3))


def test_managed_step_bad_definitions_are_clear_errors():
    with pytest.raises(TypeError, match="takes no arguments"):
        managed.step(lambda: None)
    with pytest.raises(TypeError, match="grads_fn must be a function"):
        managed.train_step(lambda state: None, grads_fn=3)
    with pytest.raises(TypeError, match="log_grad_norm must be True or False"):
        managed.train_step(lambda state: None, log_grad_norm="yes")

    @managed.train_step
    def swapped(state, batch):
        return {"not": "a state"}

    with pytest.raises(TypeError, match="where the state was expected"):
        swapped(scalar_state(), None)


# -- stateful metrics merged into the state -----------------------------------------
class Tracked(managed.ManagedState):
    accuracy: cm.Accuracy

    def reset_step(self):
        # placed for the state's strategy (replicated under data_parallel)
        empty = ciclo.get_strategy(self.strategy).place_state(cm.Accuracy.empty())
        return self.replace(accuracy=empty)


@managed.train_step
def classify(state, batch):
    x, y = batch
    logits = x * state.params
    logs = ciclo.logs().add_loss("loss", jnp.mean(logits**2) * 0.0)
    return logs.add_stateful_metric(
        "accuracy", cm.Accuracy.from_model_output(logits=logits, labels=y)
    )


def _classification_batches():
    rng = np.random.default_rng(0)
    return [
        (rng.normal(size=(6, 3)).astype(np.float32), rng.integers(0, 3, 6))
        for _ in range(4)
    ]


@pytest.mark.parametrize("strategy", ["jit", "data_parallel"])
def test_stateful_metric_accumulates_in_the_state_and_reset_step_resets_it(strategy):
    data = _classification_batches()
    state = scalar_state(strategy, 1.0, Tracked, accuracy=cm.Accuracy.empty())
    state, history, _ = ciclo.train_loop(
        state, data, {ciclo.on_train_step: [classify]}, epoch_duration=2, stop=4
    )
    correct = [np.argmax(x, -1) == y for x, y in data]  # params stay 1.0 (zero grad)
    expected = [
        np.mean(correct[0]),
        np.mean(np.concatenate(correct[:2])),
        np.mean(correct[2]),  # reset_step ran after the epoch that ended at step 2
        np.mean(np.concatenate(correct[2:])),
    ]
    np.testing.assert_allclose(history.collect("accuracy"), expected, rtol=1e-6)
    # the state holds what was accumulated since the last reset (then reset again)
    host = state.with_strategy("jit")
    assert int(host.accuracy.count) == 0


def test_stateful_metric_without_a_state_field_is_the_batch_value():
    data = _classification_batches()
    state = scalar_state(value=1.0)
    _, history, _ = ciclo.loop(state, data, {**classify})
    expected = [np.mean(np.argmax(x, -1) == y) for x, y in data]
    np.testing.assert_allclose(history.collect("accuracy"), expected, rtol=1e-6)


# -- gradients -------------------------------------------------------------------
def _mse(params, batch):
    x, y = batch
    return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)


def _regression():
    rng = np.random.default_rng(1)
    params = {"w": rng.normal(size=(3, 2)).astype(np.float32), "b": np.ones(2, "f4")}
    batch = (rng.normal(size=(8, 3)).astype(np.float32), np.zeros((8, 2), "f4"))
    return params, batch


@pytest.mark.parametrize("strategy", ["eager", "jit", "data_parallel"])
def test_log_grad_norm_and_grads_fn_see_the_gradients(strategy):
    params, batch = _regression()
    seen = {}

    def per_leaf(grads, state):
        seen["step"] = state.step
        return ciclo.logs().add_metric("grad_w0", grads["w"][0, 0])

    @managed.train_step(log_grad_norm=True, grads_fn=per_leaf)
    def fit(state, batch):
        return ciclo.logs().add_loss("loss", _mse(state.params, batch))

    state = managed.ManagedState.create(
        params=params, tx=optax.sgd(0.1), strategy=strategy
    )
    logs, _ = fit(state, batch)
    grads = jax.grad(_mse)(params, batch)
    np.testing.assert_allclose(
        logs.metrics.grad_norm, optax.tree.norm(grads), rtol=1e-5
    )
    np.testing.assert_allclose(logs.metrics.grad_w0, grads["w"][0, 0], rtol=1e-5)
    assert "step" in seen


# -- Flax state: avg_<loss>, grad_norm ---------------------------------------------
class Affine(nn.Module):
    @nn.compact
    def __call__(self, x):
        y = nn.Dense(1)(x)
        self.sow("losses", "penalty", 0.1 * jnp.mean(y**2))
        return y


def test_flax_avg_loss_is_the_mean_since_the_last_reset():
    rng = np.random.default_rng(2)
    data = [
        (rng.normal(size=(4, 2)).astype(np.float32), np.ones((4, 1), np.float32))
        for _ in range(6)
    ]
    state = ciclo.create_flax_state(
        Affine(),
        data[0][0],
        optax.sgd(0.1),
        losses={"mse": lambda preds, target: (preds - target) ** 2},
    )
    _, history, _ = ciclo.train_loop(state, data, epoch_duration=3, stop=6)
    for name in ("mse", "penalty"):
        values, avg = map(np.asarray, history.collect(name, f"avg_{name}"))
        assert len(avg) == 6
        expected = [
            values[e * 3 : e * 3 + i + 1].mean() for e in (0, 1) for i in range(3)
        ]
        np.testing.assert_allclose(avg, expected, rtol=1e-5)


def test_flax_user_metric_named_avg_replaces_the_automatic_one():
    x = np.ones((2, 2), np.float32)
    state = ciclo.create_flax_state(
        nn.Dense(1),
        x,
        optax.sgd(0.1),
        losses={"loss": lambda preds: jnp.mean(preds**2)},
        metrics={"avg_loss": lambda loss: 2 * loss},
    )
    logs, _ = state.train_step(x)
    assert "avg_loss" not in logs.get("stateful_metrics", {})
    np.testing.assert_allclose(logs.metrics.avg_loss, 2 * logs.losses.loss)


def test_flax_log_grad_norm_and_grads_fn():
    x = np.random.default_rng(3).normal(size=(4, 3)).astype(np.float32)
    y = np.zeros((4, 2), np.float32)

    def mse(preds, target):
        return jnp.mean((preds - target) ** 2)

    state = ciclo.create_flax_state(
        nn.Dense(2),
        x,
        optax.sgd(0.1),
        losses={"mse": mse},
        log_grad_norm=True,
        grads_fn=lambda grads: ciclo.logs().add_metric("bias_grad", grads["bias"][0]),
    )
    logs, _ = state.train_step((x, y))
    grads = jax.grad(lambda p: mse(state.apply_fn({"params": p}, x), y))(state.params)
    np.testing.assert_allclose(
        logs.metrics.grad_norm, optax.tree.norm(grads), rtol=1e-5
    )
    np.testing.assert_allclose(logs.metrics.bias_grad, grads["bias"][0], rtol=1e-5)
    with pytest.raises(TypeError, match="grads_fn must be a function"):
        ciclo.create_flax_state(nn.Dense(2), x, optax.sgd(0.1), grads_fn="norm")


@pytest.mark.parametrize("strategy", ["eager", "jit"])
def test_managed_step_between_callbacks_keeps_every_entry_and_state(strategy):
    # a callback before the step logs and replaces the state, one after reads
    # the step's state: every entry of every step lands in its row, in order
    fit = managed.train_step(lambda state, x: ciclo.logs().add_loss("loss", x * 0.0))
    seen = []

    def before(state, batch):
        return ciclo.logs().add_metric("before", batch), state.replace(
            params=state.params + 1.0
        )

    def after(state, batch):
        seen.append((float(state.params), int(state.step)))
        return ciclo.logs().add_metric("after", int(state.step)), None

    state, history, _ = ciclo.loop(
        scalar_state(strategy), [1.0, 2.0, 3.0], {ciclo.every(1): [before, fit, after]}
    )
    assert history.collect("before") == [1.0, 2.0, 3.0]
    assert history.collect("loss") == [0.0, 0.0, 0.0]
    assert history.collect("after") == [1, 2, 3]
    assert seen == [(1.0, 1), (2.0, 2), (3.0, 3)]  # the step's output state
    assert float(state.params) == 3.0 and int(state.step) == 3
    # alone, the step's logs are the row's (the common call)
    state, history, _ = ciclo.loop(scalar_state(strategy), [1.0] * 4, {**fit})
    assert history.collect("loss") == [0.0] * 4 and int(state.step) == 4
