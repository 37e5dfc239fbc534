"""Aggregation of logged values: the modes, the spec that picks one per entry, and
the two ways of applying a mode — to a list of host values (`inner_loop`, from a
history) and as a running accumulator of device values (`train_loop`'s
`epoch_logs`, with no per-step host sync).

A spec is a mode name (`"last" | "first" | "mean" | "weighted_mean" | "sum" |
"min" | "max" | "std" | "concat"`), a function of the list of values, or a dict
from `"collection.entry"`, `"entry"` or `"collection"` to one of those. For an
entry, the most specific key wins: `"collection.entry"`, then `"entry"`, then the
mode the step declared when it logged the entry (`logs.add_metric(name, value,
aggregation="max")`), then `"collection"`, then the spec's default.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ciclo._short import short

__all__ = ["AGGREGATIONS", "Running", "Spec", "check_aggregation"]


def _stack(values: list[Any]) -> np.ndarray:
    return np.stack([np.asarray(v) for v in values])


def weighted_mean(values: list[Any], weights: list[float] | None = None) -> Any:
    """The mean of `values` weighted by `weights` (e.g. batch sizes), element-wise.

    A value of weight 0 counts for nothing, a NaN in it too (a batch that is all
    padding, whose own mean is 0/0); a NaN of a value with a non-zero weight
    propagates. When no weight is positive (none known, e.g. only `on_end`
    logged, or every batch all padding), the plain mean of the values.

    Example:
        >>> import numpy as np
        >>> from ciclo.callbacks._aggregation import weighted_mean
        >>> float(weighted_mean([1.0, np.nan, 4.0], [1, 0, 2]))
        3.0
        >>> float(weighted_mean([1.0, 3.0], [0, 0]))
        2.0
    """
    stacked = _stack(values)
    if weights is None:
        return stacked.mean(axis=0)
    w = np.asarray(weights, dtype=np.float64)
    if not w.sum() > 0:  # no batch sizes known (e.g. only on_end logged it)
        return stacked.mean(axis=0)
    w = w.reshape((-1,) + (1,) * (stacked.ndim - 1))
    # masked before the product: 0 * NaN (or inf) would be NaN
    mean = (np.where(w == 0, 0, stacked) * w).sum(axis=0) / w.sum()
    if np.issubdtype(stacked.dtype, np.floating):
        mean = mean.astype(stacked.dtype)
    return mean


# Each mode applied to the list of an entry's values (host numbers or arrays).
AGGREGATIONS: dict[str, Callable[..., Any]] = {
    "last": lambda values: values[-1],
    "first": lambda values: values[0],
    "mean": lambda values: _stack(values).mean(axis=0),
    "weighted_mean": weighted_mean,
    "sum": lambda values: _stack(values).sum(axis=0),
    "min": lambda values: _stack(values).min(axis=0),
    "max": lambda values: _stack(values).max(axis=0),
    "std": lambda values: _stack(values).std(axis=0),
    "concat": lambda values: np.concatenate([np.atleast_1d(v) for v in values]),
}
# `ciclo._logs.MODES` (what a step may declare) lists the same names.

# The reductions that stack the values (they need equal shapes), by function.
REDUCTIONS = {
    AGGREGATIONS[n]: n for n in ("mean", "weighted_mean", "sum", "min", "max", "std")
}

Aggregation = str | Callable[[list[Any]], Any]


def check_aggregation(value: Any, where: str) -> Aggregation:
    """`value` if it is a mode name or a function; else a clear error."""
    if isinstance(value, str):
        if value not in AGGREGATIONS:
            raise ValueError(
                f"{where}: unknown aggregation {value!r}; expected one of "
                f"{list(AGGREGATIONS)}, a function of the list of values, or a dict "
                f"collection or entry -> aggregation."
            )
        return value
    if callable(value):
        return value
    raise TypeError(
        f"{where}: an aggregation must be one of {list(AGGREGATIONS)}, a function "
        f"of the list of values, or a dict collection or entry -> aggregation; got "
        f"{short(value)} ({type(value).__name__})."
    )


class Spec:
    """An aggregation spec (see the module docstring), validated once.

    Example:
        >>> from ciclo.callbacks._aggregation import Spec
        >>> spec = Spec({"metrics": "max", "loss": "sum"}, "epoch_logs", "mean")
        >>> spec.mode("losses", "loss"), spec.mode("metrics", "acc")
        ('sum', 'max')
        >>> spec.mode("metrics", "acc", declared="min"), spec.mode("losses", "aux")
        ('min', 'mean')
    """

    def __init__(self, spec: Any, where: str, default: Aggregation = "last"):
        self.default = default
        self.per_key: dict[str, Aggregation] = {}
        if isinstance(spec, Mapping):
            for key, mode in spec.items():
                if not isinstance(key, str):
                    raise TypeError(
                        f"{where}: the keys of an aggregation dict must be "
                        f"collection or entry names, got {short(key)}."
                    )
                self.per_key[key] = check_aggregation(mode, f"{where}[{key!r}]")
        elif spec is not None:
            self.default = check_aggregation(spec, where)

    def mode(
        self, collection: str, entry: str, declared: str | None = None
    ) -> Aggregation:
        """The aggregation of `collection.entry` (`declared`: the step's own)."""
        per_key = self.per_key
        for key in (f"{collection}.{entry}", entry):
            if key in per_key:
                return per_key[key]
        if declared is not None:
            return declared
        return per_key.get(collection, self.default)

    def names(self, collection: str, entry: str) -> bool:
        """Whether a dict key names this entry or its collection."""
        per_key = self.per_key
        return (
            f"{collection}.{entry}" in per_key
            or entry in per_key
            or (collection in per_key)
        )


def _lib(*values: Any) -> Any:
    """jnp if any value is a device array (the op then runs on the device,
    asynchronously), else numpy (host numbers stay on the host)."""
    return jnp if any(isinstance(v, jax.Array) for v in values) else np


class Running:
    """One entry's aggregation over a stream of values, kept on the device.

    `add(value, size)` costs a device op or two (no sync) for `"sum"`, `"mean"`,
    `"weighted_mean"` (by `size`, a host number: a value of size 0 counts for
    nothing, a NaN in it too, unless every size is 0 — then the plain mean, as
    `weighted_mean`), `"min"`, `"max"` and `"std"` (shifted sums);
    `"first"` and `"last"` keep one value; `"concat"` and a function keep the
    values and combine them in `result()` (`jnp.concatenate` on the device; a
    function gets the list).

    Example:
        >>> import jax.numpy as jnp
        >>> from ciclo.callbacks._aggregation import Running
        >>> std = Running("std")
        >>> for v in (1.0, 2.0, 3.0, 4.0):
        ...     std.add(jnp.float32(v), 1)
        >>> round(float(std.result()), 4)
        1.118
    """

    __slots__ = (
        "count",
        "first",
        "mode",
        "size",
        "total",
        "total_sq",
        "unweighted",
        "values",
    )

    def __init__(self, mode: Aggregation):
        self.mode = mode
        self.count = 0
        self.size = 0
        self.first: Any = None
        self.total: Any = None
        self.total_sq: Any = None
        self.unweighted: Any = None  # weighted_mean: the sum of the size-0 values
        self.values: list[Any] = []

    def add(self, value: Any, size: int = 1) -> None:
        mode, count = self.mode, self.count
        self.count = count + 1
        if mode == "last" or (mode == "first" and count == 0):
            self.first = value
        elif mode in ("sum", "mean"):
            self.total = value if count == 0 else self.total + value
        elif mode == "weighted_mean":
            if size:
                weighted = value * size
                self.total = weighted if self.total is None else self.total + weighted
                self.size += size
            else:  # counts for nothing (0 * NaN would be NaN) unless all weigh 0
                self._add_unweighted(value)
        elif mode in ("min", "max"):
            if count == 0:
                self.total = value
            else:
                lib = _lib(value, self.total)
                pick = lib.minimum if mode == "min" else lib.maximum
                self.total = pick(self.total, value)
        elif mode == "std":  # sums of (value - first value): no cancellation
            if count == 0:
                self.first = value
                self.total = self.total_sq = value - value
            else:
                shifted = value - self.first
                self.total = self.total + shifted
                self.total_sq = self.total_sq + shifted * shifted
        elif mode != "first":  # "concat" or a function
            self.values.append(value)

    def add_rows(self, stacked: Any, size: int = 1) -> None:
        """Adds `n` values stacked on a leading axis (a fused call's per-step
        rows), each of `size` samples: reduced over that axis first (device ops),
        then added as `add` would, one by one."""
        mode, count = self.mode, self.count
        n = len(stacked)
        if n == 0:
            return
        lib = _lib(stacked)
        if mode == "last" or (mode == "first" and count == 0):
            self.first = stacked[-1] if mode == "last" else stacked[0]
        elif mode == "weighted_mean" and not size:  # as `add`: counts for nothing
            self._add_unweighted(stacked.sum(axis=0))
        elif mode in ("sum", "mean", "weighted_mean"):
            total = stacked.sum(axis=0) * (size if mode == "weighted_mean" else 1)
            self.total = total if self.total is None else self.total + total
            self.size += size * n
        elif mode in ("min", "max"):
            total = stacked.min(axis=0) if mode == "min" else stacked.max(axis=0)
            if count:
                pick = lib.minimum if mode == "min" else lib.maximum
                total = pick(self.total, total)
            self.total = total
        elif mode == "std":
            if count == 0:
                self.first = stacked[0]
                self.total = self.total_sq = self.first - self.first
            shifted = stacked - self.first
            self.total = self.total + shifted.sum(axis=0)
            self.total_sq = self.total_sq + (shifted * shifted).sum(axis=0)
        elif mode != "first":
            self.values.extend(stacked[i] for i in range(n))
        self.count = count + n

    def _add_unweighted(self, total: Any) -> None:
        unweighted = self.unweighted
        self.unweighted = total if unweighted is None else unweighted + total

    def result(self) -> Any:
        """The aggregate of the values added (None if none was)."""
        mode, count = self.mode, self.count
        if count == 0:
            return None
        if mode in ("last", "first"):
            return self.first
        if mode in ("sum", "min", "max"):
            return self.total
        if mode == "mean":
            return self.total / count
        if mode == "weighted_mean":
            if self.size > 0:
                return self.total / self.size
            return self.unweighted / count  # every value of size 0: the plain mean
        if mode == "std":
            mean = self.total / count
            lib = _lib(mean)
            return lib.sqrt(lib.maximum(self.total_sq / count - mean * mean, 0))
        if mode == "concat":
            lib = _lib(*self.values)
            return lib.concatenate([lib.atleast_1d(v) for v in self.values])
        return mode(self.values)
