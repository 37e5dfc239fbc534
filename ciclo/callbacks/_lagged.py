"""`LaggedValues`: the scalar losses/metrics a progress bar shows, read without waiting.

A training step returns device arrays that JAX computes asynchronously. Converting
one to a Python float (`float(x)`, `np.asarray(x)`, `jax.device_get(x)`) waits for
it, which would serialise the host with the device on every step. A bar instead
keeps references to the latest values and converts one only once `x.is_ready()`;
until then it keeps showing the previous number. `read_final()` waits (a single
sync, for when the loop ends).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import KeysView, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ciclo._logs import LOSSES, METRICS, STATEFUL_METRICS

__all__ = ["SHOWN_COLLECTIONS", "LaggedQueue", "LaggedValues", "is_ready", "to_host"]

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

    `offer(logs)` (each step; cheap: no conversion) remembers the values of every
    entry of the shown collections, the newest `keep` per entry. `read()` shows,
    for each entry, the NEWEST value the device has already computed (checked with
    `x.is_ready()`, which does not wait), and forgets the older ones. When none of
    the remembered values is ready (the device is more than `keep` steps behind),
    it waits on one value at a time, pinned when it started waiting, so a device
    that always runs far ahead still shows values some steps old rather than none.
    Entries with nothing ready keep their previous number. `read_final()` waits
    for the newest values (one sync, when the loop ends).

    Example:
        >>> import ciclo
        >>> from ciclo.callbacks._lagged import LaggedValues
        >>> values = LaggedValues()
        >>> values.offer(ciclo.logs().add_loss("loss", 0.5, add_metric=True))
        >>> values.offer(ciclo.logs().add_loss("loss", 0.25))
        >>> values.read()  # the newest computed value
        {'loss': 0.25}
    """

    def __init__(self, keep: int = 16) -> None:
        self.keep = keep
        self._recent: dict[str, deque] = {}  # oldest first, at most `keep`
        self._pinned: dict[str, Any] = {}
        self._shown: dict[str, float] = {}

    def offer(self, logs: Mapping[str, Mapping[str, Any]] | None) -> None:
        """Remembers the values of every shown entry of `logs` (no conversion)."""
        if not logs:
            return
        recent = self._recent
        for collection in SHOWN_COLLECTIONS:
            entries = logs.get(collection)
            if entries:
                for name, value in entries.items():
                    values = recent.get(name)
                    if values is None:
                        values = recent[name] = deque(maxlen=self.keep)
                    elif values and values[-1] is value:
                        continue  # the same value in two collections
                    values.append(value)

    def read(self) -> dict[str, float]:
        """The values to show now: per entry the newest one already computed."""
        pinned = self._pinned
        for name, values in self._recent.items():
            for i in range(len(values) - 1, -1, -1):
                number = _scalar(values[i], wait=False)
                if number is _NOT_READY:
                    continue
                for _ in range(i + 1):
                    values.popleft()
                pinned.pop(name, None)
                if number is not _SKIP:
                    self._shown[name] = number
                break
            else:
                if not values:
                    continue
                value = pinned.setdefault(name, values[0])
                number = _scalar(value, wait=False)
                if number is not _NOT_READY:
                    del pinned[name]
                    if number is not _SKIP:
                        self._shown[name] = number
        return self._ordered()

    def read_final(self) -> dict[str, float]:
        """The newest values, waiting for the device (one sync, at the end)."""
        for name, values in self._recent.items():
            if values:
                number = _scalar(values[-1], wait=True)
                values.clear()
                if number is not _SKIP:
                    self._shown[name] = number
        self._pinned.clear()
        return self._ordered()

    def names(self) -> KeysView[str]:
        """The names offered so far, the first offered first."""
        return self._recent.keys()

    def _ordered(self) -> dict[str, float]:
        # First-logged first, like Keras.
        return {n: self._shown[n] for n in self._recent if n in self._shown}

    def clear(self) -> None:
        """Forgets everything (a new run)."""
        self._recent.clear()
        self._pinned.clear()
        self._shown.clear()


def is_ready(value: Any) -> bool:
    """Whether `value` can be read without waiting for the device (a deleted or
    failed array counts as ready: reading it raises, it does not wait)."""
    if isinstance(value, jax.Array):
        try:
            return value.is_ready()
        except Exception:
            return True
    return True


def to_host(values: list[Any]) -> list[Any]:
    """`values` on the host in one transfer (each failed value becomes `None`)."""
    try:
        return jax.device_get(values)
    except Exception:
        out = []
        for value in values:
            try:
                out.append(jax.device_get(value))
            except Exception:
                out.append(None)
        return out


class LaggedQueue:
    """A first-in first-out queue of items holding device values, handed back on the
    host, in order, once the device has computed them.

    `push(item, values)` is cheap (no conversion). `pop_ready()` returns the oldest
    items whose values are all computed, checked with `jax.Array.is_ready()` (no
    wait), transferred in one `jax.device_get`; when more than `max_pending` items
    are queued (the device is far behind) it waits for the oldest excess ones, which
    bounds the device memory the queue holds. `drain()` waits for everything (one
    sync, for the end of a loop). This is the reading discipline shared by the
    metric writers and `nan_guard`.

    Example:
        >>> import jax.numpy as jnp
        >>> from ciclo.callbacks._lagged import LaggedQueue
        >>> queue = LaggedQueue()
        >>> queue.push("step 0", [jnp.float32(0.5), 1])
        >>> [(item, [float(v) for v in values]) for item, values in queue.drain()]
        [('step 0', [0.5, 1.0])]
    """

    def __init__(self, max_pending: int = 256):
        if isinstance(max_pending, bool) or not isinstance(max_pending, int):
            raise TypeError(f"`max_pending` must be an int, got {max_pending!r}.")
        if max_pending < 0:
            raise ValueError(f"`max_pending` must be >= 0, got {max_pending}.")
        self.max_pending = max_pending
        self._items: deque[tuple[Any, list[Any]]] = deque()

    def __len__(self) -> int:
        return len(self._items)

    def push(self, item: Any, values: list[Any]) -> None:
        """Queues `item` with its (device or host) `values`."""
        self._items.append((item, values))

    def pop_ready(self) -> list[tuple[Any, list[Any]]]:
        """The oldest items whose values are computed (and the excess over
        `max_pending`, waited for), with their values on the host."""
        items = self._items
        count = max(len(items) - self.max_pending, 0)
        for _, values in itertools.islice(items, count, None):
            if not all(is_ready(v) for v in values):
                break
            count += 1
        return self._pop(count)

    def drain(self) -> list[tuple[Any, list[Any]]]:
        """Every queued item with its values on the host (waits for the device)."""
        return self._pop(len(self._items))

    def clear(self) -> None:
        self._items.clear()

    def _pop(self, count: int) -> list[tuple[Any, list[Any]]]:
        if count == 0:
            return []
        popped = [self._items.popleft() for _ in range(count)]
        rows = [values for _, values in popped]
        try:
            host = jax.device_get(rows)
        except Exception:  # a failed or deleted value: only it is lost
            host = [to_host(values) for values in rows]
        return [(item, values) for (item, _), values in zip(popped, host)]
