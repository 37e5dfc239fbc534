"""Training time: `Elapsed` (where the loop is) and `elapse` (iterating a dataset
with it). The points it is compared with are `Period`s (`ciclo._period`); what a
batch counts as is `ciclo._input.batch`'s."""

from __future__ import annotations

import contextlib
import dataclasses
import numbers
import operator
import time as _time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import jax

from ciclo._input.batch import Steps, batch_size
from ciclo._period import Period, any_field, as_period, check_amount
from ciclo._short import short

__all__ = ["Elapsed", "elapse", "new_elapsed"]


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

        Raises:
            TypeError: for a `steps` or `samples` that is not an int.
            ValueError: for a negative one.

        Example:
            >>> import ciclo
            >>> ciclo.Elapsed.create(steps=5).steps
            5
        """
        steps = check_amount("Elapsed.create", "steps", steps, positive=False)
        samples = check_amount("Elapsed.create", "samples", samples, positive=False)
        now = _time.time()
        return new_elapsed(steps, samples, now, now)

    def to_dict(self) -> dict[str, Any]:
        """The fields as a dict (Ciclo 0.1's `to_dict`).

        Example:
            >>> import ciclo
            >>> sorted(ciclo.Elapsed.create(steps=2).to_dict())
            ['date', 'date_start', 'samples', 'steps', 'time']
        """
        return {
            "steps": self.steps,
            "samples": self.samples,
            "date": self.date,
            "date_start": self.date_start,
            "time": self.time,
        }

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
            return any_field(self, other, _STEPS_OPS[op])
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


# id -> (a weak reference to an `Elapsed` that counts every batch trained into
# its state, who handed it out); a checkpoint saved by hand recognises it
_COUNTED: dict[int, tuple[weakref.ref, str]] = {}


def mark_counted(elapsed: Elapsed, how: str) -> Elapsed:
    """Notes that `elapsed` counts its batches already (`how`: "the loop
    returned", ...): `ckpt(elapsed, state)` then records it as it is."""
    key = id(elapsed)
    with contextlib.suppress(TypeError):  # not weakly referable: not noted
        _COUNTED[key] = (weakref.ref(elapsed, lambda _: _COUNTED.pop(key, None)), how)
    return elapsed


def counted_by(elapsed: Any) -> str | None:
    """Who handed out `elapsed` as counting its batches (`mark_counted`), or None."""
    noted = _COUNTED.get(id(elapsed))
    return noted[1] if noted is not None and noted[0]() is elapsed else None


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
        TypeError: if `stop` is neither an int nor a `Period`, `initial` is not an
            `Elapsed`, `dataset` is not iterable, or `batch_size_fn` returns
            something that is not an int.

    Example:
        >>> import ciclo
        >>> for elapsed, batch in ciclo.elapse([[1, 2], [3, 4]], stop=1):
        ...     print(elapsed.steps, batch)
        0 [1, 2]
    """
    stop_period = None if stop is None else as_period(stop, "stop")
    if initial is not None and not isinstance(initial, Elapsed):
        raise TypeError(
            f"ciclo.elapse: `initial` must be a ciclo.Elapsed (e.g. a restored "
            f"checkpoint's), got {short(initial)} ({type(initial).__name__}); to start "
            f"counting at step n use initial=ciclo.Elapsed.create(steps=n)."
        )
    try:
        iterator = iter(dataset)
    except TypeError:
        raise TypeError(
            f"ciclo.elapse: `dataset` must be iterable (a list, generator, numpy "
            f"array, data loader, ...), got {type(dataset).__name__}: "
            f"{dataset!r:.60}."
        ) from None
    elapsed = Elapsed.create() if initial is None else initial.resume()
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
