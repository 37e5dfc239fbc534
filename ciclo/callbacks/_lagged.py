"""`LaggedValues`: the scalar losses/metrics a progress bar shows, read without waiting.

A training step returns device arrays that JAX computes asynchronously. Converting
one to a Python float (`float(x)`, `np.asarray(x)`, `jax.device_get(x)`) waits for
it, which would serialise the host with the device on every step. A bar instead
keeps references to the latest values and converts one only once `x.is_ready()`;
until then it keeps showing the previous number. `read_final()` waits (a single
sync, for when the loop ends).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ciclo._logs import LOSSES, METRICS, STATEFUL_METRICS

__all__ = ["SHOWN_COLLECTIONS", "LaggedValues"]

# Collections a bar shows, by bare entry name; a name logged in several of them
# (`add_loss(..., add_metric=True)`) is shown once.
SHOWN_COLLECTIONS = (LOSSES, METRICS, STATEFUL_METRICS)

_NOT_READY = object()
_SKIP = object()


def _scalar(value: Any, *, wait: bool) -> Any:
    """`value` as a float; `_NOT_READY` if it is still being computed; `_SKIP` if it
    is not a scalar number (arrays with several elements, strings, objects)."""
    if isinstance(value, bool | int | float | np.number):
        return float(value)
    if isinstance(value, jax.Array):
        if value.size != 1 or not jnp.issubdtype(value.dtype, jnp.number):
            return _SKIP
        try:
            if not wait and not value.is_ready():
                return _NOT_READY
            # explicit transfer of a finished value: no wait, allowed by
            # jax.transfer_guard('disallow') (which forbids implicit ones)
            return float(np.asarray(jax.device_get(value)).reshape(()))
        # A deleted (donated) array or a failed computation: a bar must not crash
        # the loop over it; the error surfaces where the value is really used.
        except Exception:
            return _SKIP
    if (
        isinstance(value, np.ndarray)
        and value.size == 1
        and jnp.issubdtype(value.dtype, jnp.number)
    ):
        return float(value.reshape(()))
    return _SKIP


class LaggedValues:
    """The latest scalar entries of some logs, as floats, never waiting on the device.

    `offer(logs)` (each step; cheap: no conversion) remembers the latest value of
    every entry of the shown collections. `read()` converts what is ready: for each
    entry it waits on one value at a time (the newest when it started waiting), so a
    device that always runs a few steps ahead still shows values a few steps old
    rather than none. Entries whose value is not ready keep their previous number.

    Example:
        >>> import ciclo
        >>> from ciclo.callbacks._lagged import LaggedValues
        >>> values = LaggedValues()
        >>> logs = ciclo.logs()
        >>> _ = logs.add_loss("loss", 0.5, add_metric=True)
        >>> values.offer(logs)
        >>> values.read()
        {'loss': 0.5}
    """

    def __init__(self) -> None:
        self._latest: dict[str, Any] = {}
        self._waiting: dict[str, Any] = {}
        self._shown: dict[str, float] = {}

    def offer(self, logs: Mapping[str, Mapping[str, Any]] | None) -> None:
        """Remembers the latest value of every shown entry of `logs` (no conversion)."""
        if not logs:
            return
        latest = self._latest
        for collection in SHOWN_COLLECTIONS:
            entries = logs.get(collection)
            if entries:
                latest.update(entries)

    def read(self) -> dict[str, float]:
        """The values to show now, converting only those the device has finished."""
        waiting = self._waiting
        for name, value in self._latest.items():
            if name not in waiting:
                waiting[name] = value
        for name, value in list(waiting.items()):
            number = _scalar(value, wait=False)
            if number is _NOT_READY:
                continue
            del waiting[name]
            if number is not _SKIP:
                self._shown[name] = number
        return self._ordered()

    def read_final(self) -> dict[str, float]:
        """The latest values, waiting for the device (one sync, at the end)."""
        for name, value in self._latest.items():
            number = _scalar(value, wait=True)
            if number is not _SKIP:
                self._shown[name] = number
        self._waiting.clear()
        return self._ordered()

    def _ordered(self) -> dict[str, float]:
        # First-logged first, like Keras.
        return {n: self._shown[n] for n in self._latest if n in self._shown}

    def clear(self) -> None:
        """Forgets everything (a new run)."""
        self._latest.clear()
        self._waiting.clear()
        self._shown.clear()
