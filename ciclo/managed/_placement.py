"""How a managed step's arguments reach the device.

A batch is placed with the strategy, possibly ahead of its step by the loop
(`place_ahead`, for `ciclo._input.prefetch`); a fused batch `(steps, batch, ...)` is
placed by `Strategy.place_steps` (steps-major for the built-in strategies,
batch-major for a custom one that overrides only `place_batch`); `elapsed` goes
into a compiled step packed into two arrays.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from ciclo._entries import Entries
from ciclo._input.batch import Steps
from ciclo._logs import Logs, _new_logs
from ciclo._strategies.base import Strategy
from ciclo._time import Elapsed

__all__ = ["compiles", "pack", "place_ahead", "unpack", "unpacking"]

_INT = jax.dtypes.canonicalize_dtype(np.int64)
_FLOAT = jax.dtypes.canonicalize_dtype(np.float64)


def pack(elapsed: Elapsed, *ints: int) -> tuple[np.ndarray, np.ndarray]:
    """`elapsed` (and `ints`) as two arrays: two transfers into a compiled step
    instead of one per Python scalar (five for an `Elapsed`)."""
    return (
        np.array((elapsed.steps, elapsed.samples, *ints), _INT),
        np.array((elapsed.date, elapsed.date_start, elapsed.time), _FLOAT),
    )


def unpack(packed: tuple[Any, Any]) -> tuple[Elapsed, Any]:
    """Inside the step: the `Elapsed` of `pack` and its extra ints."""
    ints, floats = packed
    e = object.__new__(Elapsed)
    d = e.__dict__
    d["steps"], d["samples"] = ints[0], ints[1]
    d["date"], d["date_start"], d["time"] = floats[0], floats[1], floats[2]
    return e, ints[2:]


def unpacking(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn(state, batch, elapsed)` taking `elapsed` packed (`pack`) too."""

    def run(state, batch, elapsed):
        if type(elapsed) is tuple:
            elapsed = unpack(elapsed)[0]
        return fn(state, batch, elapsed)

    return run


def plain_logs(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn(state, batch, elapsed) -> (logs, state)` returning, when its logs are
    a `Logs` of `Entries` that declares no modes, the same logs as plain dicts:
    a compiled call builds plain dicts of its outputs in C++, a `Logs` through
    Python (its pytree's unflatten, per step). `as_logs` makes the `Logs` again
    on the host."""

    def run(state, batch, elapsed):
        logs, state = fn(state, batch, elapsed)
        if (
            type(logs) is Logs
            and not logs._aggregations
            and all(type(entries) is Entries for entries in logs.values())
        ):
            logs = {name: dict(entries) for name, entries in logs.items()}
        return logs, state

    return run


def as_logs(logs: Any) -> Any:
    """The `Logs` of a compiled call's plain-dict logs (`plain_logs`); anything
    else as it is."""
    if type(logs) is not dict:
        return logs
    out = _new_logs(Logs)
    for name, entries in logs.items():
        out[name] = Entries(entries)
    return out


def compiles(strategy: Strategy) -> bool:
    return type(strategy).wrap is not Strategy.wrap


def place_ahead(strategy: Strategy, batch: Any) -> Any:
    """`batch` placed for a managed step under `strategy`, as the step would place
    it (a fused `Steps`: its stacked batch, as `Strategy.place_steps` lays it
    out); on the device even for a strategy that leaves batches to `jit` (`jit`,
    `eager`). Used to place batches ahead of their step (`ciclo._input.prefetch`)."""
    as_is = type(strategy).place_batch is Strategy.place_batch
    if type(batch) is Steps:
        batch = batch.batch
        if not as_is:
            return strategy.place_steps(batch)
    elif not as_is:
        return strategy.place_batch(batch)
    # a transfer, never an executable: on an accelerator, executions and the input
    # copies they make are ordered on the device, so a compiled identity for batch
    # n+1 dispatched before step n would queue behind step n's predecessor and
    # delay it; `jax.device_put` of the whole tree is one call on the transfer
    # stream. (It costs the host more than a jitted call's implicit transfer:
    # ~184 against ~80 us on the H100 VM, which is why the automatic depth reads
    # ahead only batches large enough for their transfer to matter.) Explicit
    # placement: allowed under a transfer guard.
    with jax.transfer_guard_host_to_device("allow"):
        return jax.device_put(batch)
