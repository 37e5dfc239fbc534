"""The `Strategy` protocol: where a managed step's data lives and how it is run.

A strategy does four things, and never looks at log names:

- `place_state(state)`: moves a host (single-device) state to the strategy's
  devices (replicated, sharded, ...); `to_host(state)` brings it back.
- `place_batch(batch)`: places one batch (split or sharded across devices);
  `place_steps(batch)` a fused one, `(steps, batch, ...)` (see `steps_major`).
- `wrap(fn, *, donate)`: turns `fn(state, batch, elapsed) -> (logs, state)` into
  the function that runs it (compiled, mapped over devices, ...). Every leaf of the
  logs it returns must be readable by the calling process. `wrap_steps` does the
  same for a fused call (by default: `wrap`).

A `ManagedState` carries its strategy object; a registered strategy equals the
names it is registered under (see `Strategy`).

Collectives happen inside the step through `strategy.collectives` (a
`Collectives`: `mean`, `merge` and `concat` across the devices the step runs on;
the identity when the step is one program over the whole batch). The managed steps
decide which one each log collection gets (losses and metrics: `mean`; stateful
metrics: `merge`, then `.compute()`; outputs: `concat`) and that gradients and
`batch_stats` are averaged; a strategy only says how to do it on its devices.

`lift_batch_size(batch_size)` gives the global batch size for a per-device one.
Subclass `Strategy` and override what differs; register it with
`ciclo.register_strategy`.
"""

from __future__ import annotations

import copyreg
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from ciclo._logs import Logs
from ciclo._short import short

__all__ = ["Collectives", "Strategy", "is_stateful_metric", "tree_is_key"]

Step = Callable[[Any, Any, Any], tuple[Logs, Any]]


class Collectives:
    """Cross-device operations a step calls inside `Strategy.wrap` (here: identity).

    The base class is right for any strategy that runs a step as one program over
    the whole batch (`eager`, `jit`, `sharded`): there is nothing to combine.
    `axis_name` is the mapped axis of the step (None when there is none), for
    code that needs its own collectives (e.g. `nn.BatchNorm(axis_name=...)`).

    Example:
        >>> from ciclo._strategies.base import Collectives
        >>> Collectives().mean({"g": 1.0})
        {'g': 1.0}
    """

    axis_name: str | None = None

    def mean(self, tree: Any) -> Any:
        """Averages every leaf of `tree` across devices."""
        return tree

    def reduce(self, tree: Any, mode: str) -> Any:
        """Combines every leaf of `tree` across devices as an entry's declared
        aggregation `mode` says: `"sum"`, `"min"` or `"max"` over the devices;
        any other mode averages (`mean`). Here: as `mean` (one program)."""
        return self.mean(tree)

    def weighted_mean(self, tree: Any, weight: Any) -> Any:
        """Averages every leaf of `tree` across devices, each device's value
        weighted by its `weight` (its slice's total sample weight). Here: as
        `mean` (one program: the value is the whole batch's already)."""
        return self.mean(tree)

    def merge(self, metric: Any) -> Any:
        """Merges a stateful metric (anything with `merge`/`reduce`) across devices."""
        return metric

    def concat(self, tree: Any) -> Any:
        """Concatenates every leaf across devices along its first axis (per-sample
        values), so the result holds the rows of the whole batch."""
        return tree


