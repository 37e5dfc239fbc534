"""`piecewise`: switch schedules at points in training time."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ciclo._period import Period, as_period
from ciclo._schedules.base import Schedule, ScheduleLike, fresh
from ciclo._short import short
from ciclo._time import Elapsed, new_elapsed

__all__ = ["Piecewise", "piecewise"]


def _key_repr(period: Period) -> str:
    if set(period.fields()) == {"steps"}:
        return repr(period.steps)
    fields = ", ".join(f"{name}={value!r}" for name, value in period.fields().items())
    return f"at({fields})"


class Piecewise(Schedule):
    """Delegates to the schedule of the last boundary reached; see `ciclo.piecewise`."""

    def __init__(
        self,
        initial: ScheduleLike,
        periods: Sequence[Period],
        schedules: Sequence[ScheduleLike],
    ):
        self.initial = initial
        self.periods = tuple(periods)
        self.schedules = tuple(schedules)

    def __call__(self, elapsed: Elapsed) -> bool:
        active, start = self.initial, None
        for period, schedule in zip(self.periods, self.schedules):
            if elapsed >= period:
                active, start = schedule, period
        if start is not None:  # the piece counts from its boundary
            elapsed = since(elapsed, start)
        return bool(active(elapsed))

    def fresh(self) -> Piecewise:
        return Piecewise(
            fresh(self.initial), self.periods, [fresh(s) for s in self.schedules]
        )

    def __repr__(self) -> str:
        pieces = ", ".join(
            f"{_key_repr(p)}: {s!r}" for p, s in zip(self.periods, self.schedules)
        )
        return f"piecewise({self.initial!r}, {{{pieces}}})"


def since(elapsed: Elapsed, start: Period) -> Elapsed:
    """`elapsed` counted from `start` in the fields `start` names (steps, samples,
    time); the others as they are. Never negative: a boundary reached in one field
    may not be in another.

    Example:
        >>> import ciclo
        >>> from ciclo._schedules.piecewise import since
        >>> e = since(ciclo.Elapsed.create(steps=7, samples=70), ciclo.at(5))
        >>> e.steps, e.samples
        (2, 70)
    """
    steps, samples, date_start = elapsed.steps, elapsed.samples, elapsed.date_start
    if start.steps is not None:
        steps = max(steps - start.steps, 0)
    if start.samples is not None:
        samples = max(samples - start.samples, 0)
    if start.time is not None:
        date_start = min(date_start + start.time, elapsed.date)
    return new_elapsed(steps, samples, elapsed.date, date_start)


def _boundary(key: Any) -> Period:
    if isinstance(key, int) and not isinstance(key, bool) and key < 0:
        raise ValueError(
            f"piecewise boundary {key!r} is negative; boundaries are steps >= 0 or a "
            f"ciclo.Period such as ciclo.at(samples=10_000)."
        )
    return as_period(key, f"piecewise boundary {key!r}")


def _check_order(periods: list[Period], keys: list[Any]) -> None:
    for j, later in enumerate(periods):
        for i in range(j):
            shared = set(periods[i].fields()) & set(later.fields())
            for name in sorted(shared):
                if getattr(later, name) <= getattr(periods[i], name):
                    raise ValueError(
                        f"piecewise boundaries must be in increasing order, but "
                        f"{keys[j]!r} comes after {keys[i]!r} and its {name} is not "
                        f"later, so the schedule of {keys[i]!r} would never be used. "
                        f"Sort the boundaries."
                    )


def piecewise(
    initial_schedule: ScheduleLike,
    boundaries: Mapping[int | Period, ScheduleLike],
) -> Piecewise:
    """A schedule that switches to another schedule at each boundary.

    At each call, the boundaries reached (`elapsed >= boundary`) are looked up and
    the schedule of the LAST one reached, in the dict's order, decides; before any
    is reached, `initial_schedule` decides. Give the boundaries in increasing order
    (an int means steps; a `ciclo.Period` such as `ciclo.at(samples=10_000)` any
    point in time). A piece's schedule is given `elapsed` counted from its
    boundary, in the boundary's fields (as the original Ciclo's pieces counted
    from where they started): `{5: ciclo.every(3)}` fires at steps 5, 8, 11,
    like `ciclo.after(5).every(3)`, and does so again when a run is resumed past
    5. Only the active schedule is called, so a stateful one (e.g.
    `every(samples=...)`) starts counting when its piece starts: it fires on the
    piece's first call. Values may be any schedule or plain callable.

    Args:
        initial_schedule: the schedule used before the first boundary.
        boundaries: `{boundary: schedule}`, boundaries in increasing order.

    Returns:
        A `Piecewise` schedule; its `fresh()` copies every piece.

    Raises:
        TypeError: if `boundaries` is not a dict, a boundary is neither an int nor
            a `Period`, or a schedule is not callable.
        ValueError: if a boundary is negative or the boundaries are not increasing.

    Example:
        >>> import ciclo
        >>> s = ciclo.piecewise(ciclo.every(1), {4: ciclo.every(2), 8: ciclo.every(4)})
        >>> s
        piecewise(every(steps=1), {4: every(steps=2), 8: every(steps=4)})
        >>> [step for step in range(14) if s(ciclo.Elapsed.create(steps=step))]
        [0, 1, 2, 3, 4, 6, 8, 12]
        >>> s = ciclo.piecewise(ciclo.never(), {5: ciclo.every(3)})  # from step 5
        >>> [step for step in range(14) if s(ciclo.Elapsed.create(steps=step))]
        [5, 8, 11]
    """
    if not callable(initial_schedule):
        raise TypeError(
            f"piecewise(initial_schedule, ...) must be a schedule (a callable elapsed "
            f"-> bool); got {short(initial_schedule)} ({type(initial_schedule).__name__})."
        )
    if not isinstance(boundaries, Mapping):
        raise TypeError(
            f"piecewise(..., boundaries) must be a dict {{int_or_period: schedule}}, "
            f"e.g. {{1000: ciclo.every(10)}}; got {short(boundaries)} "
            f"({type(boundaries).__name__})."
        )
    keys = list(boundaries)
    periods = [_boundary(key) for key in keys]
    for key, schedule in boundaries.items():
        if not callable(schedule):
            raise TypeError(
                f"piecewise boundary {key!r} maps to {schedule!r} "
                f"({type(schedule).__name__}); expected a schedule (a callable "
                f"elapsed -> bool), e.g. ciclo.every(10) or ciclo.never()."
            )
    _check_order(periods, keys)
    return Piecewise(initial_schedule, periods, list(boundaries.values()))
