"""`ciclo.create_flax_state` with Flax NNX modules.

The NNX state under `data_parallel` (4 devices) is checked by the subprocess run in
test_flax_linen.py::test_data_parallel_equals_jit_on_4_devices.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import ciclo

pytest.importorskip(
    "sklearn", reason="the digits data needs scikit-learn (ciclo[test])"
)
cm = pytest.importorskip("clu.metrics", reason="needs ciclo[flax] (clu)")
from _flax_common import (  # noqa: E402  (after the skips: it imports sklearn)
    assert_flax_states_equal,
    checkpoint_round_trip,
    digits,
    eval_batches,
    running_means,
    train_batches,
)

XENT = optax.softmax_cross_entropy_with_integer_labels


class MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(64, 64, rngs=rngs)
        self.out = nnx.Linear(64, 10, rngs=rngs)

    def __call__(self, x):
        return self.out(nnx.relu(self.hidden(x)))


def test_nnx_mlp_reaches_95_percent_on_digits():
    xt, yt, xe, ye = digits()
    state = ciclo.create_flax_state(
        MLP(nnx.Rngs(0)),
        tx=optax.adam(1e-2),
        losses={"loss": XENT},
        metrics={"accuracy": cm.Accuracy},
    )
    state, history, _ = ciclo.train_loop(
        state,
        train_batches(xt, yt),
        test_dataset=lambda: eval_batches(xe, ye),
        epoch_duration=50,
        stop=150,
    )
    steps, accuracy = history.collect("steps", "accuracy_test")
    assert steps == [49, 99, 149]
    assert accuracy[-1] >= 0.95
    # predict_loop gives an output for every sample; state.model is a fresh module
    _, history, _ = ciclo.predict_loop(state, eval_batches(xe, ye))
    preds = np.concatenate(history.collect("preds"))
    assert preds.shape == (len(xe), 10)
    assert np.mean(preds.argmax(-1) == ye) >= 0.95
    np.testing.assert_allclose(preds[:4], state.model(xe[:4]), rtol=1e-5, atol=1e-5)


class Net(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.linear = nnx.Linear(3, 16, rngs=rngs)
        self.bn = nnx.BatchNorm(16, rngs=rngs)
        self.dropout = nnx.Dropout(0.5, rngs=rngs)
        self.out = nnx.Linear(16, 1, rngs=rngs)

    def __call__(self, x):
        y = self.dropout(self.bn(self.linear(x)))
        self.sow("losses", "penalty", 1e-2 * jnp.mean(y**2))
        self.sow("metrics", "active", jnp.mean(y > 0))
        return self.out(y)


def test_dropout_batchnorm_and_sown_values():
    x = np.random.default_rng(1).normal(size=(16, 3)).astype(np.float32)
    batch = (x, np.zeros((16, 1), np.float32))
    model = Net(nnx.Rngs(0))
    kernel = np.asarray(model.linear.kernel.get_value())
    state = ciclo.create_flax_state(
        model, tx=optax.sgd(0.1), key=3, losses={"mse": lambda preds: preds**2}
    )
    first, after = state.train_step(batch)
    again, _ = state.train_step(batch)
    later, _ = state.replace(step=state.step + 1).train_step(batch)
    assert float(first.losses.mse) == float(again.losses.mse)  # reproducible
    assert float(first.losses.mse) != float(later.losses.mse)  # a fresh mask
    assert set(first.losses) == {"mse", "penalty"} and "active" in first.metrics
    # train() updates BatchNorm's running averages, eval() uses and keeps them
    mean0 = np.asarray(state.batch_stats["bn"]["mean"].get_value())
    assert not np.allclose(after.batch_stats["bn"]["mean"].get_value(), mean0)
    logs_a, evaluated = after.test_step(batch)
    logs_b, _ = after.replace(step=after.step + 5).test_step(batch)
    assert float(logs_a.losses.mse) == float(logs_b.losses.mse)  # no dropout
    jax.tree.map(
        np.testing.assert_array_equal, evaluated.batch_stats, after.batch_stats
    )
    # the user's module is not changed; the state's params moved
    np.testing.assert_array_equal(model.linear.kernel.get_value(), kernel)
    assert not np.allclose(after.params["linear"]["kernel"].get_value(), kernel)
    # sown values reach the history through the loop
    _, history, _ = ciclo.train_loop(state, [batch] * 3, stop=3)
    assert len(history.collect("penalty", "active")[0]) == 3


class Sower(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.linear = nnx.Linear(2, 1, rngs=rngs)
        self.dropout = nnx.Dropout(0.5, rngs=rngs)

    def __call__(self, x):
        y = self.dropout(self.linear(x))
        self.sow("losses", "reg", 0.1 * jnp.mean(y**2))
        return y


def _sower_batches(n):
    rng = np.random.default_rng(4)
    return [
        (rng.normal(size=(4, 2)).astype(np.float32), np.zeros((4, 1), np.float32))
        for _ in range(n)
    ]


@pytest.mark.parametrize("positional", [True, False])
def test_sown_loss_gets_a_running_mean_when_inputs_are_given(positional):
    train = _sower_batches(7)
    losses = {"mse": lambda preds, target: (preds - target) ** 2}
    if positional:
        state = ciclo.create_flax_state(
            Sower(nnx.Rngs(0)), train[0][0], optax.sgd(0.1), losses=losses
        )
    else:
        state = ciclo.create_flax_state(
            Sower(nnx.Rngs(0)), inputs=train[0][0], tx=optax.sgd(0.1), losses=losses
        )
    _, history, _ = ciclo.train_loop(
        state, train, test_dataset=lambda: train[:2], epoch_duration=3, stop=7
    )
    steps, reg, avg_reg = history.collect("steps", "reg", "avg_reg")
    assert steps == list(range(7))
    # reset at every epoch end (after steps 2 and 5), like the other stateful metrics
    np.testing.assert_allclose(avg_reg, running_means(reg, steps, 3), rtol=1e-5)
    steps, mse, avg_mse = history.collect("steps", "mse", "avg_mse")
    np.testing.assert_allclose(avg_mse, running_means(mse, steps, 3), rtol=1e-5)
    # the test loop's running mean covers exactly the test set
    steps, reg_test, avg_reg_test = history.collect("steps", "reg_test", "avg_reg_test")
    assert steps == [2, 5, 6]  # each epoch's end and the last step
    np.testing.assert_allclose(avg_reg_test, reg_test, rtol=1e-5)


def test_sown_loss_without_inputs_has_no_running_mean():
    train = _sower_batches(3)
    state = ciclo.create_flax_state(Sower(nnx.Rngs(0)), tx=optax.sgd(0.1))
    _, history, _ = ciclo.train_loop(state, train, stop=3)
    assert len(history.collect("reg")) == 3
    with pytest.raises(KeyError, match="'avg_reg' was never logged"):
        history.collect("avg_reg")


def test_sown_losses_undiscoverable_on_bad_inputs_warn():
    train = _sower_batches(2)
    with pytest.warns(UserWarning, match="avg_"):
        state = ciclo.create_flax_state(
            Sower(nnx.Rngs(0)), np.ones((1, 5), np.float32), optax.sgd(0.1)
        )
    _, history, _ = ciclo.train_loop(state, train, stop=2)  # trains without avg_reg
    assert len(history.collect("reg")) == 2
    with pytest.raises(KeyError, match="'avg_reg' was never logged"):
        history.collect("avg_reg")


def test_nnx_stateful_metric_accumulates_and_resets():
    x = np.ones((4, 3), np.float32)
    state = ciclo.create_flax_state(
        nnx.Linear(3, 1, rngs=nnx.Rngs(0)),
        tx=optax.sgd(0.0),
        losses={"mse": lambda preds: preds**2},
        metrics={"seen": cm.Average.from_fun(lambda inputs, **_: inputs[:, 0])},
    )
    for value in (1.0, 3.0):
        logs, state = state.test_step((value * x,))
    assert float(logs.stateful_metrics.seen) == 2.0
    logs, _ = state.reset_step().test_step((5.0 * x,))
    assert float(logs.stateful_metrics.seen) == 5.0


def test_nnx_errors():
    model = nnx.Linear(3, 1, rngs=nnx.Rngs(0))
    with pytest.raises(TypeError, match="needs an optimizer"):
        ciclo.create_flax_state(model, np.ones((1, 3)))
    with pytest.raises(TypeError, match="only apply to Linen"):
        ciclo.create_flax_state(model, tx=optax.sgd(0.1), rngs_train=["noise"])
    with pytest.raises(TypeError, match="needs an optimizer"):
        ciclo.create_flax_state(model)
    state = ciclo.create_flax_state(model, optax.sgd(0.1))  # tx positionally works
    assert state.params["kernel"].shape == (3, 1)


def test_checkpoint_round_trip(tmp_path):
    def make(key):
        return ciclo.create_flax_state(
            Net(nnx.Rngs(0)),
            tx=optax.adam(1e-2),
            key=key,
            losses={"mse": lambda preds: preds**2},
        )

    x = np.random.default_rng(2).normal(size=(8, 3)).astype(np.float32)
    batches = [(x, np.zeros((8, 1), np.float32))] * 3
    trained, restored, elapsed = checkpoint_round_trip(make, batches, tmp_path)
    assert elapsed.steps == 3 and int(restored.step) == 3
    assert_flax_states_equal(restored, trained)
    (a, _), (b, _) = trained.train_step(batches[0]), restored.train_step(batches[0])
    assert float(a.losses.mse) == float(b.losses.mse)