class Strategy:
    """How a managed step runs: one device, no compilation; every hook the identity.

    Args:
        name: a default name (used by `ManagedState.create(strategy=obj)` when the
            object is not registered yet). Optional.
        donate: whether training steps donate the incoming state's buffers.

    A state carries its strategy object (`ManagedState.strategy`); names are a
    shorthand resolved at `create`. A strategy equals each name it is registered
    under (`state.strategy == "jit"`) and hashes as its own `name`; two strategies
    are equal only if they are the same object. A copy (`copy.deepcopy`) or pickle
    of a registered strategy is the registered object.

    Attributes:
        name: the name given (never changed by `register_strategy`).
        donate: see above.
        collectives: the `Collectives` a step uses inside `wrap`.
        max_in_flight: at most this many calls of one managed step may be queued
            on the devices before the next call waits for the oldest (None: no
            bound). A bound keeps async dispatch's overlap while capping the memory
            of queued batches, and avoids stalls of cross-process collectives.

    Example:
        >>> import ciclo, jax
        >>> class MyJit(ciclo.Strategy):
        ...     def wrap(self, fn, *, donate=False):
        ...         return jax.jit(fn, donate_argnums=(0,) if donate else ())
        >>> ciclo.register_strategy("my_jit", MyJit(), overwrite=True)
        >>> ciclo.get_strategy("my_jit")
        MyJit()
    """

    collectives: Collectives = Collectives()
    max_in_flight: int | None = None

    def __init__(self, name: str | None = None, *, donate: bool = False):
        if name is not None and (not isinstance(name, str) or not name):
            raise TypeError(
                f"A strategy name must be a non-empty str or None, got {short(name)}; "
                f"e.g. Strategy('my_strategy')."
            )
        self.name = name
        self.donate = donate

    def __repr__(self) -> str:
        name = "" if self.name is None else repr(self.name)
        return f"{type(self).__name__}({name})"

    # equality with names, hash, copies and pickles: see the class docstring
    # (code that compares `state.strategy` with a name keeps working)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            from ciclo._strategies.registry import lookup

            return lookup(other) is self
        return NotImplemented

    def __hash__(self) -> int:
        return object.__hash__(self) if self.name is None else hash(self.name)

    def __copy__(self) -> Strategy:
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new

    def __deepcopy__(self, memo: dict[int, Any]) -> Strategy:
        return self  # configuration and compiled-call caches: shared, not copied

    def __reduce__(self) -> Any:
        from ciclo._strategies.registry import get_strategy, lookup

        if self.name is not None and lookup(self.name) is self:
            return get_strategy, (self.name,)  # by name, like a function
        return copyreg.__newobj__, (type(self),), self.__dict__

    def place_state(self, state: Any) -> Any:
        """Places a host (single-device) state for this strategy."""
        return state

    def to_host(self, state: Any) -> Any:
        """Brings a state of this strategy back to a single local device."""
        return state

    def place_batch(self, batch: Any) -> Any:
        """Places a batch (e.g. splits or shards it across devices)."""
        return batch

    @property
    def steps_major(self) -> bool:
        """Whether `place_steps` keeps a fused batch's `(steps, batch, ...)`
        layout: a strategy that places batches as they are (`jit`, `eager`) does;
        one that overrides `place_batch` but not `place_steps` does not."""
        return type(self).place_batch is Strategy.place_batch

    def place_steps(self, batch: Any) -> Any:
        """Places a fused batch, each leaf `(steps, batch, ...)`, for the fused
        call: by default the layout `place_batch` takes, batch-major `(batch,
        steps, ...)` (swapped back inside the call), unless the strategy places
        batches as they are; a strategy that can shard the batch axis in place
        overrides this and sets `steps_major = True`."""
        if type(self).place_batch is Strategy.place_batch:
            return batch
        return self.place_batch(jax.tree.map(_batch_major, batch))

    def wrap_steps(self, fn: Step, *, donate: bool = False) -> Step:
        """As `wrap`, for a fused call: `fn` takes the batch as `place_steps`
        placed it (`steps_major`: `(steps, batch, ...)`), which may need its own
        mapping (`data_parallel` maps the batch's axis 1). By default `wrap`."""
        return self.wrap(fn, donate=donate)

    def wrap(self, fn: Step, *, donate: bool = False) -> Step:
        """Returns the function that runs `fn(state, batch, elapsed) -> (logs,
        state)` under this strategy.

        `donate` is True for training steps of a donating strategy: the incoming
        state's buffers may be reused. Evaluation steps (`managed.step`) are never
        wrapped with donation, since their input state is usually kept. `batch`
        and `elapsed` may be None.
        """
        return fn

    def _batch_slices(self) -> int:
        """How many process-local slices make one global batch (what
        `place_batch` assembles): 1 when a process feeds whole batches. The loop
        counts `elapsed.samples` globally with it (`ciclo._input.stage`)."""
        return 1

    def lift_batch_size(self, batch_size: int) -> int:
        """The global batch size when each device gets `batch_size` samples.

        Example:
            >>> import ciclo
            >>> ciclo.get_strategy("jit").lift_batch_size(32)
            32
        """
        return batch_size


def _batch_major(x: Any) -> Any:
    """A fused leaf `(steps, batch, ...)` as `(batch, steps, ...)`."""
    if np.ndim(x) < 2:
        raise ValueError(
            f"Fused steps: a leaf of shape {np.shape(x)} has no batch axis (fused "
            f"leaves are (steps, batch, ...)); give every batch leaf a batch axis."
        )
    if isinstance(x, np.ndarray | np.generic):
        return np.swapaxes(x, 0, 1)
    return jax.numpy.swapaxes(x, 0, 1)


def is_stateful_metric(value: Any) -> bool:
    """Whether `value` is an accumulated metric (a `clu.metrics.Metric`, duck-typed).

    Example:
        >>> is_stateful_metric(1.0)
        False
    """
    return all(
        callable(getattr(value, m, None)) for m in ("merge", "reduce", "compute")
    )


def tree_is_key(x: Any) -> bool:
    """Whether a leaf is an array of typed PRNG keys (`jax.random.key`)."""
    dtype = getattr(x, "dtype", None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)
