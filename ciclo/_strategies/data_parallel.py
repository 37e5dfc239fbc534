"""The `data_parallel` strategies: `jax.pmap` over the local devices."""

from __future__ import annotations

from functools import partial
from typing import Any

import einop
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from ciclo._strategies.base import (
    Collectives,
    Step,
    Strategy,
    is_stateful_metric,
    tree_is_key,
)
from ciclo._strategies.transfer import put

__all__ = ["DataParallel", "MappedCollectives", "split_batch"]


def split_batch(batch: Any, devices: int, strategy: str, axis: int = 0) -> Any:
    """Splits every leaf's batch axis `axis` into `(devices, B // devices)` with
    einop: `(B, ...)` -> `(devices, B // devices, ...)`, or for a fused batch
    (`axis=1`) `(steps, B, ...)` -> `(steps, devices, B // devices, ...)`. On a
    numpy leaf this is a view (no copy).

    Leaves without a batch axis are broadcast along a new device axis `axis`.

    Raises:
        ValueError: if a leaf's batch size does not split across `devices`.
    """
    pattern = "(d b) ... -> d b ..." if axis == 0 else "s (d b) ... -> s d b ..."

    def split(x: Any) -> Any:
        shape = np.shape(x)
        if len(shape) <= axis:
            return np.broadcast_to(np.expand_dims(x, axis), (*shape, devices))
        if shape[axis] % devices:
            raise ValueError(
                f"Strategy {strategy!r}: a batch of size {shape[axis]} (leaf shape "
                f"{shape}) does not split evenly across {devices} devices. Use a "
                f"batch size that is a multiple of {devices}, e.g. "
                f"{max(devices, shape[axis] // devices * devices)}, or drop the last "
                f"partial batch."
            )
        return einop.einop(x, pattern, d=devices)

    return jax.tree.map(split, batch)


def _average(value: Any, axis: str) -> jax.Array:
    """`pmean` of any dtype: integers and booleans are averaged as float32."""
    value = jnp.asarray(value)
    if not jnp.issubdtype(value.dtype, jnp.inexact):
        value = value.astype(jnp.float32)
    return jax.lax.pmean(value, axis)


def _gather(value: Any, axis: str) -> jax.Array:
    value = jnp.asarray(value)
    return jax.lax.all_gather(value, axis, tiled=value.ndim > 0)


# declared aggregations combined across devices by their own collective
_ACROSS = {"sum": jax.lax.psum, "min": jax.lax.pmin, "max": jax.lax.pmax}


class MappedCollectives(Collectives):
    """Collectives over a named mapped axis (`pmap`'s `axis_name`).

    Example:
        >>> from ciclo._strategies.data_parallel import MappedCollectives
        >>> MappedCollectives("device").axis_name
        'device'
    """

    def __init__(self, axis_name: str):
        self.axis_name = axis_name

    def mean(self, tree: Any) -> Any:
        return jax.tree.map(partial(_average, axis=self.axis_name), tree)

    def reduce(self, tree: Any, mode: str) -> Any:
        combine = _ACROSS.get(mode)
        if combine is None:
            return self.mean(tree)
        return jax.tree.map(partial(combine, axis_name=self.axis_name), tree)

    def weighted_mean(self, tree: Any, weight: Any) -> Any:
        axis = self.axis_name
        weight = jnp.asarray(weight, jnp.float32)
        total = jax.lax.psum(weight, axis)
        safe = jnp.where(total > 0, total, 1.0)  # no weight anywhere: 0

        def combine(value: Any) -> jax.Array:
            value = jnp.asarray(value)
            if not jnp.issubdtype(value.dtype, jnp.inexact):
                value = value.astype(jnp.float32)
            return jax.lax.psum(value * weight.astype(value.dtype), axis) / safe

        return jax.tree.map(combine, tree)

    def merge(self, metric: Any) -> Any:
        return jax.lax.all_gather(metric, self.axis_name).reduce()

    def concat(self, tree: Any) -> Any:
        return jax.tree.map(partial(_gather, axis=self.axis_name), tree)


