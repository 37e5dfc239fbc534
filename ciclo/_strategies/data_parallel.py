"""The `data_parallel` strategies: `jax.pmap` over the local devices."""

from __future__ import annotations

from functools import partial
from typing import Any

import einop
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ciclo._logs import OUTPUTS, Logs
from ciclo._strategies.base import (
    Step,
    Strategy,
    compute_stateful_metrics,
    is_stateful_metric,
    tree_is_key,
)

__all__ = ["DataParallel", "split_batch"]


def split_batch(batch: Any, devices: int, strategy: str) -> Any:
    """Reshapes every leaf `(B, ...)` to `(devices, B // devices, ...)` with einop.

    Leaves without a shape are broadcast to `(devices,)`.

    Raises:
        ValueError: if a leaf's batch size does not split across `devices`.
    """

    def split(x: Any) -> Any:
        shape = np.shape(x)
        if not shape:
            return np.broadcast_to(x, (devices,))
        if shape[0] % devices:
            raise ValueError(
                f"Strategy {strategy!r}: a batch of size {shape[0]} (leaf shape "
                f"{shape}) does not split evenly across {devices} devices. Use a "
                f"batch size that is a multiple of {devices}, e.g. "
                f"{max(devices, shape[0] // devices * devices)}, or drop the last "
                f"partial batch."
            )
        return einop.einop(x, "(d b) ... -> d b ...", d=devices)

    return jax.tree.map(split, batch)


def _merge_across(axis: str):
    def merge(metric: Any) -> Any:
        return jax.lax.all_gather(metric, axis).reduce()

    return merge


def _first(logs: Logs) -> Logs:
    """Device 0's value of every entry (inputs already on device 0: no collective)."""
    return jax.tree.map(lambda x: x[0], logs)


def _concatenate(logs: Logs) -> Logs:
    """`(devices, b, ...) -> (devices * b, ...)`, each device keeping its rows."""
    return jax.tree.map(lambda x: einop.einop(x, "d b ... -> (d b) ..."), logs)


def _average(value: jax.Array, axis: str) -> jax.Array:
    """`pmean` of any dtype: integers and booleans are averaged as float32."""
    if not jnp.issubdtype(value.dtype, jnp.inexact):
        value = value.astype(jnp.float32)
    return jax.lax.pmean(value, axis)


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
    with einop; gradients and `batch_stats` are averaged with `pmean`.

    Logs come back with losses, metrics and every other collection averaged across
    devices, whatever their dtype (integers and booleans as float32; a per-device
    sum comes back as the average of the devices' sums, not the total), stateful
    metrics merged, and outputs with a batch axis concatenated (0-d outputs are
    averaged like metrics).

    Under `data_parallel` every state array has a leading device axis;
    `state.with_strategy("jit")` takes device 0's copy (so a PRNG key round-trips).
    Stateful metrics held in the state (`clu.metrics.Metric`) start on device 0
    (the other devices empty), accumulate per device, and are merged across
    devices by `with_strategy`.

    Example:
        >>> import ciclo
        >>> ciclo.get_strategy("data_parallel").axis
        'device'
    """

    axis = "device"

    def __init__(self, name: str = "data_parallel", *, donate: bool = False):
        super().__init__(name, donate=donate)
        self._first = jax.jit(_first)
        self._concatenate: Any = None
        self._place: Any = None  # the jitted replication, built once

    @property
    def devices(self) -> list[jax.Device]:
        """The devices used: the local ones (read when first needed)."""
        return jax.local_devices()

    def _sharding(self) -> NamedSharding:
        return NamedSharding(Mesh(np.array(self.devices), (self.axis,)), P(self.axis))

    def from_host(self, state: Any) -> Any:
        sharding = self._sharding()
        if self._place is None:  # one compiled call for the whole state
            n = len(self.devices)
            replicate = partial(_replicate, n)
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

    def lift_batch(self, batch: Any) -> Any:
        split = split_batch(batch, len(self.devices), self.name)
        return jax.device_put(split, self._sharding())

    def compile(self, fn: Step, *, donate: bool = False) -> Step:
        donated = (0,) if donate else ()
        with_elapsed = jax.pmap(
            fn, axis_name=self.axis, in_axes=(0, 0, None), donate_argnums=donated
        )
        # no `None` argument through pmap: it misaligns pmap's argument shardings
        # in JAX 0.10 when the state and batch have few leaves
        without = jax.pmap(
            lambda state, batch: fn(state, batch, None),
            axis_name=self.axis,
            in_axes=(0, 0),
            donate_argnums=donated,
        )

        def run(state: Any, batch: Any, elapsed: Any) -> Any:
            if elapsed is None:
                return without(state, batch)
            return with_elapsed(state, batch, elapsed)

        return run

    def mean(self, tree: Any) -> Any:
        return jax.lax.pmean(tree, self.axis)

    def reduce_logs(self, logs: Logs) -> Logs:
        logs = compute_stateful_metrics(logs, merge=_merge_across(self.axis))
        out = Logs()
        for collection, name, value in logs.entries():
            value = jnp.asarray(value)
            if collection != OUTPUTS or value.ndim == 0:
                value = _average(value, self.axis)
            out.add_entry(collection, name, value)
        return out

    def lower_logs(self, logs: Logs) -> Logs:
        if not logs:
            return logs
        reduced, outputs = Logs(), Logs()
        for collection, name, x in logs.entries():
            if collection == OUTPUTS and x.ndim >= 2:
                outputs.add_entry(collection, name, x)
            else:  # averaged inside the step: identical on every device
                reduced.add_entry(collection, name, x.addressable_data(0))
        if self._concatenate is None:
            self._concatenate = jax.jit(_concatenate, out_shardings=self._sharding())
        return self._first(reduced).merge(self._concatenate(outputs))
