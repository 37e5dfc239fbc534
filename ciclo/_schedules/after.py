"""`after`: fire once a point in training time is reached; `after(a).every(b)`."""

from __future__ import annotations

import datetime
from typing import Any

from ciclo._period import Period
from ciclo._schedules.base import Schedule
from ciclo._schedules.every import UNITS, check_amount, one_unit
from ciclo._time import Elapsed

__all__ = ["After", "AfterEvery", "after", "period_repr"]


def period_repr(period: Period) -> str:
    """`steps=3, samples=100`, or `at(date=...)` when the period has a date."""
    fields = period.fields()
    text = ", ".join(f"{name}={value!r}" for name, value in fields.items())
    return f"at({text})" if "date" in fields else text


class After(Schedule):
    """Fires on every call once `elapsed >= period`; build it with `ciclo.after`."""

    def __init__(self, period: Period):
        self.period = period

    def __call__(self, elapsed: Elapsed) -> bool:
        return bool(elapsed >= self.period)

    def every(
        self,
        steps: int | None = None,
        *,
        samples: int | None = None,
        time: float | datetime.timedelta | None = None,
    ) -> AfterEvery:
        """Fires periodically from this point on: `after(3).every(5)` -> 3, 8, 13, ...

        When both the point and the period are in steps the schedule is stateless:
        it fires at the steps `s >= a` with `(s - a) % b == 0`, also when a run is
        resumed past `a`. Otherwise it fires on the first call at or after the point,
        then by the `every` rule counted from that first firing (by steps: every
        `b` steps after it; by samples / time: each time at least that many
        samples / seconds passed since it last fired).

        Args:
            steps: fire every this many steps.
            samples: fire every this many samples.
            time: fire every this many seconds (a number or a `timedelta`).

        Returns:
            An `AfterEvery` schedule.

        Raises:
            ValueError: if not exactly one argument is given, or it is not positive.
            TypeError: for an argument of the wrong type.

        Example:
            >>> import ciclo
            >>> s = ciclo.after(3).every(5)
            >>> s
            after(steps=3).every(steps=5)
            >>> [step for step in range(16) if s(ciclo.Elapsed.create(steps=step))]
            [3, 8, 13]
        """
        unit, amount = one_unit("every", steps, samples, time)
        return AfterEvery(self.period, unit, amount)

    def then(self, schedule: Any) -> Schedule:
        """`schedule` from this point on, given `elapsed` counted from it (Ciclo
        0.1's spelling, also `after(n) >> schedule`): `piecewise(never(),
        {period: schedule})`.

        Example:
            >>> import ciclo
            >>> s = ciclo.after(5) >> ciclo.every(3)
            >>> [step for step in range(14) if s(ciclo.Elapsed.create(steps=step))]
            [5, 8, 11]
        """
        from ciclo._schedules.constant import never
        from ciclo._schedules.piecewise import piecewise

        return piecewise(never(), {self.period: schedule})

    def __rshift__(self, schedule: Any) -> Schedule:
        return self.then(schedule)

    def fresh(self) -> After:
        return self  # stateless

    def __repr__(self) -> str:
        return f"after({period_repr(self.period)})"


class AfterEvery(Schedule):
    """Fires periodically once a point is reached; build it with `after(...).every(...)`."""

    def __init__(self, period: Period, unit: str, amount: Any):
        self.period = period
        self.unit = unit
        self.amount = amount
        self.stateless = unit == "steps" and set(period.fields()) == {"steps"}
        self._anchor: Any = None  # first firing (steps) or last firing (samples/time)

    def __call__(self, elapsed: Elapsed) -> bool:
        if not elapsed >= self.period:
            return False
        if self.stateless:
            return bool((elapsed.steps - self.period.steps) % self.amount == 0)
        now = getattr(elapsed, self.unit)
        if self._anchor is None:
            self._anchor = now
            return True
        if self.unit == "steps":
            return bool((now - self._anchor) % self.amount == 0)
        if now - self._anchor >= self.amount:
            self._anchor = now
            return True
        return False

    def fresh(self) -> AfterEvery:
        return AfterEvery(self.period, self.unit, self.amount)

    def __repr__(self) -> str:
        return f"after({period_repr(self.period)}).every({self.unit}={self.amount!r})"


def after(
    steps: int | Period | None = None,
    *,
    samples: int | None = None,
    time: float | datetime.timedelta | None = None,
) -> After:
    """A schedule that fires on every call once a point in training time is reached.

    It fires when `elapsed >= ciclo.at(steps, samples=samples, time=time)`: with
    several fields, once ANY of them is reached. A `ciclo.Period` may be passed
    instead (`after(ciclo.at(date=...))`). It keeps no state. Use `.every(...)` to
    fire periodically from that point on.

    Args:
        steps: the number of steps to reach, or a `ciclo.Period`.
        samples: the number of samples to reach.
        time: the seconds of training to reach (a number or a `timedelta`).

    Returns:
        An `After` schedule.

    Raises:
        ValueError: if nothing is given, or an amount is negative.
        TypeError: for an argument of the wrong type.

    Example:
        >>> import ciclo
        >>> s = ciclo.after(samples=100)
        >>> s
        after(samples=100)
        >>> [n for n in range(0, 320, 32) if s(ciclo.Elapsed(n // 32, n, 0.0, 0.0))]
        [128, 160, 192, 224, 256, 288]
    """
    if isinstance(steps, Period):
        if samples is not None or time is not None:
            raise ValueError(
                f"`ciclo.after()` got a Period ({steps!r}) and also samples={samples!r}"
                f", time={time!r}; put every field in the Period."
            )
        return After(steps)
    given = {u: v for u, v in zip(UNITS, (steps, samples, time)) if v is not None}
    if not given:
        raise ValueError(
            "`ciclo.after()` needs at least one of steps, samples or time (or a "
            "ciclo.Period); got none. Example: ciclo.after(1000) or "
            "ciclo.after(samples=50_000)."
        )
    fields = {u: check_amount("after", u, v, positive=False) for u, v in given.items()}
    return After(Period(**fields))
