"""Training time: `Elapsed` (where the loop is), `Period` (a point to reach), `elapse`."""

from __future__ import annotations

import dataclasses
import datetime
import math
import numbers
import operator
import time as _time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import jax

__all__ = ["Elapsed", "Period", "Steps", "at", "elapse", "short"]


def short(value: Any, limit: int = 100) -> str:
    """`value` for an error message, on one line: an array by its type, shape and
    dtype (never its multi-line repr), anything else by its repr cut at `limit`."""
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is not None and dtype is not None and not isinstance(value, type):
        return f"a {type(value).__name__} of shape {tuple(shape)} and dtype {dtype}"
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclasses.dataclass(frozen=True)
class Period:
    """A point in training time; reached when ANY of its given fields is reached.

    Build it with `ciclo.at`. `time` is seconds since the loop started (a
    `datetime.timedelta` is accepted), `date` is wall-clock seconds since the epoch
    (a `datetime.datetime` is accepted).

    Example:
        >>> import ciclo
        >>> p = ciclo.at(steps=100, time=60)
        >>> ciclo.Elapsed.create(steps=100) >= p
        True
    """

    steps: int | None = None
    samples: int | None = None
    time: float | None = None
    date: float | None = None
    _given: tuple = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self):
        if isinstance(self.time, datetime.timedelta):
            object.__setattr__(self, "time", self.time.total_seconds())
        if isinstance(self.date, datetime.datetime):
            object.__setattr__(self, "date", self.date.timestamp())
        if all(getattr(self, f) is None for f in ("steps", "samples", "time", "date")):
            raise ValueError(
                "A Period needs at least one of steps, samples, time or date; got none. "
                "Example: ciclo.at(steps=1000) or ciclo.at(time=3600)."
            )
        for name in ("steps", "samples"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise TypeError(
                    f"Period.{name} must be a non-negative int, got {value!r} "
                    f"({type(value).__name__})."
                )
            if value < 0:
                raise ValueError(f"Period.{name} must be non-negative, got {value}.")
            object.__setattr__(self, name, int(value))
        for name in ("time", "date"):
            value = getattr(self, name)
            if value is None:
                continue
            if (
                isinstance(value, bool)
                or not isinstance(value, numbers.Real)
                or not math.isfinite(value)
            ):
                raise TypeError(
                    f"Period.{name} must be a finite number of seconds, got {value!r} "
                    f"({type(value).__name__})."
                )
            if name == "time" and value < 0:
                raise ValueError(f"Period.time must be non-negative, got {value}.")
            if not isinstance(value, int | float):  # numpy scalars -> Python
                object.__setattr__(self, name, float(value))

        object.__setattr__(self, "_given", tuple(self.fields().items()))

    def fields(self) -> dict[str, float]:
        """The fields that were given, as a dict `name -> value`."""
        return {
            f: getattr(self, f)
            for f in ("steps", "samples", "time", "date")
            if getattr(self, f) is not None
        }

    @classmethod
    def create(
        cls,
        steps: int | None = None,
        *,
        samples: int | None = None,
        time: float | datetime.timedelta | None = None,
        date: float | datetime.datetime | None = None,
    ) -> Period:
        """Same as `ciclo.at(...)` (the original Ciclo's spelling).

        Example:
            >>> import ciclo
            >>> ciclo.Period.create(steps=10) == ciclo.at(10)
            True
        """
        return cls(steps=steps, samples=samples, time=time, date=date)

    def reached(self, elapsed: Elapsed) -> bool:
        """Whether `elapsed` reached this period in ANY given field (`elapsed >= self`).

        Example:
            >>> import ciclo
            >>> ciclo.at(steps=10, samples=100).reached(ciclo.Elapsed.create(samples=100))
            True
        """
        return _any(elapsed, self, operator.ge)


def at(
    steps: int | None = None,
    *,
    samples: int | None = None,
    time: float | datetime.timedelta | None = None,
    date: float | datetime.datetime | None = None,
) -> Period:
    """Creates a `Period`: a point in training time.

    Args:
        steps: number of batches consumed.
        samples: number of samples consumed.
        time: seconds since the loop started (or a `timedelta`).
        date: wall-clock time (seconds since the epoch or a `datetime`).

    Returns:
        A `Period`, reached when any of the given fields is reached.

    Raises:
        ValueError: if no field is given.

    Example:
        >>> import ciclo
        >>> ciclo.at(samples=50_000)
        Period(steps=None, samples=50000, time=None, date=None)
    """
    return Period(steps=steps, samples=samples, time=time, date=date)


def as_period(value: Any, argument: str) -> Period:
    """Converts an int (steps) or a `Period` to a `Period`; names `argument` on error."""
    if isinstance(value, Period):
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(
                f"`{argument}` must be >= 0 steps, got {int(value)}; pass a "
                f"non-negative int or a ciclo.Period, e.g. {argument}=100 or "
                f"{argument}=ciclo.at(samples=10_000)."
            )
        return Period(steps=int(value))
    raise TypeError(
        f"`{argument}` must be an int (steps) or a ciclo.Period such as "
        f"ciclo.at(samples=10_000); got {short(value)} ({type(value).__name__})."
    )


def _any(elapsed: Elapsed, period: Period, op: Callable[[Any, Any], bool]) -> bool:
    """True when `op(elapsed.<field>, period.<field>)` holds for ANY given field."""
    return any(op(getattr(elapsed, name), value) for name, value in period._given)


_STEPS_OPS = {"__lt__": operator.lt, "__le__": operator.le, "__gt__": operator.gt}
_STEPS_OPS.update({"__ge__": operator.ge, "__eq__": operator.eq, "__ne__": operator.ne})


@dataclasses.dataclass(frozen=True, eq=False)
class Elapsed:
    """Immutable record of training progress; a JAX pytree.

    Compared with a `Period` (`<`, `<=`, `>`, `>=`, `==`, `!=`), the result is True
    when ANY field given in the period satisfies the comparison; an int compares
    with `steps`. `later - earlier` is the progress between two records.

    Attributes:
        steps: batches consumed before the current one (starts at 0).
        samples: samples consumed before the current batch.
        date: wall-clock seconds since the epoch, updated as the loop runs.
        date_start: wall-clock seconds when counting started.
        time: `date - date_start`, seconds of training (a leaf of its own, so it
            stays precise inside `jax.jit` where floats are 32-bit).

    Example:
        >>> import ciclo
        >>> e = ciclo.Elapsed.create()
        >>> e = e.update(batch_size=32)
        >>> (e.steps, e.samples), e >= ciclo.at(samples=32), e == ciclo.at(steps=2)
        ((1, 32), True, False)
    """

    steps: int
    samples: int
    date: float
    date_start: float
    time: float = dataclasses.field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "time", self.date - self.date_start)

    @classmethod
    def create(cls, steps: int = 0, samples: int = 0) -> Elapsed:
        """Starts counting now from `steps` and `samples`.

        Example:
            >>> import ciclo
            >>> ciclo.Elapsed.create(steps=5).steps
            5
        """
        now = _time.time()
        return new_elapsed(steps, samples, now, now)

    def update(self, batch_size: int, steps: int = 1) -> Elapsed:
        """Returns the elapsed after consuming one more batch of `batch_size`
        samples (`steps` steps: more than one for a fused `Steps` batch)."""
        return new_elapsed(
            self.steps + steps, self.samples + batch_size, _time.time(), self.date_start
        )

    def update_time(self) -> Elapsed:
        """Returns the same progress with `date` set to now."""
        return new_elapsed(self.steps, self.samples, _time.time(), self.date_start)

    def resume(self) -> Elapsed:
        """Restarts the clock now, keeping `steps`, `samples` and `time` (for resuming)."""
        now = _time.time()
        return new_elapsed(self.steps, self.samples, now, now - float(self.time))

    def __sub__(self, other: Elapsed) -> Elapsed:
        """The progress from `other` to `self`: steps, samples and time differences.

        Example:
            >>> import ciclo
            >>> a = ciclo.Elapsed.create(steps=2, samples=64)
            >>> b = a.update(32).update(32)
            >>> (b - a).steps, (b - a).samples
            (2, 64)
        """
        if not isinstance(other, Elapsed):
            return NotImplemented
        time = float(self.time) - float(other.time)
        return new_elapsed(
            self.steps - other.steps,
            self.samples - other.samples,
            self.date,
            self.date - time,
        )

    def _compare(self, other: Any, op: str) -> bool:
        if isinstance(other, Period):
            return _any(self, other, _STEPS_OPS[op])
        if isinstance(other, numbers.Integral) and not isinstance(other, bool):
            return _STEPS_OPS[op](self.steps, other)
        return NotImplemented

    def __ge__(self, other: Period | int) -> bool:
        return self._compare(other, "__ge__")

    def __gt__(self, other: Period | int) -> bool:
        return self._compare(other, "__gt__")

    def __le__(self, other: Period | int) -> bool:
        return self._compare(other, "__le__")

    def __lt__(self, other: Period | int) -> bool:
        return self._compare(other, "__lt__")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Elapsed):
            return (self.steps, self.samples, self.date, self.date_start) == (
                other.steps,
                other.samples,
                other.date,
                other.date_start,
            )
        return self._compare(other, "__eq__")

    def __ne__(self, other: object) -> bool:
        result = self.__eq__(other)
        if isinstance(other, Period):
            return self._compare(other, "__ne__")
        return result if result is NotImplemented else not result

    def __hash__(self) -> int:
        return hash((self.steps, self.samples, self.date, self.date_start))


