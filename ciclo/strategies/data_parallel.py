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

from ciclo.logs import OUTPUTS, Logs
from ciclo.strategies.base import Step, Strategy, compute_stateful_metrics, tree_is_key

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
    return jax.tree.map(
        lambda x: einop.einop(x, "d b ... -> (d b) ...") if x.ndim >= 2 else x, logs
    )


class DataParallel(Strategy):
    """Data parallelism with `jax.pmap` over `jax.local_devices()`.

    The state is replicated on every device (typed PRNG keys, from
    `jax.random.key`, are split so each device draws different numbers); each batch
    is split on its first axis with einop; gradients and `batch_stats` are averaged
    with `pmean`. Logs come back with losses, metrics and every other collection
    averaged across devices (integer entries: device 0's value), outputs
    concatenated, and stateful metrics merged. Under `data_parallel`, `state.params`
    has a leading device axis: `state.with_strategy("jit")` takes device 0's copy.

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

    @property
    def devices(self) -> list[jax.Device]:
        """The devices used: the local ones (read when first needed)."""
        return jax.local_devices()

    def _sharding(self) -> NamedSharding:
        return NamedSharding(Mesh(np.array(self.devices), (self.axis,)), P(self.axis))

    def from_host(self, state: Any) -> Any:
        n = len(self.devices)

        def replicate(x: Any) -> Any:
            if tree_is_key(x):
                keys = jax.vmap(lambda k: jax.random.split(k, n))(x.reshape(-1))
                return jnp.moveaxis(keys, 1, 0).reshape((n, *x.shape))
            return jnp.broadcast_to(x, (n, *jnp.shape(x)))

        # one compiled call for the whole state, straight onto the devices
        sharding = self._sharding()
        place = jax.jit(partial(jax.tree.map, replicate), out_shardings=sharding)
        return place(jax.device_put(state, sharding.update(spec=P())))

    def to_host(self, state: Any) -> Any:
        return jax.tree.map(lambda x: x.addressable_data(0)[0], state)

    def lift_batch(self, batch: Any) -> Any:
        split = split_batch(batch, len(self.devices), self.name)
        return jax.device_put(split, self._sharding())

    def compile(self, fn: Step, *, donate: bool = False) -> Step:
        return jax.pmap(
            fn,
            axis_name=self.axis,
            in_axes=(0, 0, None),
            donate_argnums=(0,) if donate else (),
        )

    def mean(self, tree: Any) -> Any:
        return jax.lax.pmean(tree, self.axis)

    def reduce_logs(self, logs: Logs) -> Logs:
        logs = compute_stateful_metrics(logs, merge=_merge_across(self.axis))
        out = Logs()
        for collection, name, value in logs.entries():
            value = jnp.asarray(value)
            if collection != OUTPUTS and jnp.issubdtype(value.dtype, jnp.inexact):
                value = jax.lax.pmean(value, self.axis)
            out.add_entry(collection, name, value)
        return out

    def lower_logs(self, logs: Logs) -> Logs:
        if not logs:
            return logs
        reduced, outputs = Logs(), Logs()
        for collection, name, x in logs.entries():
            if collection == OUTPUTS:
                outputs.add_entry(collection, name, x)
            else:  # averaged inside the step: identical on every device
                reduced.add_entry(collection, name, x.addressable_data(0))
        if self._concatenate is None:
            self._concatenate = jax.jit(_concatenate, out_shardings=self._sharding())
        return self._first(reduced).merge(self._concatenate(outputs))
