"""`every`: fire periodically, by steps (stateless) or by samples / time (stateful)."""

from __future__ import annotations

import datetime
from typing import Any

from ciclo._period import check_amount
from ciclo._schedules.base import Schedule
from ciclo._time import Elapsed

__all__ = ["Every", "every"]

UNITS = ("steps", "samples", "time")


def one_unit(function: str, steps: Any, samples: Any, time: Any) -> tuple[str, Any]:
    """The single `(unit, amount)` given to `function`, validated as positive."""
    given = {u: v for u, v in zip(UNITS, (steps, samples, time)) if v is not None}
    if len(given) != 1:
        got = ", ".join(f"{u}={v!r}" for u, v in given.items()) or "none"
        raise ValueError(
            f"`{function}()` takes exactly one of steps, samples or time; got {got}. "
            f"Use e.g. {function}(10), {function}(samples=10_000) or "
            f"{function}(time=60); combine several with `|`, e.g. "
            f"ciclo.every(100) | ciclo.every(time=60)."
        )
    ((unit, value),) = given.items()
    return unit, check_amount(function, unit, value, positive=True)


class Every(Schedule):
    """Fires periodically; build it with `ciclo.every`.

    By steps it is stateless (`elapsed.steps % steps == 0`). By samples or time it
    remembers the samples / time of its last firing; `fresh()` forgets it.
    """

    def __init__(self, unit: str, amount: Any):
        self.unit = unit
        self.amount = amount
        self._last: Any = None  # samples or time at the last firing
        self.every_batch = unit == "steps" and amount == 1

    def __call__(self, elapsed: Elapsed) -> bool:
        if self.unit == "steps":
            return bool(elapsed.steps % self.amount == 0)
        now = getattr(elapsed, self.unit)
        if self._last is None or now - self._last >= self.amount:
            self._last = now
            return True
        return False

    def fresh(self) -> Every:
        return Every(self.unit, self.amount)

    def __repr__(self) -> str:
        return f"every({self.unit}={self.amount!r})"


def every(
    steps: int | None = None,
    *,
    samples: int | None = None,
    time: float | datetime.timedelta | None = None,
) -> Every:
    """A schedule that fires periodically, by steps, samples or time.

    - `every(steps=n)` (or `every(n)`) fires when `elapsed.steps % n == 0`: at steps
      0, n, 2n, ... It keeps no state, so it fires at the same steps when a run is
      resumed from a checkpoint.
    - `every(samples=k)` / `every(time=t)` fire on their first call, then each time
      at least `k` samples / `t` seconds (of `elapsed.time`) have passed since they
      last fired. They keep that state; a loop works on its own `fresh()` copy, so
      one schedule object used in several loops shares nothing between them.

    Args:
        steps: fire every this many steps (batches).
        samples: fire every this many samples.
        time: fire every this many seconds (a number or a `datetime.timedelta`).

    Returns:
        An `Every` schedule.

    Raises:
        ValueError: if not exactly one argument is given, or it is not positive.
        TypeError: if `steps`/`samples` is not an int, or `time` not a number of
            seconds or a `timedelta`.

    Example:
        >>> import ciclo
        >>> s = ciclo.every(3)
        >>> s
        every(steps=3)
        >>> [step for step in range(10) if s(ciclo.Elapsed.create(steps=step))]
        [0, 3, 6, 9]
        >>> s = ciclo.every(samples=100)  # batches of 32 samples
        >>> [n for n in range(0, 320, 32) if s(ciclo.Elapsed(n // 32, n, 0.0, 0.0))]
        [0, 128, 256]
    """
    unit, amount = one_unit("every", steps, samples, time)
    return Every(unit, amount)