def new_elapsed(steps: int, samples: int, date: float, date_start: float) -> Elapsed:
    """Builds an `Elapsed` without the dataclass machinery (the loop's hot path)."""
    e = object.__new__(Elapsed)
    d = e.__dict__
    d["steps"], d["samples"], d["date"], d["date_start"] = (
        steps,
        samples,
        date,
        date_start,
    )
    d["time"] = date - date_start
    return e


def _flatten_elapsed(e: Elapsed):
    children = (e.steps, e.samples, e.date, e.date_start, e.time)
    keys = ("steps", "samples", "date", "date_start", "time")
    return tuple(zip(map(jax.tree_util.GetAttrKey, keys), children)), None


def _unflatten_elapsed(_, children) -> Elapsed:
    e = object.__new__(Elapsed)
    for name, value in zip(
        ("steps", "samples", "date", "date_start", "time"), children
    ):
        object.__setattr__(e, name, value)
    return e


jax.tree_util.register_pytree_with_keys(Elapsed, _flatten_elapsed, _unflatten_elapsed)


class Steps:
    """A batch that counts as `n` steps: `n` batches stacked on a new leading axis.

    The loop recognises it (the one hook of fused execution): `elapsed_after`
    advances by `n` steps and `samples` samples, so `elapsed` keeps counting real
    steps. A step that understands it (a managed step, see
    `managed.train_step(steps_per_call=...)`) runs the `n` steps in one compiled
    call and may leave one log row per step in `rows` (a `Logs` whose values have a
    leading axis of `n`, the last step's included); the loop then commits `n`
    history rows, at steps `elapsed.steps + i` and samples
    `elapsed.samples + i * samples // n`, the last row also holding the call's
    other logs. Without `rows`, the call's logs are committed once, at the
    `elapsed` before the call. `ciclo.fuse` (and `steps_per_call=` of the loops)
    builds them from any dataset.

    Attributes:
        batch: the stacked batch; every leaf has shape `(n, batch_size, ...)`.
        n: the number of steps it counts as.
        samples: the samples of all `n` batches.
        rows: per-step logs left by the step for the history (None: none).

    Example:
        >>> import ciclo, numpy as np
        >>> fused = ciclo.Steps(np.zeros((4, 32, 3)), n=4, samples=128)
        >>> elapsed = ciclo.Elapsed.create().update(fused.samples, steps=fused.n)
        >>> elapsed.steps, elapsed.samples
        (4, 128)
    """

    __slots__ = ("batch", "n", "rows", "samples")

    def __init__(self, batch: Any, n: int, samples: int):
        self.batch, self.n, self.samples = batch, int(n), int(samples)
        self.rows = None

    def __repr__(self) -> str:
        return f"Steps(n={self.n}, samples={self.samples})"


