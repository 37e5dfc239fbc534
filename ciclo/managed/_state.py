"""`ManagedState`: a Flax `TrainState` that carries the name of its strategy."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import optax
from flax import struct
from flax.training import train_state

from ciclo._strategies.base import Strategy
from ciclo._strategies.registry import get_strategy, register_strategy

__all__ = ["ManagedState"]


def _public(strategy: Strategy) -> tuple[type, dict[str, Any]]:
    attributes = {k: v for k, v in vars(strategy).items() if not k.startswith("_")}
    return type(strategy), attributes


def _registered(name: str) -> Strategy | None:
    try:
        return get_strategy(name)
    except ValueError:
        return None


def _strategy_name(strategy: str | Strategy) -> Strategy:
    if isinstance(strategy, Strategy):
        registered = _registered(strategy.name)
        if registered is not None and _public(registered) == _public(strategy):
            return registered  # the same one, or e.g. `Jit()` for "jit"
        register_strategy(strategy.name, strategy)  # raises if the name is taken
    return get_strategy(strategy)


class ManagedState(train_state.TrainState):
    """A `TrainState` whose managed steps run under its `strategy`.

    The state lives in the strategy's placement: under `"data_parallel"` every
    array has a leading device axis (replicated, PRNG keys split per device), under
    `"sharded"` arrays are replicated over the mesh. `with_strategy("jit")` brings
    it back to one device (e.g. to read `params` or to checkpoint it).

    Attributes:
        strategy: the registered name of the strategy (static, not a pytree leaf).

    Example:
        >>> import jax.numpy as jnp, optax
        >>> from ciclo import managed
        >>> state = managed.ManagedState.create(
        ...     params={"w": jnp.ones(3)}, tx=optax.sgd(0.1), strategy="jit")
        >>> state.strategy, int(state.step)
        ('jit', 0)
    """

    strategy: str = struct.field(pytree_node=False)

    @classmethod
    def create(
        cls,
        *,
        params: Any,
        tx: optax.GradientTransformation,
        apply_fn: Any = None,
        strategy: str | Strategy = "jit",
        **fields: Any,
    ) -> ManagedState:
        """Creates a state at step 0 with `tx.init(params)`, placed for `strategy`.

        Args:
            params: the parameters (any pytree); gradients are taken w.r.t. them.
            tx: an optax optimizer.
            apply_fn: optional function stored with the state (e.g. `module.apply`).
            strategy: a registered strategy name (`"eager"`, `"jit"`,
                `"jit_donate"`, `"data_parallel"`, `"data_parallel_donate"`,
                `"sharded"`) or a `Strategy` object: registered under its name,
                or, when an equal one (same type and public attributes, e.g.
                `Jit()` for `"jit"`) is registered there, that one is used.
            **fields: values for the fields that subclasses add.

        Returns:
            The new state, placed by `strategy.from_host`.

        Raises:
            ValueError: for an unknown strategy name (lists the registered ones),
                or a `Strategy` object whose name is taken by a different one.

        Example:
            >>> import jax.numpy as jnp, optax
            >>> from ciclo import managed
            >>> s = managed.ManagedState.create(params=jnp.zeros(2), tx=optax.adam(1e-3))
            >>> s.strategy
            'jit'
        """
        chosen = _strategy_name(strategy)
        state = super().create(
            apply_fn=apply_fn, params=params, tx=tx, strategy=chosen.name, **fields
        )
        return chosen.from_host(state)

    def apply_gradients(self, *, grads: Any, **kwargs: Any) -> ManagedState:
        """`TrainState.apply_gradients`, also for params that are not a dict.

        Example:
            >>> import jax.numpy as jnp, optax
            >>> from ciclo import managed
            >>> s = managed.ManagedState.create(params=jnp.ones(2), tx=optax.sgd(1.0))
            >>> s.apply_gradients(grads=jnp.ones(2)).params.tolist()
            [0.0, 0.0]
        """
        if isinstance(self.params, Mapping):
            return super().apply_gradients(grads=grads, **kwargs)
        updates, opt_state = self.tx.update(grads, self.opt_state, self.params)
        return self.replace(
            step=self.step + 1,
            params=optax.apply_updates(self.params, updates),
            opt_state=opt_state,
            **kwargs,
        )

    def with_strategy(self, strategy: str | Strategy) -> ManagedState:
        """Moves the state to another strategy (unreplicate / replicate / reshard).

        Args:
            strategy: the target strategy (name or object).

        Returns:
            The same values placed for `strategy`.

        Example:
            >>> import jax.numpy as jnp, optax
            >>> from ciclo import managed
            >>> s = managed.ManagedState.create(params=jnp.zeros(2), tx=optax.sgd(1.0))
            >>> s.with_strategy("eager").strategy
            'eager'
        """
        target = _strategy_name(strategy)
        current = get_strategy(self.strategy)
        if target is current:
            return self
        host = current.to_host(self)
        return target.from_host(host.replace(strategy=target.name))
