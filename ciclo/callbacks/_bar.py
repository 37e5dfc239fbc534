"""`ProgressBar`: what `keras_bar` and `tqdm_bar` share.

The protocol (loop element, `__loop_callback__`, `__loop_end__`, the by-hand call),
the throttled, lagged redraw, and how far along a `total` the run is. Subclasses
only draw: `_draw(current, target, unit, values)` and `_close(current, target,
unit, values)`.
"""

from __future__ import annotations

import math
import time as _time
from collections.abc import Mapping
from typing import Any

from ciclo._time import Elapsed, Period, as_period, batch_size
from ciclo.callbacks._base import LoopElement
from ciclo.callbacks._lagged import LaggedValues

__all__ = ["ProgressBar", "progress"]

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


def _check_total(total: Any) -> Period | None:
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


class ProgressBar(LoopElement):
    """Base class of the progress bars (see `keras_bar`, `tqdm_bar`).

    Args:
        total: the length of the run: an int (steps) or a `Period`; None if unknown.
        interval: the least seconds between two redraws.
    """

    def __init__(self, total: int | Period | None, interval: float):
        if isinstance(interval, bool) or not isinstance(interval, int | float):
            raise TypeError(
                f"`interval` must be a number of seconds, got {interval!r} "
                f"({type(interval).__name__})."
            )
        if interval < 0:
            raise ValueError(f"`interval` must be >= 0 seconds, got {interval}.")
        self.total = _check_total(total)
        self.interval = float(interval)
        # Only a total in steps alone can be checked without the batch size / clock.
        self._steps_only = self.total is not None and self.total.fields().keys() == {
            "steps"
        }
        self._values = LaggedValues()
        self._last_draw = -math.inf
        self._open = False  # drawn at least once, not closed yet
        self._finished = False  # reached `total`; later calls are ignored
        self._last_position: tuple[float, float | None, str] | None = None
        self.closed = False

    # -- registration -----------------------------------------------------------
    @property
    def on_train_batch_end(self) -> ProgressBar:
        """The bar itself: `train_loop(callbacks=[bar])` runs it after each batch."""
        return self

    @property
    def on_test_batch_end(self) -> ProgressBar:
        """The bar itself, for `test_loop(callbacks=[bar])`.

        (`train_loop` does not register its callbacks in its test loop, so a bar
        given to it only follows training.)
        """
        return self

    @property
    def on_predict_batch_end(self) -> ProgressBar:
        """The bar itself, for `predict_loop(callbacks=[bar])`."""
        return self

    # -- the two ways of calling a bar -------------------------------------------
    def __call__(
        self,
        elapsed: Elapsed,
        logs: Mapping[str, Mapping[str, Any]] | None = None,
        *,
        batch: Any = None,
    ) -> None:
        """Updates the bar by hand, after training on the batch `elapsed` came with.

        Args:
            elapsed: the `Elapsed` from `ciclo.elapse` for the batch just trained on
                (it counts the batches before it; the bar counts this one too).
            logs: the step's logs; their losses and metrics are shown.
            batch: that batch, so a `total` in samples counts its samples too.
        """
        self._values.offer(logs)
        size = 0 if batch is None else batch_size(batch)
        self._update(elapsed.update(size))

    def __loop_callback__(self, loop_state: Any) -> tuple[None, None]:
        self._values.offer(loop_state.logs)
        if not self._finished and self._due(loop_state.elapsed):
            self._update(loop_state.elapsed_after)
        return None, None

    def __loop_end__(self, loop_state: Any) -> None:
        """Shows the final values and closes the bar (normal end, Ctrl-C, error)."""
        if not self._finished and self._open:
            self._finish(loop_state.elapsed)
        self._reset()

    def close(self) -> None:
        """Closes the bar by hand (if it is open); the next call starts a new one."""
        if self._open and not self._finished:
            self._close(*self._last_position, self._values.read_final())
            self.closed = True
        self._reset()

    # -- internals ----------------------------------------------------------------
    def _due(self, before: Elapsed) -> bool:
        """Cheap per-step test: a redraw is due, or the total may be reached."""
        if _time.monotonic() - self._last_draw >= self.interval:
            return True
        total = self.total
        if total is None:
            return False
        if self._steps_only:
            return before.steps + 1 >= total.steps
        return True

    def _update(self, done: Elapsed) -> None:
        if self._finished:
            return
        if not self._open:
            self.closed = False
        current, target, unit = progress(self.total, done)
        if target is not None and current >= target:
            self._finish(done)
            return
        now = _time.monotonic()
        if now - self._last_draw < self.interval:
            return
        self._last_draw = now
        self._open = True
        self._last_position = (current, target, unit)
        self._draw(current, target, unit, self._values.read())

    def _finish(self, done: Elapsed) -> None:
        current, target, unit = progress(self.total, done)
        drawn = self._last_position
        if drawn is not None and drawn[0] > current:
            # an error inside a step: never move the bar backwards
            current, target, unit = drawn
        self._open = True
        self._finished = True
        self._close(current, target, unit, self._values.read_final())
        self.closed = True

    def _reset(self) -> None:
        self._values.clear()
        self._last_draw = -math.inf
        self._open = False
        self._finished = False
        self._last_position = None

    # -- drawing (subclasses) -----------------------------------------------------
    def _draw(
        self, current: float, target: float | None, unit: str, values: dict
    ) -> None:
        raise NotImplementedError

    def _close(
        self, current: float, target: float | None, unit: str, values: dict
    ) -> None:
        raise NotImplementedError
