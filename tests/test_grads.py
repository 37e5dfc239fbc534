"""A peer's "gradient norm / NaN on gradients" workflow, end to end in train_loop:
`managed.train_step(log_grad_norm=True, grads_fn=...)` and `create_flax_state`'s
same options, watched by `nan_guard` and aggregated per epoch."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ciclo
from ciclo import managed


def _data(n=4, bad=None):
    rng = np.random.default_rng(0)
    batches = []
    for i in range(n):
        x = rng.normal(size=(8, 3)).astype(np.float32)
        if i == bad:
            x[0, 0] = np.nan
        batches.append((x, np.zeros((8, 2), np.float32)))
    return batches


def _mse(params, batch):
    x, y = batch
    return jnp.mean((x @ params["w"] - y) ** 2)


def _state():
    params = {"w": np.ones((3, 2), np.float32)}
    return managed.ManagedState.create(params=params, tx=optax.sgd(0.01))


def _finite(grads):
    leaves = [jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(grads)]
    return ciclo.logs().add_metric("grads_finite", jnp.all(jnp.stack(leaves)))


@managed.train_step(log_grad_norm=True, grads_fn=_finite)
def train_step(state, batch):
    return ciclo.logs().add_loss("loss", _mse(state.params, batch))


def test_grad_norm_is_logged_per_step_and_per_epoch():
    _, history, _ = ciclo.train_loop(
        _state(), _data(), {ciclo.on_train_step: train_step}, epochs=2,
        epoch_logs=True,
    )  # fmt: skip
    norms = history.collect("grad_norm")
    assert len(norms) == 8 and all(np.isfinite(norms))
    steps, epoch_norms = history.collect("steps", "grad_norm_epoch")
    assert steps == [3, 7]
    np.testing.assert_allclose(epoch_norms[0], np.mean(norms[:4]), rtol=1e-5)
    assert all(bool(v) for v in history.collect("grads_finite"))


def test_nan_gradients_stop_train_loop_with_a_clear_error():
    with pytest.raises(FloatingPointError, match="grad_norm|loss|grads_finite"):
        ciclo.train_loop(
            _state(), _data(n=6, bad=2), {ciclo.on_train_step: train_step},
            epochs=3, callbacks=[ciclo.nan_guard()],
        )  # fmt: skip


def test_nan_gradients_seen_by_grads_fn_are_in_the_history():
    _, history, _ = ciclo.train_loop(
        _state(), _data(n=4, bad=1), {ciclo.on_train_step: train_step}
    )
    assert [bool(v) for v in history.collect("grads_finite")][:2] == [True, False]


def test_flax_state_grad_norm_in_train_loop():
    class Linear(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(2)(x)

    state = ciclo.create_flax_state(
        Linear(),
        np.zeros((1, 3), np.float32),
        optax.sgd(0.01),
        losses={"mse": lambda preds, target: jnp.mean((preds - target) ** 2)},
        log_grad_norm=True,
    )
    _, history, _ = ciclo.train_loop(state, _data(), epochs=1, epoch_logs=True)
    assert len(history.collect("grad_norm")) == 4
    assert len(history.collect("grad_norm_epoch")) == 1