@jax.jit
def _reduce_metric(metric: Any) -> Any:
    """Merges a stateful metric with a leading device axis (`Metric.reduce`)."""
    return metric.reduce()


def _replicate(n: int, x: Any) -> Any:
    """`x` -> `(n, *x.shape)`, device 0 keeping `x`.

    Typed keys: device i gets `fold_in(k, i)`. Stateful metrics: the other devices
    start empty (zeros), so merging the devices' metrics gives back `x`.
    """
    if is_stateful_metric(x):
        return jax.tree.map(
            lambda a: jnp.concatenate([a[None], jnp.zeros((n - 1, *a.shape), a.dtype)]),
            x,
        )
    if tree_is_key(x):

        def per_device(key: jax.Array) -> jax.Array:
            others = jax.vmap(partial(jax.random.fold_in, key))(jnp.arange(1, n))
            return jnp.concatenate([key[None], others])

        keys = jax.vmap(per_device)(x.reshape(-1))
        return jnp.moveaxis(keys, 1, 0).reshape((n, *x.shape))
    return jnp.broadcast_to(x, (n, *jnp.shape(x)))


class DataParallel(Strategy):
    """Data parallelism with `jax.pmap` over `jax.local_devices()`.

    The state is replicated on every device; typed PRNG keys (`jax.random.key`)
    differ per device so each device draws different numbers: device 0 keeps the
    key, device `i` gets `jax.random.fold_in(key, i)`. Legacy raw `uint32` keys
    (`jax.random.PRNGKey`) are plain arrays and are NOT split: every device draws
    the same numbers (use `jax.random.key`). Each batch is split on its first axis
    with einop. Inside the step, `collectives` work over the axis `"device"`
    (`pmean`, `all_gather`); what the step returns as logs must be the same on
    every device (the managed steps make it so) and comes back once.

    Under `data_parallel` every state array has a leading device axis;
    `state.with_strategy("jit")` takes device 0's copy (so a PRNG key round-trips).
    Stateful metrics held in the state (`clu.metrics.Metric`) start on device 0
    (the other devices empty), accumulate per device, and are merged across
    devices by `with_strategy`. The mesh and shardings are built once, on first
    use.

    Example:
        >>> import ciclo
        >>> ciclo.get_strategy("data_parallel").axis
        'device'
    """

    axis = "device"

    def __init__(self, name: str = "data_parallel", *, donate: bool = False):
        super().__init__(name, donate=donate)
        self.collectives = MappedCollectives(self.axis)
        self._devices: list[jax.Device] | None = None
        # by axis: the device axis of a split batch (0) or fused batch (1)
        self._data: dict[int, NamedSharding] = {}
        self._place: Any = None  # the jitted replication, built once

    @property
    def devices(self) -> list[jax.Device]:
        """The devices used: the local ones (read when first needed)."""
        if self._devices is None:
            self._devices = jax.local_devices()
        return self._devices

    def _sharding(self, axis: int = 0) -> NamedSharding:
        """The devices' axis `axis` split over the devices (pmap's `in_axes`)."""
        sharding = self._data.get(axis)
        if sharding is None:
            if not self._data:
                mesh = jax.sharding.Mesh(np.array(self.devices), (self.axis,))
            else:
                mesh = next(iter(self._data.values())).mesh
            spec = P(*[None] * axis, self.axis)
            sharding = self._data[axis] = NamedSharding(mesh, spec)
        return sharding

    def place_state(self, state: Any) -> Any:
        sharding = self._sharding()
        if self._place is None:  # one compiled call for the whole state
            replicate = partial(_replicate, len(self.devices))
            self._place = jax.jit(
                partial(jax.tree.map, replicate, is_leaf=is_stateful_metric),
                out_shardings=sharding,
            )
        # (the placement's outputs are fresh buffers: safe to donate)
        return self._place(jax.device_put(state, sharding.update(spec=P())))

    def to_host(self, state: Any) -> Any:
        device = self.devices[0]

        def unreplicate(x: Any) -> Any:
            if is_stateful_metric(x):  # merge what each device accumulated
                return _reduce_metric(jax.device_put(x, device))
            return x.addressable_data(0)[0]

        return jax.tree.map(unreplicate, state, is_leaf=is_stateful_metric)

    def place_batch(self, batch: Any) -> Any:
        """`batch` split on its first axis, `(devices, B // devices, ...)` (a view
        on the host), then transferred (`_put`)."""
        if batch is None:
            return None
        return self._put(split_batch(batch, len(self.devices), self.name), axis=0)

    # a fused batch (steps, batch, ...) is placed steps-major, as
    # (steps, devices, batch // devices, ...) with its device axis split: a view
    # on the host (no transpose), transferred as is, mapped on axis 1 (`wrap_steps`)
    steps_major = True

    def place_steps(self, batch: Any) -> Any:
        if batch is None:
            return None
        return self._put(split_batch(batch, len(self.devices), self.name, 1), axis=1)

    def _put(self, split: Any, axis: int) -> Any:
        """A split batch onto the devices: each numpy leaf's per-device slices
        (views) in one batched transfer (`ciclo._strategies.transfer.put`)."""
        leaves, tree = jax.tree.flatten(split)
        sharding = self._sharding(axis)
        return jax.tree.unflatten(tree, put(leaves, [sharding] * len(leaves)))

    def lift_batch_size(self, batch_size: int) -> int:
        """Each local device gets `batch_size` samples: `batch_size * devices`.

        Example:
            >>> import ciclo, jax
            >>> strategy = ciclo.get_strategy("data_parallel")
            >>> strategy.lift_batch_size(8) == 8 * jax.local_device_count()
            True
        """
        return batch_size * len(self.devices)

    def wrap(self, fn: Step, *, donate: bool = False) -> Step:
        return self._mapped(fn, donate=donate, batch_axis=0)

    def wrap_steps(self, fn: Step, *, donate: bool = False) -> Step:
        """As `wrap`, for a fused call: the batch is mapped on axis 1 (`place_steps`
        lays it out `(steps, devices, ...)`); `fn` gets it `(steps, B // devices,
        ...)`."""
        return self._mapped(fn, donate=donate, batch_axis=1)

    def _mapped(self, fn: Step, *, donate: bool, batch_axis: int) -> Step:
        donated = (0,) if donate else ()
        # on the devices the batch is placed on (pmap's own default is
        # `jax.devices()`: a batch placed on another order would not match)
        pmap = partial(
            jax.pmap,
            axis_name=self.axis,
            out_axes=(None, 0),
            donate_argnums=donated,
            devices=self.devices,
        )
        b = batch_axis
        # no `None` argument through pmap (it misaligns pmap's argument shardings
        # in JAX 0.10 when the state and batch have few leaves): one mapped
        # function per combination of missing arguments, built when first needed
        builders = {
            (True, True): lambda: pmap(fn, in_axes=(0, b, None)),
            (True, False): lambda: pmap(lambda s, x: fn(s, x, None), in_axes=(0, b)),
            (False, True): lambda: pmap(lambda s, e: fn(s, None, e), in_axes=(0, None)),
            (False, False): lambda: pmap(lambda s: fn(s, None, None), in_axes=(0,)),
        }
        mapped: dict[tuple[bool, bool], Any] = {}

        def run(state: Any, batch: Any, elapsed: Any) -> Any:
            key = (batch is not None, elapsed is not None)
            f = mapped.get(key)
            if f is None:
                f = mapped[key] = builders[key]()
            args = [a for a in (batch, elapsed) if a is not None]
            return f(state, *args)

        return run
