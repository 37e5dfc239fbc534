"""The loop must not wait for the device each step (API.md §9)."""

import time

import jax
import jax.numpy as jnp
import numpy as np

import ciclo


@jax.jit
def heavy_step(state, batch):
    # ~tens of ms of device work per step, so a per-step sync would be obvious
    def body(_, m):
        return jnp.tanh(m @ m / m.shape[0])

    m = jax.lax.fori_loop(0, 24, body, jnp.full((256, 256), state) + batch)
    logs = ciclo.logs()
    logs.add_loss("loss", m.mean())
    logs.add_metric("state", state)
    return logs, state + 1.0


def test_loop_returns_before_the_device_finishes():
    heavy_step(jnp.float32(0), jnp.float32(0))  # compile outside the timed loop
    steps = 30
    data = [np.float32(i) for i in range(steps)]
    with jax.transfer_guard_device_to_host("disallow"):
        # any implicit device->host read (float(x), np.asarray(x), `if x:`) raises here
        start = time.perf_counter()
        state, history, elapsed = ciclo.loop(
            jnp.float32(0),
            data,
            {ciclo.every(1): [heavy_step]},
            history=ciclo.history(lag=4),
        )
        returned = time.perf_counter() - start
        # had the loop synced on any step's logs, the chain of steps before it would
        # be done; with lag the last steps are still queued on the device
        still_running = not state.is_ready()
    state.block_until_ready()
    total = time.perf_counter() - start
    assert still_running, (returned, total)
    assert elapsed.steps == steps
    assert history.collect("state") == [float(i) for i in range(steps)]
    assert len(history.collect("loss")) == steps
