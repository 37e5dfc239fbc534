"""The run of the checkpointed-history tests (`test_checkpoint_history.py`) and of
the old-format fixture they resume (`fixtures/make_history_v1.py`).

Its rows hold what a saved history must bring back exactly: a loss, a metric that
is NaN every fourth step, an array output, and with `steps_per_call` the per-step
rows of fused calls.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

import ciclo
from ciclo import managed

STEPS, EPOCH = 24, 3


def init_state() -> managed.ManagedState:
    return managed.ManagedState.create(
        params={"w": np.ones(2, np.float32)}, tx=optax.sgd(0.1), strategy="jit"
    )


def _step(state, batch):
    def loss_fn(params):
        return jnp.mean((params["w"] - batch) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    logs = ciclo.logs()
    logs.add_loss("loss", loss)
    logs.add_metric("nan", jnp.where(state.step % 4 == 1, jnp.nan, loss))
    logs.add_output("vec", state.params["w"] + batch)
    return logs, state.apply_gradients(grads=grads)


train_step = managed.train_step(_step)
fused_step = managed.train_step(_step, steps_per_call=3)


def batches(start_step: int) -> list[np.ndarray]:
    return [np.float32(i / 8) for i in range(start_step, STEPS)]


def run(directory, stop=STEPS, fused=False, keep=2, callbacks=()):
    """`train_loop` to `stop`, resuming `directory` (None: no checkpoint), saving
    each epoch (`EPOCH` steps) and keeping `keep` checkpoints; `fused`: calls of
    3 steps."""
    if directory is not None:
        callbacks = [*callbacks, ciclo.checkpoint(directory, keep=keep)]
    return ciclo.train_loop(
        init_state(), batches,
        {ciclo.on_train_step: fused_step if fused else train_step},
        epoch_duration=EPOCH, stop=stop, resume=directory, callbacks=list(callbacks),
        steps_per_call=3 if fused else None,
    )  # fmt: skip
