"""`ciclo.sharded(mesh, rules=..., fsdp=...)`: builds a `Sharded` strategy, named
by its arguments and registered under that name (the same arguments give back the
same object)."""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import Mesh

from ciclo._strategies.registry import get_strategy, lookup, register_strategy
from ciclo._strategies.sharded import Sharded

__all__ = ["sharded"]


def sharded(
    mesh: Mesh | None = None,
    *,
    data_axis: str = "data",
    rules: Any = None,
    fsdp: bool = False,
    donate: bool = False,
) -> Sharded:
    """A `sharded` strategy over `mesh`: data parallel on `data_axis`, parameters
    laid out by `rules`, Flax annotations or FSDP.

    Usable wherever a strategy name is: `ManagedState.create(strategy=...)`,
    `create_flax_state(strategy=...)`, `state.with_strategy(...)`. Each call with
    the same arguments returns the same (registered) object, so compiled steps
    are reused; with no argument it is the `"sharded"` strategy.

    Where a parameter lives: the first rule whose regex `re.search`es its path
    (keys joined by `/`, e.g. `"Dense_0/kernel"`; NNX's trailing `value` is
    dropped) gives its `PartitionSpec`; else its Flax annotation (Linen
    `nn.with_partitioning`, NNX `sharding` metadata, read by `create_flax_state`);
    else, with `fsdp=True`, it is sharded on `data_axis` along its largest axis
    divisible by that axis's size (parameters under 1024 elements stay
    replicated); else it is replicated. Optimizer-state leaves that mirror a
    parameter (same path suffix and shape: Adam's moments, momentum) follow it,
    as do its factored statistics (its shape less one axis: Adafactor's); everything
    else (step, BatchNorm statistics, keys, metrics) is replicated.

    Args:
        mesh: a `jax.sharding.Mesh` (any axes, e.g. `("data", "model")`; its axes
            are used as `AxisType.Auto`); default: a 1-D mesh over all devices
            named `data_axis`.
        data_axis: the mesh axis the batch is split on.
        rules: `(regex, PartitionSpec)` pairs, matched in order.
        fsdp: shard each remaining parameter on `data_axis`.
        donate: training steps donate the state's buffers (reuse its memory).

    Returns:
        The `Sharded` strategy; its `name` is the call that builds it (e.g.
        `"sharded(mesh={'data': 2, 'model': 2}, fsdp=True)"`), under which it is
        registered (`state.with_strategy(strategy.name)` resolves to it).

    Raises:
        TypeError: for a mesh that is not a `Mesh`, a rule that is not a
            `(str, PartitionSpec)` pair, a non-bool `fsdp`.
        ValueError: `data_axis` or a rule's axis not in the mesh; when the state
            is placed, a spec that does not divide its parameter's shape or a
            rule that matches no parameter (naming the parameter, its shape, the
            spec and the mesh).

    Example:
        >>> import ciclo, jax, jax.numpy as jnp, optax
        >>> from jax.sharding import PartitionSpec as P
        >>> from ciclo import managed
        >>> mesh = jax.make_mesh((jax.device_count(), 1), ("data", "model"))
        >>> strategy = ciclo.sharded(mesh, rules=[("w", P(None, "model"))])
        >>> state = managed.ManagedState.create(
        ...     params={"w": jnp.ones((4, 8))}, tx=optax.adam(1e-3), strategy=strategy)
        >>> state.params["w"].sharding.spec, state.opt_state[0].mu["w"].sharding.spec
        (P(None, 'model'), P(None, 'model'))
        >>> ciclo.sharded() is ciclo.get_strategy("sharded")
        True
    """
    defaults = mesh is None and rules is None and data_axis == "data"
    if defaults and not fsdp and not donate:
        return get_strategy("sharded")
    made = Sharded(
        "sharded", donate=donate, mesh=mesh, data_axis=data_axis, rules=rules, fsdp=fsdp
    )
    made.name = _name(made)
    found = lookup(made.name)
    if isinstance(found, Sharded):  # made before with the same arguments
        return found
    register_strategy(made.name, made)
    return made


def _name(strategy: Sharded) -> str:
    """The call that builds `strategy`, as its name: one name per strategy."""
    parts = []
    mesh = strategy._user_mesh
    if mesh is not None:
        parts.append(f"mesh={dict(mesh.shape)}")
        ids = [d.id for d in mesh.devices.flat]
        if ids != [d.id for d in jax.devices()[: len(ids)]]:
            parts.append(f"devices={ids}")
    if strategy.data_axis != "data":
        parts.append(f"data_axis={strategy.data_axis!r}")
    if strategy.rules:
        rules = [(pattern.pattern, spec) for pattern, spec in strategy.rules]
        parts.append(f"rules={rules}")
    if strategy.fsdp:
        parts.append("fsdp=True")
    if strategy.donate:
        parts.append("donate=True")
    return f"sharded({', '.join(parts)})"
