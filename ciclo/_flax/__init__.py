"""Flax support: `create_flax_state` and `FlaxState` for Flax Linen and NNX models.

Example:
    >>> import ciclo, jax.numpy as jnp, optax, flax.linen as nn
    >>> state = ciclo.create_flax_state(nn.Dense(2), jnp.ones((1, 3)), optax.sgd(0.1))
    >>> isinstance(state, ciclo.FlaxState)
    True
"""

from ciclo._flax.create import create_flax_state
from ciclo._flax.state import FlaxState

__all__ = ["FlaxState", "create_flax_state"]
