"""The managed API: `ManagedState` (a Flax `TrainState` that carries its strategy),
`train_step` (differentiates the logged losses and applies the gradients) and `step`
(no gradients), each run under the state's strategy (see `ciclo.Strategy`).

Example:
    >>> import ciclo, jax.numpy as jnp, optax
    >>> from ciclo import managed
    >>> @managed.train_step
    ... def train_step(state, batch):
    ...     x, y = batch
    ...     loss = jnp.mean((x @ state.params - y) ** 2)
    ...     return ciclo.logs().add_loss("mse", loss), state
    >>> state = managed.ManagedState.create(params=jnp.zeros(2), tx=optax.sgd(0.1))
    >>> batches = [(jnp.ones((4, 2)), jnp.ones(4))] * 3
    >>> state, history, _ = ciclo.loop(state, batches, {**train_step})
    >>> len(history.collect("mse"))
    3
"""

from ciclo.managed._managed_step import ManagedStep as ManagedStep
from ciclo.managed._state import ManagedState as ManagedState
from ciclo.managed._steps import step as step
from ciclo.managed._steps import train_step as train_step

__all__ = ["ManagedState", "ManagedStep", "step", "train_step"]
