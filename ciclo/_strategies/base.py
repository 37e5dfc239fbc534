"""The `Strategy` protocol: how a managed step is placed, compiled and reduced.

A strategy moves a state onto its devices (`from_host`) and back (`to_host`), places
each batch (`lift_batch`), compiles a step `fn(state, batch, elapsed) -> (logs,
state)` (`compile`), averages trees across devices inside the compiled step (`mean`,
used for gradients and batch statistics), reduces the logs inside it (`reduce_logs`)
and finishes them after the call (`lower_logs`). Strategies act per log collection,
never per entry name. Subclass `Strategy` and override what differs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from ciclo._logs import Logs

__all__ = ["Strategy", "compute_stateful_metrics", "is_stateful_metric"]

Step = Callable[[Any, Any, Any], tuple[Logs, Any]]


class Strategy:
    """Base strategy: one device, no compilation; every hook is the identity.

    Attributes:
        name: the name it is registered under.
        donate: whether training steps donate the incoming state's buffers.
        max_in_flight: at most this many calls of one managed step may be queued
            on the devices before the next call waits for the oldest (None: no
            bound). A bound keeps async dispatch's overlap while capping the memory
            of queued batches, and avoids stalls of cross-process collectives.

    Example:
        >>> import ciclo, jax
        >>> class Traced(ciclo.Strategy):
        ...     def compile(self, fn, *, donate=False):
        ...         return jax.jit(fn)
        >>> ciclo.register_strategy("my_jit", Traced("my_jit"), overwrite=True)
        >>> ciclo.get_strategy("my_jit").name
        'my_jit'
    """

    def __init__(self, name: str, *, donate: bool = False):
        if not isinstance(name, str) or not name:
            raise TypeError(f"A strategy name must be a non-empty str, got {name!r}.")
        self.name = name
        self.donate = donate

    max_in_flight: int | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    def from_host(self, state: Any) -> Any:
        """Places a host (single-device) state for this strategy."""
        return state

    def to_host(self, state: Any) -> Any:
        """Brings a state of this strategy back to a single local device."""
        return state

    def lift_batch(self, batch: Any) -> Any:
        """Places a batch (split or shard it across devices)."""
        return batch

    def compile(self, fn: Step, *, donate: bool = False) -> Step:
        """Returns the compiled `fn(state, batch, elapsed) -> (logs, state)`.

        `donate` is True for training steps of a donating strategy: the incoming
        state's buffers may be reused. Evaluation steps (`managed.step`) are never
        compiled with donation, since their input state is usually kept (a test
        loop inside `train_loop` discards the state it ran on).
        """
        return fn

    def mean(self, tree: Any) -> Any:
        """Inside the compiled step: averages `tree` across devices."""
        return tree

    def reduce_logs(self, logs: Logs) -> Logs:
        """Inside the compiled step: reduces logs across devices.

        The default replaces stateful metrics by their computed value.
        """
        return compute_stateful_metrics(logs)

    def lower_logs(self, logs: Logs) -> Logs:
        """After the compiled call: gives the logs their single-host form."""
        return logs


def is_stateful_metric(value: Any) -> bool:
    """Whether `value` is an accumulated metric (a `clu.metrics.Metric`, duck-typed).

    Example:
        >>> is_stateful_metric(1.0)
        False
    """
    return all(
        callable(getattr(value, m, None)) for m in ("merge", "reduce", "compute")
    )


def compute_stateful_metrics(
    logs: Logs, merge: Callable[[Any], Any] | None = None
) -> Logs:
    """Replaces every stateful-metric entry by its `.compute()` value.

    Args:
        logs: the logs of a step.
        merge: applied to each metric object first (e.g. merging across devices).

    Returns:
        New `Logs` holding arrays only.
    """
    out = Logs()
    for collection, name, value in logs.entries():
        if is_stateful_metric(value):
            value = (merge(value) if merge is not None else value).compute()
        out.add_entry(collection, name, value)
    return out


def tree_is_key(x: Any) -> bool:
    """Whether a leaf is an array of typed PRNG keys (`jax.random.key`)."""
    dtype = getattr(x, "dtype", None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)