def _leaves(batch: Any) -> list[Any]:
    """Leaves of a batch, looking inside dataclasses that are not registered pytrees."""
    common = type(batch) is tuple or type(batch) is list  # (x, y): no flatten
    if common and all(hasattr(leaf, "shape") for leaf in batch):
        return list(batch)
    out = []
    for leaf in jax.tree.leaves(batch):
        if dataclasses.is_dataclass(leaf) and not isinstance(leaf, type):
            out.extend(
                _leaves([getattr(leaf, f.name) for f in dataclasses.fields(leaf)])
            )
        else:
            out.append(leaf)
    return out


def batch_shapes(batch: Any) -> list[tuple[int, ...]]:
    """The shape of every leaf of `batch` (`()` for a leaf without a shape)."""
    return [tuple(getattr(leaf, "shape", ())) for leaf in _leaves(batch)]


def batch_size(
    batch: Any, batch_size_fn: Callable[[list[tuple[int, ...]]], int] | None = None
) -> int:
    """The number of samples in `batch`: the largest first axis among its leaves.

    A batch whose leaves have no shape (Python scalars, strings) counts as 1.
    `batch_size_fn`, when given, receives the list of leaf shapes and decides.
    """
    if batch_size_fn is not None:
        return int(batch_size_fn(batch_shapes(batch)))
    size = 0
    kind = type(batch)
    if kind is tuple or kind is list or kind is dict:  # (x, y), {"x": x}: no flatten
        for leaf in batch.values() if kind is dict else batch:
            shape = getattr(leaf, "shape", None)
            if shape is None:  # nested: the general path below
                size = 0
                break
            if shape and shape[0] > size:
                size = shape[0]
        else:
            return int(size) if size else 1
    for leaf in _leaves(batch):
        shape = getattr(leaf, "shape", None)
        if shape and shape[0] > size:
            size = shape[0]
    return int(size) if size else 1


