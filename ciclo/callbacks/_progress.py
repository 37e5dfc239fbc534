"""How far a run is and how a bar shows it: the pure helpers of `ProgressBar`
(`progress` along a `total`, the run's seconds, the ETA's format, whether a
stream is a terminal, the checks of the arguments)."""

from __future__ import annotations

import math
import time as _time
from typing import Any

from ciclo._period import Period, as_period
from ciclo._short import short
from ciclo._time import Elapsed

__all__ = [
    "check_seconds",
    "check_total",
    "format_duration",
    "is_terminal",
    "progress",
    "run_seconds",
]

_FIELDS = (("steps", "step"), ("samples", "sample"), ("time", "s"), ("date", "s"))


def progress(
    total: Period | None, done: Elapsed, now: float | None = None
) -> tuple[float, float | None, str]:
    """How far `done` is along `total`, as `(current, target, unit)`.

    With a `Period` of several fields the one closest to being reached is used
    (the loop stops at the first reached). Time and date are measured in seconds
    since the run started, up to `now` (wall-clock; default: the current time).
    Without a total: `(steps, None, "step")`.
    """
    if total is None:
        return done.steps, None, "step"
    now = _time.time() if now is None else now
    seconds = max(float(done.time), now - float(done.date_start))
    best: tuple[float, float, str] | None = None
    best_fraction = -math.inf
    for field, unit in _FIELDS:
        goal = getattr(total, field)
        if goal is None:
            continue
        if field == "steps":
            current, target = done.steps, goal
        elif field == "samples":
            current, target = done.samples, goal
        elif field == "time":
            current, target = seconds, goal
        else:
            current, target = seconds, goal - float(done.date_start)
        fraction = current / target if target > 0 else math.inf
        if fraction > best_fraction:
            best, best_fraction = (current, target, unit), fraction
    assert best is not None  # a Period has at least one field
    return best


def is_terminal(stream: Any) -> bool:
    """Whether `stream` shows a line redrawn in place (`\\r`): a terminal, or a
    Jupyter cell's output (which handles `\\r` though it is no tty)."""
    try:
        if stream.isatty():
            return True
    except Exception:  # no isatty, or a closed file
        pass
    return type(stream).__module__.startswith("ipykernel")


def format_duration(seconds: float) -> str:
    """`12s`, `1:02` or `1:02:05`, as pkbar writes its ETA."""
    if seconds > 3600:
        return (
            f"{seconds // 3600:.0f}:{(seconds % 3600) // 60:02.0f}:{seconds % 60:02.0f}"
        )
    if seconds > 60:
        return f"{seconds // 60:.0f}:{seconds % 60:02.0f}"
    return f"{seconds:.0f}s"


def check_seconds(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(
            f"`{name}` must be a number of seconds, got {short(value)} "
            f"({type(value).__name__})."
        )
    if value < 0:
        raise ValueError(f"`{name}` must be >= 0 seconds, got {value}.")
    return float(value)


def check_total(total: Any) -> Period | None:
    if total is None:
        return None
    period = as_period(total, "total")
    for field, value in period.fields().items():
        if value <= 0 and field != "date":
            raise ValueError(
                f"`total` must be positive; got {field}={value!r}. Use e.g. "
                f"total=1000 (steps) or total=ciclo.at(samples=60_000)."
            )
    return period


def run_seconds(done: Elapsed) -> float:
    return max(float(done.time), _time.time() - float(done.date_start))
