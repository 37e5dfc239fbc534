"""Device values to the host in few transfers: what `History` fetches lagged.

Device scalars are stacked on the device and fetched in one transfer per dtype; a
fused call's per-step values (`Row`s of a stacked array) are fetched once per array
and sliced on the host; anything else goes through `jax.device_get`. A transfer is
started (`start`: the stacking is dispatched, not waited for) and read later
(`Transfer.result`), once `Transfer.ready()` says it would not wait.

Every transfer here is explicit, as `jax.device_get`'s are: a user's
`jax.transfer_guard_device_to_host("disallow")` (which refuses implicit transfers,
the hidden syncs it is meant to find) lets these deliberate, lagged fetches through;
`"disallow_explicit"` refuses them too.
"""

from __future__ import annotations

import contextlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

try:  # the scope `jax.device_get` marks its own transfers explicit with
    from jax._src.config import explicit_device_get_scope as _explicit_scope
except ImportError:  # pragma: no cover - a jax that moved it
    _explicit_scope = None

__all__ = ["Row", "Transfer", "array_type", "explicit", "fetch", "start", "to_host"]


def explicit() -> contextlib.AbstractContextManager:
    """A scope whose device-to-host transfers count as explicit, as those of
    `jax.device_get` do: for ciclo's deliberate fetches that go through other calls
    (`copy_to_host_async`, orbax's save). A jax without jax's scope: the fetch is
    allowed outright."""
    if _explicit_scope is not None:
        return _explicit_scope()
    return jax.transfer_guard_device_to_host("allow")  # pragma: no cover


class Row:
    """Row `index` of a value stacked over the steps of a fused call (`Steps.rows`);
    the stacked array is fetched once for all its rows."""

    __slots__ = ("index", "stacked")

    def __init__(self, stacked: Any, index: int):
        self.stacked, self.index = stacked, index


_ARRAY_IMPL: type | None = None


def _array_impl() -> type:
    """jax's concrete array type, found on first use (an array made at import would
    start the backend before the user's `jax.distributed.initialize`)."""
    global _ARRAY_IMPL
    if _ARRAY_IMPL is None:
        _ARRAY_IMPL = type(jnp.zeros(()))
    return _ARRAY_IMPL


def array_type() -> type | None:
    """jax's concrete array type once a device value was fetched, else None."""
    return _ARRAY_IMPL


def fetch(groups: list[list[Any]]) -> list[np.ndarray | list[Any]]:
    """Each group of values (a column's pending values) on the host, with few
    transfers (see `start`); waits for the values to be computed."""
    return start(groups).result()


def start(groups: list[list[Any]]) -> Transfer:
    """Starts bringing each group of values (a column's pending values) to the
    host, without waiting for the device: device scalars are stacked on the
    device, one array per dtype (a value in several groups or rows, by
    identity, is stacked once); each stacked array of a fused call is copied
    once; `Transfer.result()` slices them on the host. Anything else goes
    through `to_host` when the result is read."""
    array_impl = _ARRAY_IMPL
    if array_impl is None and any(isinstance(g[0], jax.Array) for g in groups):
        array_impl = _array_impl()  # an array exists: the backend is up already
    scalars: dict[Any, tuple[list[Any], dict[int, int]]] = {}  # dtype -> values
    stacked: dict[int, Any] = {}  # id -> a fused call's stacked array
    others: list[Any] = []
    plans = []
    for values in groups:
        first = values[0]
        dtype = getattr(first, "dtype", None)
        keys = list(map(id, values))
        distinct = dict(zip(keys, values))  # by identity, in order
        if (
            type(first) is array_impl
            and first.ndim == 0
            and first.dtype.kind in "iuf"
            and all(
                type(v) is array_impl and v.dtype == dtype for v in distinct.values()
            )
        ):  # the common column: device scalars (a shape mismatch is caught later)
            bucket, seen = scalars.setdefault(dtype, ([], {}))
            for key, value in distinct.items():
                if key not in seen:
                    seen[key] = len(bucket)
                    bucket.append(value)
            plans.append([["scalar", dtype, list(map(seen.__getitem__, keys))]])
            continue
        plan: list[list[Any]] = []  # [kind, source, indices] runs
        for v in values:
            kind = type(v)
            if kind is Row:
                source, i = v.stacked, v.index
                stacked.setdefault(id(source), source)
            elif kind is array_impl and v.ndim == 0 and v.dtype.kind in "iuf":
                kind, source = "scalar", v.dtype
                bucket, seen = scalars.setdefault(source, ([], {}))
                i = seen.get(id(v))
                if i is None:
                    i = seen[id(v)] = len(bucket)
                    bucket.append(v)
            else:
                kind, source, i = "other", None, len(others)
                others.append(v)
            last = plan[-1] if plan else None
            if last is not None and last[0] is kind and last[1] is source:
                last[2].append(i)
            else:
                plan.append([kind, source, [i]])
        plans.append(plan)
    return Transfer(scalars, stacked, others, plans)


