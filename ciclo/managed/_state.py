"""`ManagedState`: a Flax `TrainState` that carries its strategy (the object)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import optax
from flax import struct
from flax.training import train_state
from jax.sharding import PartitionSpec

from ciclo._short import short
from ciclo._strategies.base import Strategy
from ciclo._strategies.registry import (
    get_strategy,
    register_strategy,
    registered_name,
    strategy_of,
)

__all__ = ["ManagedState"]


def _public(strategy: Strategy) -> tuple[type, dict[str, Any]]:
    attributes = {
        k: v
        for k, v in vars(strategy).items()
        if not k.startswith("_") and k != "collectives"
    }
    return type(strategy), attributes


def resolve(strategy: str | Strategy) -> Strategy:
    """The strategy object a state carries, for a name or a `Strategy` object.

    A name is resolved through the registry (once, here). A `Strategy` object
    registered or without a `name` is used as is; an unregistered one with a
    `name` is used as the registered one when that is equal (same type and public
    attributes, e.g. `Jit()` for `"jit"`: compiled steps are shared), else
    registered under its `name`, so that the name resolves to it.

    Raises:
        TypeError: for something that is neither a str nor a `Strategy`.
        ValueError: for an unknown name, or a `Strategy` whose name is taken by a
            different one.
    """
    if isinstance(strategy, str):
        return get_strategy(strategy)  # raises for an unknown name
    if not isinstance(strategy, Strategy):
        raise TypeError(
            f"`strategy` must be a registered name (e.g. 'jit') or a "
            f"ciclo.Strategy, got {type(strategy).__name__}: {short(strategy)}."
        )
    if strategy.name is None or registered_name(strategy) is not None:
        return strategy  # (an unnamed one is carried without a name)
    try:
        registered = get_strategy(strategy.name)
    except ValueError:
        registered = None
    if registered is not None and _public(registered) == _public(strategy):
        return registered  # e.g. `Jit()` for "jit"
    register_strategy(strategy.name, strategy)  # raises if the name is taken
    return strategy


def as_param_specs(params: Any, specs: Any) -> tuple[tuple[str, Any], ...]:
    """`(path, PartitionSpec)` pairs from a tree of PartitionSpec / None matching
    `params` (or such pairs already)."""
    from ciclo._strategies.rules import path_str

    if specs is None:
        return ()
    if isinstance(specs, tuple) and all(
        isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) for p in specs
    ):
        return specs
    flat = jax.tree_util.tree_flatten_with_path(
        specs, is_leaf=lambda x: x is None or isinstance(x, PartitionSpec)
    )[0]
    wanted = {path_str(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]}
    out = []
    for path, spec in flat:
        if spec is None:
            continue
        name = path_str(path)
        if not isinstance(spec, PartitionSpec) or name not in wanted:
            raise ValueError(
                f"ManagedState.create: param_specs must be a tree of PartitionSpec "
                f"or None matching `params`; at {name!r} it has {spec!r:.60}, and "
                f"the parameters are {sorted(wanted)[:12]}."
            )
        out.append((name, spec))
    return tuple(out)


class ManagedState(train_state.TrainState):
    """A `TrainState` whose managed steps run under its `strategy`.

    The state lives in the strategy's placement: under `"data_parallel"` every
    array has a leading device axis (replicated, PRNG keys split per device), under
    `"sharded"` arrays are replicated over the mesh. `with_strategy("jit")` brings
    it back to one device (e.g. to read `params` or to checkpoint it).

    A field holding a stateful metric (a `clu.metrics.Metric`, anything with
    `merge`) accumulates it: when a managed step logs a stateful metric of the
    same name, the metric is merged into the field and the accumulated value is
    logged. Reset it by replacing the field with an empty metric placed for the
    strategy: `state.strategy.place_state(Metric.empty())`.

    Attributes:
        strategy: the `Strategy` object (static, not a pytree leaf), resolved
            from a name at `create` / `with_strategy`. A registered strategy
            compares equal to the name it is registered under (`state.strategy ==
            "jit"`).
        param_specs: static `(path, PartitionSpec)` pairs: where parameters are
            annotated to live on a mesh (`ciclo.sharded` uses them for the
            parameters its rules do not place). `create(param_specs=...)` takes a
            tree of `PartitionSpec` / None matching `params`; `create_flax_state`
            fills it from Flax partitioning annotations.

    Example:
        >>> import jax.numpy as jnp, optax
        >>> from ciclo import managed
        >>> state = managed.ManagedState.create(
        ...     params={"w": jnp.ones(3)}, tx=optax.sgd(0.1), strategy="jit")
        >>> state.strategy, state.strategy == "jit", int(state.step)
        (Jit('jit'), True, 0)
    """

    strategy: Strategy = struct.field(pytree_node=False)
    param_specs: tuple[tuple[str, Any], ...] = struct.field(
        pytree_node=False, default=(), kw_only=True
    )

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
                `"sharded"`), resolved here to its object, or a `Strategy` object
                (e.g. `ciclo.sharded(mesh)`), carried as is; an unregistered one
                is registered under its `name`, unless an equal one (same type and
                public attributes, e.g. `Jit()` for `"jit"`) is registered there,
                which is then used.
            **fields: values for the fields that subclasses add.

        Returns:
            The new state, placed by the strategy's `place_state`.

        Raises:
            ValueError: for an unknown strategy name (lists the registered ones),
                or a `Strategy` object whose name is taken by a different one.
            TypeError: for a `strategy` that is neither a name nor a `Strategy`.

        Example:
            >>> import jax.numpy as jnp, optax
            >>> from ciclo import managed
            >>> s = managed.ManagedState.create(params=jnp.zeros(2), tx=optax.adam(1e-3))
            >>> s.strategy
            Jit('jit')
        """
        chosen = resolve(strategy)
        if "param_specs" in fields:
            fields["param_specs"] = as_param_specs(params, fields["param_specs"])
        state = super().create(
            apply_fn=apply_fn, params=params, tx=tx, strategy=chosen, **fields
        )
        return chosen.place_state(state)

    def memory(
        self, fields: tuple[str, ...] = ("params", "opt_state")
    ) -> dict[Any, int]:
        """The bytes of `fields` (default: parameters + optimizer state) each device
        holds: `{device: bytes}` over this process's devices.

        Replicated arrays count fully on every device; sharded ones only their
        shards, so under `ciclo.sharded(..., fsdp=True)` on 4 devices a large
        model takes about a quarter of the replicated bytes per device.

        Example:
            >>> import jax, jax.numpy as jnp, optax
            >>> from ciclo import managed
            >>> s = managed.ManagedState.create(params=jnp.zeros(4), tx=optax.adam(1e-3))
            >>> s.memory()[jax.devices()[0]]  # params + mu + nu (+ the step count)
            52
        """
        per_device: dict[Any, int] = {}
        for name in fields:
            for leaf in jax.tree.leaves(getattr(self, name)):
                if not isinstance(leaf, jax.Array):
                    continue
                for shard in leaf.addressable_shards:
                    size = int(np.prod(shard.data.shape)) * leaf.dtype.itemsize
                    per_device[shard.device] = per_device.get(shard.device, 0) + size
        return per_device

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

        Raises:
            ValueError / TypeError: as `create` for a bad `strategy`.

        Example:
            >>> import jax.numpy as jnp, optax
            >>> from ciclo import managed
            >>> s = managed.ManagedState.create(params=jnp.zeros(2), tx=optax.sgd(1.0))
            >>> s.with_strategy("eager").strategy
            Eager('eager')
        """
        target = resolve(strategy)
        current = strategy_of(self)
        if current is None:  # a name no longer registered
            current = get_strategy(self.strategy)  # (raises, listing the names)
        if target is current:
            return self
        host = current.to_host(self)
        return target.place_state(host.replace(strategy=target))


# A compiled step's output state is rebuilt by the pytree's unflatten, which calls
# `__init__`: the frozen dataclass's own sets each field with a call to
# `object.__setattr__` (about 1 µs a step). The same fields set in the instance's
# dict, in their order; only while the fields are these (a Flax that adds one
# keeps the generated `__init__`). Subclasses get their own from `dataclass`.
_FIELDS = ("step", "apply_fn", "params", "tx", "opt_state", "strategy", "param_specs")


def _init(
    self, step, apply_fn, params, tx, opt_state, strategy, *, param_specs=()
) -> None:
    fields = self.__dict__
    fields["step"], fields["apply_fn"], fields["params"] = step, apply_fn, params
    fields["tx"], fields["opt_state"], fields["strategy"] = tx, opt_state, strategy
    fields["param_specs"] = param_specs


# the fields jax flattens (the rest are static): `ciclo.managed._flat` passes
# these to a compiled step as separate arguments
DATA = ("step", "params", "opt_state")
_DATA = tuple(
    f.name
    for f in dataclasses.fields(ManagedState)
    if f.metadata.get("pytree_node", True)
)
_PLAIN = tuple(
    f.name for f in dataclasses.fields(ManagedState)
) == _FIELDS and not hasattr(ManagedState, "__post_init__")


def flat_fields() -> bool:
    """Whether `ManagedState`'s fields are `_FIELDS`, its data fields `step`,
    `params` and `opt_state` (this Flax's `TrainState`'s, plus ciclo's)."""
    return _PLAIN and _DATA == DATA


if _PLAIN:
    _init.__qualname__ = "ManagedState.__init__"
    _init.__doc__ = ManagedState.__init__.__doc__
    ManagedState.__init__ = _init  # type: ignore[method-assign]
