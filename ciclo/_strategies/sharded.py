"""The `sharded` strategy: one `jax.jit` program over a `Mesh` of (global) devices.

`"sharded"` is the default: a 1-D mesh over all devices, the state replicated.
`ciclo.sharded(mesh, data_axis=..., rules=..., fsdp=...)` builds one over any mesh,
with the parameters (and the optimizer state that mirrors them) sharded by rules,
Flax annotations or FSDP (`ciclo._strategies.rules`). Its collectives, inside the
program, are `ciclo._strategies.sharded_collectives`.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ciclo._short import short
from ciclo._strategies.base import Step, Strategy, tree_is_key
from ciclo._strategies.rules import FSDP_MIN_SIZE, check_rules, state_specs
from ciclo._strategies.sharded_collectives import ShardedCollectives
from ciclo._strategies.transfer import put

__all__ = ["Sharded"]


def _auto(mesh: Mesh) -> Mesh:
    """`mesh` with every axis of type `Auto` (what `jax.make_mesh` does not give
    by default): ciclo lays arrays out with shardings and constraints."""
    types = getattr(mesh, "axis_types", None)
    if types is None or all(t == AxisType.Auto for t in types):
        return mesh
    return Mesh(
        mesh.devices,
        mesh.axis_names,
        axis_types=(AxisType.Auto,) * len(mesh.axis_names),
    )


class Sharded(Strategy):
    """`jax.jit` on a `Mesh`: data parallel on `data_axis`, parameters laid out by
    rules, Flax annotations or FSDP (replicated by default).

    With the defaults (the `"sharded"` strategy) the mesh is 1-D over
    `jax.devices()` and the state is replicated; XLA inserts the gradient
    all-reduce, so results equal the `jit` run. With `rules`, annotations or
    `fsdp`, each device holds only its shards of the parameters and of the
    optimizer-state leaves that mirror them (see `ciclo._strategies.rules`); a
    training step is one `jax.jit` program whose state comes out in the same
    shardings it went in (`with_sharding_constraint`), gradients included, so
    nothing is gathered between steps.

    Under `jax.distributed` (several processes) each process passes its LOCAL part
    of the batch (its size a multiple of the data shards its devices hold); the
    global batch is assembled with `jax.make_array_from_process_local_data`, in
    process order. What comes back is always readable by the calling process:
    losses and metrics are replicated, outputs are the rows of the calling
    process's local batch, and `to_host` returns the whole state on one local
    device (gathering shards across processes when needed).

    Build one with `ciclo.sharded(...)` (`ciclo._strategies.mesh`), which names
    and registers it.

    Attributes:
        data_axis: the mesh axis the batch is split on.
        rules: the `(compiled regex, PartitionSpec)` pairs.
        fsdp: shard the remaining parameters on `data_axis`.
        fsdp_min_size: under `fsdp`, parameters with fewer elements stay
            replicated (1024; set it on the strategy object before placing a
            state to change it).

    Example:
        >>> import ciclo
        >>> ciclo.get_strategy("sharded").axis
        'data'
    """

    fsdp_min_size = FSDP_MIN_SIZE

    def __init__(
        self,
        name: str = "sharded",
        *,
        donate: bool = False,
        mesh: Mesh | None = None,
        data_axis: str = "data",
        rules: Any = None,
        fsdp: bool = False,
    ):
        super().__init__(name, donate=donate)
        if mesh is not None and not isinstance(mesh, Mesh):
            raise TypeError(
                f"ciclo.sharded: mesh must be a jax.sharding.Mesh (e.g. "
                f"jax.make_mesh((2, 2), ('data', 'model'))) or None, got "
                f"{type(mesh).__name__}: {mesh!r:.80}."
            )
        if not isinstance(data_axis, str):
            raise TypeError(
                f"ciclo.sharded: data_axis must be a mesh axis name (str), got "
                f"{short(data_axis)}."
            )
        if mesh is not None and data_axis not in mesh.axis_names:
            raise ValueError(
                f"ciclo.sharded: data_axis {data_axis!r} is not an axis of the mesh "
                f"{dict(mesh.shape)}; pass data_axis= one of {list(mesh.axis_names)}."
            )
        if not isinstance(fsdp, bool):
            raise TypeError(
                f"ciclo.sharded: fsdp must be True or False, got {short(fsdp)}."
            )
        self.data_axis = data_axis
        self.rules = check_rules(rules, mesh)
        self.fsdp = fsdp
        self._user_mesh = None if mesh is None else _auto(mesh)
        self._mesh: Mesh | None = self._user_mesh
        # (mesh, axis, batch structure, leaf shapes) -> (shardings, several)
        self._placements: dict[Any, tuple[Any, bool]] = {}
        self.collectives = ShardedCollectives(self)

    @property
    def axis(self) -> str:
        """The mesh axis the batch is split on (`data_axis`)."""
        return self.data_axis

    @property
    def max_in_flight(self) -> int | None:
        # With several processes, XLA:CPU + gloo collectives were seen to deadlock
        # once ~100+ steps were queued; a window of 16 keeps the devices busy.
        return 16 if jax.process_count() > 1 else None

    @property
    def mesh(self) -> Mesh:
        """The mesh: the one given, else a 1-D mesh over all devices (built on
        first use, after `jax.distributed.initialize`)."""
        if self._user_mesh is not None:
            return self._user_mesh
        if self._mesh is None or self._mesh.devices.size != jax.device_count():
            self._mesh = Mesh(np.array(jax.devices()), (self.data_axis,))
        return self._mesh

    def specs(self, state: Any) -> Any:
        """The `PartitionSpec` of every leaf of `state` on this strategy's mesh.

        Example:
            >>> import ciclo, jax.numpy as jnp, optax
            >>> from ciclo import managed
            >>> s = managed.ManagedState.create(params={"w": jnp.ones(4)},
            ...     tx=optax.sgd(0.1), strategy="sharded")
            >>> ciclo.get_strategy("sharded").specs(s).params
            {'w': P()}
        """
        return state_specs(
            state,
            mesh=self.mesh,
            data_axis=self.data_axis,
            rules=self.rules,
            fsdp=self.fsdp,
            fsdp_min_size=self.fsdp_min_size,
        )

    def shardings(self, state: Any) -> Any:
        """The `NamedSharding` of every leaf of `state` (see `specs`)."""
        mesh = self.mesh
        return jax.tree.map(
            lambda spec: NamedSharding(mesh, spec),
            self.specs(state),
            is_leaf=lambda x: isinstance(x, P),
        )

    def place_state(self, state: Any) -> Any:
        shardings = self.shardings(state)
        # typed PRNG keys can't be put on devices of other processes: put their
        # raw data (from the host) and wrap it again
        keys = jax.tree.map(tree_is_key, state)
        raw = jax.tree.map(
            lambda x, key: jax.device_get(jax.random.key_data(x)) if key else x,
            state,
            keys,
        )
        # a donating strategy must not consume (or donate twice) the caller's arrays
        placed = jax.device_put(
            raw, shardings, may_alias=False if self.donate else None
        )
        return jax.tree.map(
            lambda x, old, key: (
                jax.random.wrap_key_data(x, impl=jax.random.key_impl(old)) if key else x
            ),
            placed,
            state,
            keys,
        )

    def to_host(self, state: Any) -> Any:
        return jax.tree.map(_local_copy, state)

    def checkpoint_layout(self, state: Any) -> Any:
        """What a checkpoint saves (and restores into): a replicated state on one
        local device, as before; a sharded one as it is, so that orbax writes
        each process's shards and reads them back in the target's shardings."""
        leaves = [x for x in jax.tree.leaves(state) if isinstance(x, jax.Array)]
        if all(x.is_fully_replicated for x in leaves):
            return self.to_host(state)
        return state

    def _local_data_shards(self) -> int:
        mesh = self.mesh
        axis = mesh.axis_names.index(self.data_axis)
        me = jax.process_index()
        return len(
            {
                index[axis]
                for index, device in np.ndenumerate(mesh.devices)
                if device.process_index == me
            }
        )

    def _batch_slices(self) -> int:
        """Across processes each feeds its local slice (`_place`): the data axis's
        shards over this process's, as `jax.make_array_from_process_local_data`
        assembles the global batch."""
        if jax.process_count() == 1:
            return 1
        return self.mesh.shape[self.data_axis] // self._local_data_shards()

    def place_batch(self, batch: Any) -> Any:
        return self._place(batch, axis=0)

    # a fused batch (steps, batch, ...) is placed as it is, sharded on its batch
    # axis: no transpose on the host, none on the device
    steps_major = True

    def place_steps(self, batch: Any) -> Any:
        return self._place(batch, axis=1)

    def _place(self, batch: Any, axis: int) -> Any:
        """`batch` with each leaf's axis `axis` split on the data axis (scalars
        replicated): in one process each numpy leaf's per-device slices (views)
        handed to one batched transfer (`ciclo._strategies.transfer.put`), on
        several each process's local slice per leaf."""
        leaves, tree = jax.tree.flatten(batch)
        key = (self.mesh, axis, tree, *[np.shape(x) for x in leaves])
        cached = self._placements.get(key)
        if cached is None:  # once per batch structure and shapes
            cached = self._placements[key] = self._shardings(
                self.mesh, axis, [np.shape(x) for x in leaves]
            )
        shardings, several = cached
        if not several:
            return jax.tree.unflatten(tree, put(leaves, shardings))
        placed = [
            jax.device_put(x, sharding)
            if not sharding.spec
            else jax.make_array_from_process_local_data(sharding, x)
            for x, sharding in zip(leaves, shardings)
        ]
        return jax.tree.unflatten(tree, placed)

    def _shardings(
        self, mesh: Mesh, axis: int, shapes: list[tuple[int, ...]]
    ) -> tuple[list[NamedSharding], bool]:
        """The sharding of each leaf (a list, in the batch's leaf order) and
        whether several processes place their local slices; raises for a leaf
        that does not split."""
        replicated = NamedSharding(mesh, P())
        data = NamedSharding(mesh, P(*([None] * axis), self.data_axis))
        local = self._local_data_shards()
        shardings = []
        for shape in shapes:
            if len(shape) <= axis:
                shardings.append(replicated)
                continue
            if shape[axis] % local:
                raise ValueError(self._uneven(shape, axis, local))
            shardings.append(data)
        return shardings, jax.process_count() > 1

    def _uneven(self, shape: tuple[int, ...], axis: int, local: int) -> str:
        mesh = self.mesh
        where = (
            f"{local} local data shards ({jax.device_count()} devices in "
            f"{jax.process_count()} processes, mesh {dict(mesh.shape)})"
            if jax.process_count() > 1
            else f"{local} devices"
            + (f" of axis {self.data_axis!r}" if len(mesh.axis_names) > 1 else "")
        )
        return (
            f"Strategy {self.name!r}: a batch of size {shape[axis]} (leaf "
            f"shape {shape}) does not split evenly across {where}. Use a "
            f"batch size that is a multiple of {local}, or drop the last "
            f"partial batch."
        )

    def lift_batch_size(self, batch_size: int) -> int:
        """Each data shard gets `batch_size` samples: `batch_size` times the size
        of the mesh's data axis (`jax.device_count()` for `"sharded"`).

        Example:
            >>> import ciclo, jax
            >>> ciclo.get_strategy("sharded").lift_batch_size(8) == 8 * jax.device_count()
            True
        """
        return batch_size * self.mesh.shape[self.data_axis]

    def wrap(self, fn: Step, *, donate: bool = False) -> Step:
        def step(state, batch, elapsed):
            logs, state = fn(state, batch, elapsed)
            return logs, jax.lax.with_sharding_constraint(state, self.shardings(state))

        compiled = jax.jit(step, donate_argnums=(0,) if donate else ())
        if jax.process_count() == 1:
            return compiled

        def run(state, batch, elapsed):
            logs, state = compiled(state, batch, elapsed)
            return jax.tree.map(self._readable, logs), state

        return run

    def _readable(self, x: Any) -> Any:
        """A leaf as the calling process can read it (several processes)."""
        if not isinstance(x, jax.Array) or x.is_fully_addressable:
            return x
        if x.is_fully_replicated:
            return _local_copy(x)
        spec = getattr(x.sharding, "spec", P(self.data_axis))
        return multihost_utils.global_array_to_host_local_array(x, self.mesh, spec)


def _local_copy(x: Any) -> Any:
    """The whole of `x` on one local device (works across processes)."""
    if not isinstance(x, jax.Array):
        return x
    if x.is_fully_replicated:
        return x.addressable_data(0)
    device = jax.local_devices()[0]
    if x.is_fully_addressable:
        return jax.device_put(x, device)
    if tree_is_key(x):
        data = multihost_utils.process_allgather(jax.random.key_data(x), tiled=True)
        return jax.random.wrap_key_data(
            jax.device_put(data, device), impl=jax.random.key_impl(x)
        )
    return jax.device_put(multihost_utils.process_allgather(x, tiled=True), device)
