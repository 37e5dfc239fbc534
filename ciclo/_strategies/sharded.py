"""The `sharded` strategy: `jax.jit` over a 1-D mesh of all (global) devices."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ciclo._strategies.base import Collectives, Step, Strategy, tree_is_key

__all__ = ["Sharded", "ShardedCollectives"]


class ShardedCollectives(Collectives):
    """One program over the global batch: nothing to combine, only to lay out.

    `mean` and `merge` keep values replicated over the mesh (readable by every
    process); `concat` keeps per-sample values sharded on the batch axis, so each
    process gets back the rows of its local batch.
    """

    def __init__(self, strategy: Sharded):
        self._strategy = strategy

    def _constrain(self, tree: Any, spec: P) -> Any:
        sharding = NamedSharding(self._strategy.mesh, spec)
        return jax.tree.map(
            lambda x: jax.lax.with_sharding_constraint(x, sharding), tree
        )

    def mean(self, tree: Any) -> Any:
        return self._constrain(tree, P())

    def merge(self, metric: Any) -> Any:
        return self._constrain(metric, P())

    def concat(self, tree: Any) -> Any:
        n = jax.device_count()
        axis = self._strategy.axis

        def shard(x: Any) -> Any:
            shape = np.shape(x)
            spec = P(axis) if shape and shape[0] % n == 0 else P()
            return jax.lax.with_sharding_constraint(
                x, NamedSharding(self._strategy.mesh, spec)
            )

        return jax.tree.map(shard, tree)


class Sharded(Strategy):
    """Data parallelism with `jax.jit` on a `Mesh` of `jax.devices()` (axis `data`).

    The state is replicated over the mesh and each batch is sharded on its first
    axis; XLA inserts the gradient all-reduce, so results equal the `jit` run.
    Under `jax.distributed` (several processes) each process passes its LOCAL part
    of the batch (its size a multiple of its local device count); the global batch
    is assembled with `jax.make_array_from_process_local_data`, in process order.

    What comes back is always readable by the calling process: losses and metrics
    are replicated (one device's copy is returned), outputs are the rows of the
    calling process's local batch (gather them with
    `jax.experimental.multihost_utils.process_allgather` if needed), and `to_host`
    returns the state on one local device (each process holds a full copy).

    Example:
        >>> import ciclo
        >>> ciclo.get_strategy("sharded").axis
        'data'
    """

    axis = "data"

    def __init__(self, name: str = "sharded", *, donate: bool = False):
        super().__init__(name, donate=donate)
        self._mesh: Mesh | None = None
        self.collectives = ShardedCollectives(self)

    @property
    def max_in_flight(self) -> int | None:
        # With several processes, XLA:CPU + gloo collectives were seen to deadlock
        # once ~100+ steps were queued; a window of 16 keeps the devices busy.
        return 16 if jax.process_count() > 1 else None

    @property
    def mesh(self) -> Mesh:
        """The 1-D mesh over all devices (built on first use, after
        `jax.distributed.initialize`)."""
        if self._mesh is None or self._mesh.devices.size != jax.device_count():
            self._mesh = jax.sharding.Mesh(np.array(jax.devices()), (self.axis,))
            self._replicated = NamedSharding(self._mesh, P())
            self._data = NamedSharding(self._mesh, P(self.axis))
        return self._mesh

    def place_state(self, state: Any) -> Any:
        replicated = NamedSharding(self.mesh, P())
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
            raw, replicated, may_alias=False if self.donate else None
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

    def place_batch(self, batch: Any) -> Any:
        self.mesh  # noqa: B018  (builds the shardings once)
        local = jax.local_device_count()
        replicated, data = self._replicated, self._data

        def shard(x: Any) -> Any:
            shape = np.shape(x)
            if not shape:
                return jax.device_put(x, replicated)
            if shape[0] % local:
                where = (
                    f"{local} local devices ({jax.device_count()} devices in "
                    f"{jax.process_count()} processes)"
                    if jax.process_count() > 1
                    else f"{local} devices"
                )
                raise ValueError(
                    f"Strategy {self.name!r}: a batch of size {shape[0]} (leaf "
                    f"shape {shape}) does not split evenly across {where}. Use a "
                    f"batch size that is a multiple of {local}, or drop the last "
                    f"partial batch."
                )
            return jax.make_array_from_process_local_data(data, x)

        return jax.tree.map(shard, batch)

    def lift_batch_size(self, batch_size: int) -> int:
        """Each device gets `batch_size` samples: `batch_size * jax.device_count()`.

        Example:
            >>> import ciclo, jax
            >>> ciclo.get_strategy("sharded").lift_batch_size(8) == 8 * jax.device_count()
            True
        """
        return batch_size * jax.device_count()

    def wrap(self, fn: Step, *, donate: bool = False) -> Step:
        replicated = NamedSharding(self.mesh, P())

        def step(state, batch, elapsed):
            logs, state = fn(state, batch, elapsed)
            return logs, jax.lax.with_sharding_constraint(state, replicated)

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
        spec = getattr(x.sharding, "spec", P(self.axis))
        return multihost_utils.global_array_to_host_local_array(x, self.mesh, spec)


def _local_copy(x: Any) -> Any:
    """One local device's copy of a replicated array (works across processes)."""
    if isinstance(x, jax.Array):
        return x.addressable_data(0)
    return x
