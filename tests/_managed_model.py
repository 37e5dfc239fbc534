"""Shared by the managed/strategy tests and their subprocess workers: a tiny MLP.

Kept free of pytest so worker scripts (run with forced CPU devices or under
`jax.distributed`) can import it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

import ciclo
from ciclo import managed

BATCH = 16
STEPS = 4


def init_params(seed: int = 0) -> dict:
    """numpy init: no per-op compilation before the step under test."""
    rng = np.random.default_rng(seed)
    return {
        "w1": (rng.normal(size=(8, 16)) * 0.3).astype(np.float32),
        "b1": np.zeros(16, np.float32),
        "w2": (rng.normal(size=(16, 4)) * 0.3).astype(np.float32),
        "b2": np.zeros(4, np.float32),
    }


def apply(params: dict, x: jax.Array) -> jax.Array:
    return jnp.tanh(x @ params["w1"] + params["b1"]) @ params["w2"] + params["b2"]


def dataset(steps: int = STEPS, batch: int = BATCH, seed: int = 0) -> list:
    """`steps` batches `(x float32 (batch, 8), y int32 (batch,))`."""
    rng = np.random.default_rng(seed)
    return [
        (
            rng.normal(size=(batch, 8)).astype(np.float32),
            rng.integers(0, 4, batch).astype(np.int32),
        )
        for _ in range(steps)
    ]


def create(strategy: str = "jit", **fields) -> managed.ManagedState:
    return managed.ManagedState.create(
        params=init_params(),
        tx=optax.sgd(0.1, momentum=0.9),
        strategy=strategy,
        **fields,
    )


class KeyedState(managed.ManagedState):
    """A state with a typed PRNG key field (`jax.random.key`)."""

    key: jax.Array


TRACES: list[str] = []  # one entry per trace of train_step (any strategy)


@managed.train_step
def train_step(state, batch, elapsed):
    TRACES.append(state.strategy)
    x, y = batch
    logits = apply(state.params, x)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    logs = ciclo.logs()
    logs.add_loss("loss", loss, add_metric=True)
    logs.add_metric("accuracy", jnp.mean(jnp.argmax(logits, -1) == y))
    logs.add_output("logits", logits)
    if elapsed is not None:  # Python-int leaves: must not re-trace as they change
        logs.add_metric("steps_seen", elapsed.steps)
    return logs, state


def train(state: managed.ManagedState, data: list) -> tuple:
    """Runs `train_step` over `data` with `ciclo.loop`; returns (state, last logs)."""
    state, history, _ = ciclo.loop(state, data, {ciclo.every(1): train_step})
    return state, history


def host_params(state: managed.ManagedState) -> dict:
    """The params as numpy arrays, read on one device."""
    return jax.tree.map(np.asarray, state.with_strategy("jit").params)
