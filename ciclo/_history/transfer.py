"""Device values to the host in few transfers: what `History` fetches lagged.

Device scalars are stacked on the device and fetched in one transfer per dtype (on
a CPU device, whose arrays are host memory, read where they are instead); a
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
import itertools
import operator
from collections.abc import Iterator
from itertools import repeat
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

try:  # the scope `jax.device_get` marks its own transfers explicit with
    from jax._src.config import explicit_device_get_scope as _explicit_scope
except ImportError:  # pragma: no cover - a jax that moved it
    _explicit_scope = None

__all__ = [
    "Row",
    "Stacked",
    "Transfer",
    "explicit",
    "fetch",
    "get",
    "now",
    "rows",
    "start",
]

_AVAL = operator.attrgetter("aval")
_DTYPE = operator.attrgetter("dtype")
_SHAPE = operator.attrgetter("shape")


def explicit() -> contextlib.AbstractContextManager:
    """A scope whose device-to-host transfers count as explicit, as those of
    `jax.device_get` do: for ciclo's deliberate fetches that go through other calls
    (`copy_to_host_async`, orbax's save). A jax without jax's scope: the fetch is
    allowed outright."""
    if _explicit_scope is not None:
        return _explicit_scope()
    return jax.transfer_guard_device_to_host("allow")  # pragma: no cover


class Row(tuple):
    """`(stacked, index)`: row `index` of a value stacked over the steps of a
    fused call (`Steps.rows`); the stacked array is fetched once for all its
    rows. A tuple, so that `rows` builds a call's rows without a Python call
    each."""

    __slots__ = ()


def rows(stacked: Any, n: int) -> Iterator[Row]:
    """The rows `0 .. n-1` of `stacked`, built in C (a fused call commits a row
    per step of each of its entries)."""
    return map(tuple.__new__, repeat(Row), zip(repeat(stacked), range(n)))


def fetch(
    groups: list[list[Any]], *, stack: bool = True
) -> list[np.ndarray | list[Any]]:
    """Each group of values (a column's pending values) on the host, with few
    transfers (see `start`); waits for the values to be computed.

    `stack=False` dispatches no computation: device scalars are copied each. A
    device runs its computations in order (jax's CPU client too), so a stack
    dispatched now is computed only after every step dispatched before it: a
    read of some rows that must not wait for the newest step (a flush up to a
    row) copies them as they are."""
    return (start(groups) if stack else _begin(groups, stack=False)).result()


def start(groups: list[list[Any]]) -> Transfer:
    """Starts bringing each group of values (a column's pending values) to the
    host, without waiting for the device: device scalars are stacked on the
    device, one array per dtype (a value in several groups or rows, by
    identity, is stacked once); each stacked array of a fused call is copied
    once; `Transfer.result()` slices them on the host. Anything else is copied
    as it is (`get`) when the result is read.

    jax's concrete array type is learnt here, per call, from the first value
    that is a `jax.Array` (a column may start with a fused call's `Row`): no
    state outlives the call."""
    stacked = _scalars(groups)
    return stacked if stacked is not None else _begin(groups, stack=True)


def _scalars(groups: list[list[Any]]) -> Stacked | InPlace | None:
    """`start`'s common case (unfused steps logging device scalars) in one pass:
    every value a device scalar of one dtype, none twice, stacked at once and
    split per group on the host; None for anything else (`_begin` plans it)."""
    first = groups[0][0] if groups and groups[0] else None
    if not isinstance(first, jax.Array):
        return None
    impl, aval = type(first), first.aval
    dtype = aval.dtype
    if aval.shape != () or dtype.kind not in "iuf":
        return None
    # checked with C-level loops over the values (no bytecode per value)
    values = list(itertools.chain.from_iterable(groups))
    if set(map(type, values)) != {impl}:
        return None
    avals = list(map(_AVAL, values))
    if set(map(_DTYPE, avals)) != {dtype} or set(map(_SHAPE, avals)) != {()}:
        return None
    if len(set(map(id, values))) != len(values):  # a value in two groups or rows
        return None
    sizes = list(map(len, groups))
    if _on_one_cpu(first, values[-1]):  # host memory: read in place (`InPlace`)
        return InPlace(groups, values, dtype, sizes)
    stacked = _stack_scalars(values)
    if type(stacked) is list:  # not stackable (e.g. on different devices)
        return None
    return Stacked(stacked, sizes)


def _begin(groups: list[list[Any]], *, stack: bool) -> Transfer:
    """`start`; `stack=False`: device scalars are not stacked (see `fetch`)."""
    array_impl: type | None = None
    scalars: dict[Any, tuple[list[Any], dict[int, int]]] = {}  # dtype -> values
    stacked: dict[int, Any] = {}  # id -> a fused call's stacked array
    others: list[Any] = []
    plans = []
    for values in groups:
        first = values[0]
        if array_impl is None and isinstance(first, jax.Array):
            array_impl = type(first)
        keys = list(map(id, values))
        distinct = dict(zip(keys, values))  # by identity, in order
        common = False
        if stack and type(first) is array_impl:
            aval = first.aval  # `.dtype`, `.ndim`: properties reading it
            dtype = aval.dtype
            if aval.shape == () and dtype.kind in "iuf":
                for v in distinct.values():  # a loop: no call per value
                    if type(v) is not array_impl or v.aval.dtype != dtype:
                        break
                else:
                    common = True
        if (
            common
        ):  # the common column: device scalars (a shape mismatch is caught later)
            bucket, seen = scalars.setdefault(dtype, ([], {}))
            first = len(bucket)
            if len(distinct) == len(keys) and seen.keys().isdisjoint(keys):
                # each value once, none in an earlier column: a slice of the stack
                bucket.extend(values)
                seen.update(zip(keys, range(first, first + len(keys))))
                plans.append([["scalar", dtype, slice(first, len(bucket))]])
                continue
            for key, value in distinct.items():
                if key not in seen:
                    seen[key] = len(bucket)
                    bucket.append(value)
            plans.append([["scalar", dtype, list(map(seen.__getitem__, keys))]])
            continue
        plan: list[list[Any]] = []  # [kind, source, indices] runs
        last = None  # the current run
        for v in values:
            kind = type(v)
            if kind is Row:  # a fused call's row: runs of one stacked array
                source, i = v
                if last is not None and last[1] is source:  # the run goes on
                    last[2].append(i)
                    continue
                stacked.setdefault(id(source), source)
            else:
                if array_impl is None and isinstance(v, jax.Array):
                    array_impl = kind
                aval = v.aval if stack and kind is array_impl else None
                if aval is not None and aval.shape == () and aval.dtype.kind in "iuf":
                    kind, source = "scalar", aval.dtype
                    bucket, seen = scalars.setdefault(source, ([], {}))
                    i = seen.get(id(v))
                    if i is None:
                        i = seen[id(v)] = len(bucket)
                        bucket.append(v)
                else:
                    kind, source, i = "other", None, len(others)
                    others.append(v)
            if last is not None and last[0] is kind and last[1] is source:
                last[2].append(i)
            else:
                last = [kind, source, [i]]
                plan.append(last)
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
        device = [
            v
            for value in (*host.values(), others)
            for v in (value if isinstance(value, list) else (value,))
            if isinstance(v, jax.Array)
        ]
        _prefetch(device)
        self._host, self._others, self._plans = host, others, plans
        self._device = device

    def ready(self) -> bool:
        """Whether every value is computed (so `result()` does not wait); a deleted
        or failed value counts as computed (reading it does not wait)."""
        for value in self._device:
            try:
                if not value.is_ready():
                    return False
            except Exception:
                continue
        return True

    def result(self) -> list[np.ndarray | list[Any]]:
        """Each group on the host: one numpy array when its parts share a dtype
        (appended in bulk), else a list."""
        # explicit transfers (allowed under jax.transfer_guard("disallow")) of
        # computed values: nothing is dispatched here (it would wait for every
        # step queued since); a list holds scalars that could not be stacked
        with explicit():  # as `jax.device_get` reads a computed array
            host = {
                key: np.asarray(value) if isinstance(value, jax.Array) else get(value)
                for key, value in self._host.items()
            }
        others = get(self._others) if self._others else self._others
        out: list[Any] = []
        for plan in self._plans:
            parts = []
            for kind, source, index in plan:
                if kind == "other":
                    parts.append([others[i] for i in index])
                else:
                    values = host[source if kind == "scalar" else id(source)]
                    # a slice (a run of the stack, in order) reads a list too
                    if type(index) is slice or isinstance(values, np.ndarray):
                        parts.append(values[index])
                    else:
                        parts.append([values[i] for i in index])
            arrays = all(isinstance(p, np.ndarray) for p in parts)
            if arrays and len({p.dtype for p in parts}) == 1:
                out.append(parts[0] if len(parts) == 1 else np.concatenate(parts))
            else:
                out.append([v for p in parts for v in p])
        return out


class Stacked:
    """`Transfer` for `_scalars`' case: one stacked array on its way to the host,
    `result()` its slices (one numpy array per group)."""

    __slots__ = ("_sizes", "_stacked")

    def __init__(self, stacked: jax.Array, sizes: list[int]):
        _prefetch((stacked,))  # as `Transfer` starts its copies
        self._stacked, self._sizes = stacked, sizes

    def ready(self) -> bool:
        """Whether the stack is computed (a failed one counts as computed)."""
        try:
            return self._stacked.is_ready()
        except Exception:
            return True

    def result(self) -> list[np.ndarray]:
        """Each group's values on the host, a numpy array each."""
        with explicit():
            host = np.asarray(self._stacked)
        out, at = [], 0
        for n in self._sizes:
            out.append(host[at : at + n])
            at += n
        return out


class InPlace:
    """`Transfer` for `_scalars`' case on a CPU device, whose arrays are host
    memory: nothing is dispatched or copied at the start; once the newest value
    is computed (a device runs its calls in order), `result()` reads them all
    where they are, through the buffer protocol, in one C-level pass (cheaper
    than a stack's call and its read)."""

    __slots__ = ("_dtype", "_groups", "_sizes", "_values")

    def __init__(self, groups: list[list[Any]], values: list[jax.Array], dtype, sizes):
        self._groups, self._values = groups, values
        self._dtype, self._sizes = dtype, sizes

    def ready(self) -> bool:
        """Whether the newest value is computed (a failed one counts as computed)."""
        try:
            return self._values[-1].is_ready()
        except Exception:
            return True

    def result(self) -> list[np.ndarray | list[Any]]:
        """Each group's values on the host, a numpy array each (each value
        copied as it is, `get`, when one cannot be read in place: a deleted
        array)."""
        values = self._values
        try:
            host = np.frombuffer(b"".join(values), self._dtype)
        except (TypeError, ValueError, BufferError):
            return _begin(self._groups, stack=False).result()
        if len(host) != len(values):
            return _begin(self._groups, stack=False).result()
        out, at = [], 0
        for n in self._sizes:
            out.append(host[at : at + n])
            at += n
        return out


def _on_one_cpu(first: jax.Array, last: jax.Array) -> bool:
    """Whether `first` and `last` are on one CPU device, the same (their
    buffers are host memory, which the buffer protocol reads; the values between
    them, computed before `last`, are ready when it is)."""
    device = getattr(first.sharding, "_device", None)  # a SingleDeviceSharding's
    return (
        device is not None
        and device.platform == "cpu"
        and getattr(last.sharding, "_device", None) is device
    )


def _prefetch(arrays: Any) -> None:
    """Starts the copies of `arrays` (jax arrays) to the host, as
    `jax.device_get` starts its own. Not for an array already in host memory
    (jax's CPU devices): reading it later is a view, and the copy would cost
    the loop's thread more than that read."""
    with explicit():
        for value in arrays:
            with contextlib.suppress(Exception):  # e.g. a deleted array
                if not _in_host_memory(value):
                    value.copy_to_host_async()


def _in_host_memory(array: jax.Array) -> bool:
    """Whether every device of `array` is a CPU device (its buffers are host
    memory)."""
    return all(device.platform == "cpu" for device in array.sharding.device_set)


def _stack_scalars(values: list[jax.Array]) -> jax.Array | list[Any]:
    """Device scalars of one dtype stacked on the device (not waited for); scalars
    on different devices as they are (each copied when read)."""
    size = 1 << (len(values) - 1).bit_length()  # few shapes, few compiles
    try:
        return _stack(*values, *[values[0]] * (size - len(values)))
    except (TypeError, ValueError):  # not all scalars, or on different devices
        return list(values)


def now(value: Any) -> Any:
    """One value on the host now, waiting for it (an explicit transfer): for the
    few reads that need the current step's value, such as an epoch-end monitor
    (`early_stopping`, a checkpoint's `monitor`). A failed value raises."""
    return jax.device_get(value)


def get(values: list[Any]) -> list[Any]:
    """`values` on the host, each copied as it is (`jax.device_get`: an explicit
    transfer, which waits for these values only and dispatches nothing); a value
    that cannot be read (a deleted, donated or failed array) becomes `None`."""
    try:
        return jax.device_get(list(values))
    except Exception:
        out = []
        for value in values:
            try:
                out.append(jax.device_get(value))
            except Exception:
                out.append(None)
        return out


@jax.jit
def _stack(*scalars: jax.Array) -> jax.Array:
    return jnp.stack(scalars)
