"""`Period` and `ciclo.at`: a point in training time, reached when ANY of its
given fields (steps, samples, time, date) is reached by an `Elapsed`."""

from __future__ import annotations

import dataclasses
import datetime
import math
import numbers
import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ciclo._short import short

if TYPE_CHECKING:
    from ciclo._time import Elapsed

__all__ = ["Period", "any_field", "as_period", "at"]


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
                    f"Period.{name} must be a non-negative int, got {short(value)} "
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
                    f"Period.{name} must be a finite number of seconds, got {short(value)} "
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
        samples: int | None = None,
        time: float | datetime.timedelta | None = None,
        date: float | datetime.datetime | None = None,
    ) -> Period:
        """Same as `ciclo.at(...)` (the original Ciclo's spelling, whose fields
        may also be given by position: `Period.create(None, 100)`).

        Example:
            >>> import ciclo
            >>> ciclo.Period.create(steps=10) == ciclo.at(10)
            True
            >>> ciclo.Period.create(None, 100) == ciclo.at(samples=100)
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
        return any_field(elapsed, self, operator.ge)

    def _reached_at(self, counts: tuple[int, int, float, float]) -> bool:
        """`reached` for an `Elapsed` given as its fields `(steps, samples, date,
        date_start)` (the loop's `elapsed_after`, not built unless read)."""
        steps, samples, date, start = counts
        for name, value in self._given:
            if name == "steps":
                reached = steps >= value
            elif name == "samples":
                reached = samples >= value
            elif name == "time":
                reached = date - start >= value
            else:
                reached = date >= value
            if reached:
                return True
        return False


def check_amount(function: str, unit: str, value: Any, *, positive: bool) -> Any:
    """Validates an amount of `unit` given to `function`; returns it normalised.

    `steps` and `samples` must be ints; `time` a number of seconds or a `timedelta`
    (converted to seconds). Amounts are never negative, and not zero if `positive`.
    """
    where = f"ciclo.{function}({unit}=...)"
    if unit == "time":
        if isinstance(value, datetime.timedelta):
            value = value.total_seconds()
        elif isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(
                f"`{where}` must be a number of seconds or a datetime.timedelta; got "
                f"{short(value)} ({type(value).__name__})."
            )
        if not math.isfinite(value):
            raise ValueError(
                f"`{where}` must be a finite number of seconds; got {short(value)}."
            )
    else:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(
                f"`{where}` must be an int; got {short(value)} ({type(value).__name__})."
            )
        value = int(value)
    if value < 0 or (positive and value == 0):
        expected = "positive (> 0)" if positive else "non-negative (>= 0)"
        raise ValueError(f"`{where}` must be {expected}; got {short(value)}.")
    return value


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


def any_field(elapsed: Elapsed, period: Period, op: Callable[[Any, Any], bool]) -> bool:
    """True when `op(elapsed.<field>, period.<field>)` holds for ANY given field."""
    return any(op(getattr(elapsed, name), value) for name, value in period._given)
