"""`always` and `never`: schedules that do not depend on time."""

from __future__ import annotations

from ciclo._schedules.base import Schedule
from ciclo._time import Elapsed

__all__ = ["Always", "Never", "always", "never"]


class Always(Schedule):
    """Fires on every call; build it with `ciclo.always`."""

    def __call__(self, elapsed: Elapsed) -> bool:
        return True

    def fresh(self) -> Always:
        return self  # stateless

    def __repr__(self) -> str:
        return "always()"


class Never(Schedule):
    """Never fires; build it with `ciclo.never`."""

    def __call__(self, elapsed: Elapsed) -> bool:
        return False

    def fresh(self) -> Never:
        return self  # stateless

    def __repr__(self) -> str:
        return "never()"


def always() -> Always:
    """A schedule that fires on every call (same as `ciclo.every(1)`).

    Each call returns a new object, so two `always()` keys in a task dict are
    two tasks.

    Returns:
        An `Always` schedule.

    Example:
        >>> import ciclo
        >>> ciclo.always()(ciclo.Elapsed.create(steps=7))
        True
    """
    return Always()


def never() -> Never:
    """A schedule that never fires (e.g. to switch a task off, or in `piecewise`).

    Returns:
        A `Never` schedule.

    Example:
        >>> import ciclo
        >>> ciclo.never()(ciclo.Elapsed.create(steps=0))
        False
    """
    return Never()