def elapse(
    dataset: Iterable[Any],
    stop: int | Period | None = None,
    initial: Elapsed | None = None,
    batch_size_fn: Callable[[Sequence[tuple[int, ...]]], int] | None = None,
) -> Iterator[tuple[Elapsed, Any]]:
    """Iterates `(elapsed, batch)` over any iterable of batches.

    `elapsed` counts what was consumed BEFORE the batch it comes with. Iteration
    ends when `elapsed >= stop` (checked before pulling the next batch, so no batch
    is drawn and dropped) or when the dataset is exhausted.

    Args:
        dataset: any iterable (list, generator, numpy array, tf.data, Grain, ...).
        stop: an int (steps) or a `Period`.
        initial: an `Elapsed` to continue from (e.g. a restored checkpoint's); its
            clock restarts now keeping its `time`.
        batch_size_fn: given the list of leaf shapes of a batch, returns its size.

    Yields:
        `(elapsed, batch)` pairs.

    Raises:
        TypeError: if `stop` is neither an int nor a `Period`.

    Example:
        >>> import ciclo
        >>> for elapsed, batch in ciclo.elapse([[1, 2], [3, 4]], stop=1):
        ...     print(elapsed.steps, batch)
        0 [1, 2]
    """
    stop_period = None if stop is None else as_period(stop, "stop")
    elapsed = Elapsed.create() if initial is None else initial.resume()
    iterator = iter(dataset)
    while stop_period is None or not elapsed >= stop_period:
        try:
            batch = next(iterator)
        except StopIteration:
            return
        yield elapsed, batch
        if type(batch) is Steps:
            elapsed = elapsed.update(batch.samples, steps=batch.n)
        else:
            elapsed = elapsed.update(batch_size(batch, batch_size_fn))