class Transfer:
    """Values on their way to the host (`start`): `ready()` says, without waiting,
    whether reading them would wait; `result()` reads them (once)."""

    __slots__ = ("_device", "_host", "_others", "_plans")

    def __init__(self, scalars, stacked, others, plans):
        host: dict[Any, Any] = {}  # key -> host array, or a device array until read
        for dtype, (values, _) in scalars.items():
            host[dtype] = _stack_scalars(values)
        host.update(stacked)
        with explicit():  # started as `jax.device_get` starts its copies
            for value in host.values():
                if isinstance(value, jax.Array):
                    value.copy_to_host_async()
        self._host, self._others, self._plans = host, others, plans
        self._device = [
            v for v in (*host.values(), *others) if isinstance(v, jax.Array)
        ]

    def ready(self) -> bool:
        """Whether every value is computed (so `result()` does not wait)."""
        return all(value.is_ready() for value in self._device)

    def result(self) -> list[np.ndarray | list[Any]]:
        """Each group on the host: one numpy array when its parts share a dtype
        (appended in bulk), else a list."""
        # explicit transfers (allowed under jax.transfer_guard("disallow")); a list
        # holds scalars that could not be stacked, already on the host
        host = {
            key: np.asarray(jax.device_get(value))
            if isinstance(value, jax.Array)
            else value
            for key, value in self._host.items()
        }
        others = to_host(self._others) if self._others else self._others
        out: list[Any] = []
        for plan in self._plans:
            parts = []
            for kind, source, index in plan:
                if kind == "other":
                    parts.append([others[i] for i in index])
                else:
                    values = host[source if kind == "scalar" else id(source)]
                    parts.append(
                        values[index]
                        if isinstance(values, np.ndarray)
                        else [values[i] for i in index]
                    )
            arrays = all(isinstance(p, np.ndarray) for p in parts)
            if arrays and len({p.dtype for p in parts}) == 1:
                out.append(parts[0] if len(parts) == 1 else np.concatenate(parts))
            else:
                out.append([v for p in parts for v in p])
        return out


def _stack_scalars(values: list[jax.Array]) -> jax.Array | list[Any]:
    """Device scalars of one dtype stacked on the device (not waited for); scalars
    on different devices come back each, on the host."""
    size = 1 << (len(values) - 1).bit_length()  # few shapes, few compiles
    try:
        return _stack(*values, *[values[0]] * (size - len(values)))
    except (TypeError, ValueError):  # not all scalars, or on different devices
        return to_host(values)


def to_host(values: list[Any]) -> list[Any]:
    """`values` (no `Row`s: `fetch` slices those) on the host: device scalars stacked
    on the device and fetched with one transfer per (dtype, sharding); other device
    arrays in one `jax.device_get`."""
    out = list(values)
    scalars: dict[Any, list[int]] = {}
    arrays: list[int] = []
    for i, value in enumerate(values):
        if isinstance(value, jax.Array):
            if value.shape == () and not jax.dtypes.issubdtype(
                value.dtype, jax.dtypes.prng_key
            ):
                scalars.setdefault((value.dtype, value.sharding), []).append(i)
            else:
                arrays.append(i)
    for index in scalars.values():
        if len(index) == 1:
            arrays.append(index[0])
            continue
        size = 1 << (len(index) - 1).bit_length()  # few shapes, few compiles
        padded = [values[i] for i in index] + [values[index[0]]] * (size - len(index))
        host = jax.device_get(_stack(*padded))
        for j, i in enumerate(index):
            out[i] = host[j]
    if arrays:
        for i, value in zip(arrays, jax.device_get([values[i] for i in arrays])):
            out[i] = value
    return out


@jax.jit
def _stack(*scalars: jax.Array) -> jax.Array:
    return jnp.stack(scalars)
