"""The schedule protocol: any callable `elapsed -> bool`; combinators return schedules."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ciclo._time import Elapsed

__all__ = ["Schedule", "ScheduleLike", "fresh"]

ScheduleLike = Callable[[Elapsed], bool]


class Schedule:
    """Base class of ciclo's schedules: `schedule(elapsed) -> bool`.

    Subclasses implement `__call__`. A schedule that keeps state (e.g. when it last
    fired) overrides `fresh()` to return an independent copy with that state reset;
    the loop works on `fresh()` copies, so one schedule object given to several
    loops shares nothing. Stateless schedules keep the default (`self`).
    Combine them with `&`, `|` and `~` (plain callables are accepted on either side).
    A schedule true for every batch whatever `elapsed` is may say so
    (`every_batch = True`, as `every(1)` does): the loop then does not call it.

    Example:
        >>> import ciclo
        >>> s = ciclo.every(2) & ~ciclo.every(3)
        >>> [step for step in range(8) if s(ciclo.Elapsed.create(steps=step))]
        [2, 4]
    """

    every_batch: bool = False  # true for every batch: the loop skips the call
    # ciclo's own: an equivalent schedule (same argument, same answers) that the
    # loop calls instead, a frame less per batch (a `Place` that is an epoch end)
    _direct: Schedule | None = None

    def __call__(self, elapsed: Elapsed) -> bool:
        raise NotImplementedError

    def fresh(self) -> Schedule:
        """An independent copy with its firing state reset (`self` when stateless)."""
        return self

    def __and__(self, other: ScheduleLike) -> Schedule:
        if _named(other):  # a named schedule: its __rand__ composes
            return NotImplemented
        return And(self, _check(other, "&"))

    def __rand__(self, other: ScheduleLike) -> Schedule:
        return And(_check(other, "&"), self)

    def __or__(self, other: ScheduleLike) -> Schedule:
        if _named(other):  # a named schedule: its __ror__ composes
            return NotImplemented
        return Or(self, _check(other, "|"))

    def __ror__(self, other: ScheduleLike) -> Schedule:
        return Or(_check(other, "|"), self)

    def __invert__(self) -> Schedule:
        return Not(self)


def _named(other: Any) -> bool:
    """A named schedule (`ciclo.on_epoch_end`, or one composed from it): a place in
    a predefined loop's order, which composes with ordinary schedules itself."""
    return isinstance(other, str) or getattr(other, "__named_schedule__", False)


def _check(other: Any, op: str) -> ScheduleLike:
    if not callable(other):
        raise TypeError(
            f"Cannot combine a schedule with {other!r} ({type(other).__name__}) using "
            f"`{op}`: expected a schedule (a callable elapsed -> bool)."
        )
    return other


def fresh(schedule: ScheduleLike) -> ScheduleLike:
    """A loop-private copy of `schedule` (plain callables are used as they are)."""
    return schedule.fresh() if isinstance(schedule, Schedule) else schedule


class And(Schedule):
    """Fires when both fire. Both are always evaluated, so stateful ones stay in step."""

    def __init__(self, a: ScheduleLike, b: ScheduleLike):
        self.a, self.b = a, b

    def __call__(self, elapsed: Elapsed) -> bool:
        a, b = bool(self.a(elapsed)), bool(self.b(elapsed))
        return a and b

    def fresh(self) -> Schedule:
        return And(fresh(self.a), fresh(self.b))

    def __repr__(self) -> str:
        return f"({self.a!r} & {self.b!r})"


class Or(Schedule):
    """Fires when either fires. Both are always evaluated."""

    def __init__(self, a: ScheduleLike, b: ScheduleLike):
        self.a, self.b = a, b

    def __call__(self, elapsed: Elapsed) -> bool:
        a, b = bool(self.a(elapsed)), bool(self.b(elapsed))
        return a or b

    def fresh(self) -> Schedule:
        return Or(fresh(self.a), fresh(self.b))

    def __repr__(self) -> str:
        return f"({self.a!r} | {self.b!r})"


class Not(Schedule):
    """Fires when the wrapped schedule does not."""

    def __init__(self, a: ScheduleLike):
        self.a = a

    def __call__(self, elapsed: Elapsed) -> bool:
        return not self.a(elapsed)

    def fresh(self) -> Schedule:
        return Not(fresh(self.a))

    def __repr__(self) -> str:
        return f"~{self.a!r}"
