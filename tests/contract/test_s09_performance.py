"""API.md §9 — Performance contract (behavioural parts only; no timings)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from _guard import disallow_device_to_host  # the guard, enforced on the CPU too

import ciclo
from ciclo import managed

_rng = np.random.default_rng(0)
_W = np.array([1.0, -2.0, 0.5], np.float32)
BATCHES = [(x, x @ _W) for x in _rng.normal(size=(12, 4, 3)).astype(np.float32)]


@jax.jit
def jit_step(state, batch):
    x, y = batch
    loss, grad = jax.value_and_grad(lambda w: jnp.mean((x @ w - y) ** 2))(state)
    logs = ciclo.logs()
    logs.add_loss("loss", loss)
    logs.add_metric("w0", state[0])
    return logs, state - 0.05 * grad


@managed.train_step
def managed_step(state, batch):
    x, y = batch
    logs = ciclo.logs()
    logs.add_loss("loss", jnp.mean((x @ state.params - y) ** 2))
    return logs, state


@managed.step
def managed_eval(state, batch):
    x, y = batch
    logs = ciclo.logs()
    logs.add_metric("mse", jnp.mean((x @ state.params - y) ** 2))
    return logs, state


def test_loop_with_bars_and_history_does_not_sync_per_step():
    with disallow_device_to_host():
        state, history, elapsed = ciclo.loop(
            jnp.zeros(3),
            BATCHES,
            {
                ciclo.every(1): [jit_step],
                **ciclo.keras_bar(total=len(BATCHES)),
                **ciclo.tqdm_bar(total=len(BATCHES)),
            },
        )
    assert elapsed.steps == len(BATCHES)
    ref, ref_losses = jnp.zeros(3), []
    for batch in BATCHES:  # the same run by hand, outside the guard
        logs, ref = jit_step(ref, batch)
        ref_losses.append(float(logs.losses.loss))
    np.testing.assert_allclose(np.asarray(state), np.asarray(ref), rtol=1e-6)
    losses = history.collect("loss")  # reading afterwards brings the values over
    np.testing.assert_allclose([float(v) for v in losses], ref_losses, rtol=1e-6)


def test_train_loop_with_managed_steps_and_test_loop_does_not_sync_per_step():
    state = managed.ManagedState.create(
        params=jnp.zeros(3), tx=optax.sgd(0.05), strategy="jit"
    )
    with disallow_device_to_host():
        state, history, elapsed = ciclo.train_loop(
            state,
            BATCHES,
            {ciclo.on_train_step: [managed_step], ciclo.on_test_step: [managed_eval]},
            callbacks=[ciclo.keras_bar(total=len(BATCHES))],
            test_dataset=lambda: BATCHES[:2],
            epoch_duration=4,
            stop=len(BATCHES),
        )
    assert elapsed.steps == len(BATCHES)
    assert len(history.collect("mse_test")) == 3


def test_fused_mode_counts_real_steps_and_matches_unfused():
    def run(**kwargs):
        state = managed.ManagedState.create(
            params=jnp.zeros(3), tx=optax.sgd(0.05), strategy="jit"
        )
        return ciclo.train_loop(
            state, BATCHES, {ciclo.on_train_step: [managed_step]}, stop=12, **kwargs
        )

    ref_state, _, ref_elapsed = run()
    state, history, elapsed = run(steps_per_call=4)  # API.md leaves the name open
    assert elapsed.steps == ref_elapsed.steps == 12
    assert elapsed.samples == ref_elapsed.samples == 12 * 4
    assert int(state.step) == 12
    np.testing.assert_allclose(
        np.asarray(state.params), np.asarray(ref_state.params), rtol=1e-5, atol=1e-6
    )
