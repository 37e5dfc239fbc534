"""Device values to the host in few transfers: what `History` fetches lagged.

Device scalars are stacked on the device and fetched in one transfer per dtype; a
fused call's per-step values (`Row`s of a stacked array) are fetched once per array
and sliced on the host; anything else goes through `jax.device_get`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["Row", "array_type", "fetch", "to_host"]


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
    transfers: device scalars stacked on the device, one transfer per dtype;
    each stacked array of a fused call fetched once and sliced on the host; the
    rest through `to_host`. A group comes back as one numpy array when its parts
    share a dtype (appended in bulk), else as a list."""
    array_impl = _ARRAY_IMPL
    if array_impl is None and any(isinstance(g[0], jax.Array) for g in groups):
        array_impl = _array_impl()  # an array exists: the backend is up already
    scalars: dict[Any, list[Any]] = {}  # dtype -> device scalars
    stacked: dict[int, Any] = {}  # id -> a fused call's stacked array
    others: list[Any] = []
    plans = []
    for values in groups:
        first = values[0]
        dtype = getattr(first, "dtype", None)
        if (
            type(first) is array_impl
            and first.ndim == 0
            and first.dtype.kind in "iuf"
            and all(type(v) is array_impl and v.dtype == dtype for v in values)
        ):  # the common column: device scalars (a shape mismatch is caught below)
            bucket = scalars.setdefault(dtype, [])
            plans.append([["scalar", dtype, len(bucket), len(values)]])
            bucket.extend(values)
            continue
        plan: list[list[Any]] = []  # [kind, source, start, count] runs
        for v in values:
            kind = type(v)
            if kind is Row:
                source, start = v.stacked, v.index
                stacked.setdefault(id(source), source)
            elif kind is array_impl and v.ndim == 0 and v.dtype.kind in "iuf":
                kind, source = "scalar", v.dtype
                bucket = scalars.setdefault(source, [])
                start = len(bucket)
                bucket.append(v)
            else:
                kind, source, start = "other", None, len(others)
                others.append(v)
            last = plan[-1] if plan else None
            if (
                last is not None
                and last[0] is kind
                and last[1] is source
                and last[2] + last[3] == start
            ):
                last[3] += 1
            else:
                plan.append([kind, source, start, 1])
        plans.append(plan)
    host: dict[Any, Any] = {}
    for dtype, values in scalars.items():
        host[dtype] = _stacked_scalars(values)
    if stacked:
        fetched = jax.device_get(list(stacked.values()))
        host.update(zip(stacked, map(np.asarray, fetched)))
    others = to_host(others) if others else others
    out: list[Any] = []
    for plan in plans:
        parts = []
        for kind, source, start, count in plan:
            if kind == "other":
                parts.append(others[start : start + count])
            else:
                key = source if kind == "scalar" else id(source)
                parts.append(host[key][start : start + count])
        arrays = all(isinstance(p, np.ndarray) for p in parts)
        if arrays and len({p.dtype for p in parts}) == 1:
            out.append(parts[0] if len(parts) == 1 else np.concatenate(parts))
        else:
            out.append([v for p in parts for v in p])
    return out


def _stacked_scalars(values: list[jax.Array]) -> np.ndarray | list[Any]:
    """Device scalars of one dtype on the host, stacked on the device first (one
    transfer); scalars on different devices are fetched each."""
    size = 1 << (len(values) - 1).bit_length()  # few shapes, few compiles
    try:
        stacked = _stack(*values, *[values[0]] * (size - len(values)))
    except (TypeError, ValueError):  # not all scalars, or on different devices
        return to_host(values)
    return np.asarray(jax.device_get(stacked))[: len(values)]


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
