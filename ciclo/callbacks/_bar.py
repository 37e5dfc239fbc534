"""`ProgressBar`: what `keras_bar` and `tqdm_bar` share.

The protocol (loop element, `__loop_callback__`, `__loop_end__`, the by-hand call),
the throttled, lagged redraw (how far along a `total` the run is comes from
`ciclo.callbacks._progress`), and the two output modes: redrawn in place on a
terminal, or plain lines on anything else — a log file, a pipe, CI: every
`plain_interval` seconds, and at each epoch end of `train_loop` an epoch summary
(every train and test scalar the epoch-end step logged, exact, and the epoch's
seconds per step), printed once the history has brought that step's row to the
host (no wait on the device). Values come from the run's `History`
(`ciclo.callbacks._shown`): a bar makes no device-to-host transfer of its own.
Subclasses only draw: `_stream()`, `_draw(current, target, unit, values)`,
`_draw_epoch(current, target, unit, values, per_step)` and `_close(current,
target, unit, values)`, reading `_plain`, `_seconds`, `_rate` and
`_end_summarized`.

Over 300 lines: one object's state machine (the run's mode, the redraw clock,
the queued epoch summaries and the finish all read and set the same state),
which would only be spread thinner across modules.
"""

from __future__ import annotations

import math
import time as _time
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ciclo._input.batch import batch_size
from ciclo._logs import SHOWN_COLLECTIONS
from ciclo._loop.callback import observer
from ciclo._period import Period
from ciclo._short import short
from ciclo._time import Elapsed
from ciclo.callbacks._base import LoopElement
from ciclo.callbacks._progress import (
    check_seconds,
    check_total,
    is_terminal,
    progress,
    run_seconds,
)
from ciclo.callbacks._shown import Shown, number

if TYPE_CHECKING:
    from ciclo._loop.state import LoopState

__all__ = ["ProgressBar"]


class ProgressBar(LoopElement):
    """Base class of the progress bars (see `keras_bar`, `tqdm_bar`).

    Args:
        total: the length of the run: an int (steps) or a `Period`; None if unknown.
        interval: the least seconds between two redraws (terminal).
        plain_interval: the seconds between two plain lines (not a terminal).
        plain: True: plain lines; False: redraw in place; None: plain lines when
            the bar's stream is not a terminal.
    """

    reads_batch = False  # its hooks never read the loop's batch

    def __init__(
        self,
        total: int | Period | None,
        interval: float,
        plain_interval: float = 10.0,
        plain: bool | None = None,
    ):
        self.interval = check_seconds(interval, "interval")
        self.plain_interval = check_seconds(plain_interval, "plain_interval")
        if plain not in (None, True, False):
            raise TypeError(f"`plain` must be None, True or False; got {short(plain)}.")
        self.total = check_total(total)
        self.plain = plain
        # Only a total in steps alone can be checked without the batch size / clock.
        self._steps_only = self.total is not None and self.total.fields().keys() == {
            "steps"
        }
        # the steps before which only a redraw's time makes the per-step test
        # update the bar: none when its total is not in steps alone
        if self.total is None:
            self._quiet_below = math.inf
        elif self._steps_only:
            self._quiet_below = self.total.steps - 1
        else:
            self._quiet_below = -math.inf
        self._values = Shown()
        # epoch summaries waiting for their row to reach the host, in order:
        # (rows once the epoch-end batch is committed, where, the step's values)
        self._summaries: deque[tuple[int, tuple, dict[str, Any]]] = deque()
        self._epoch_mark = _EpochEnd(self)
        self.closed = False
        self._reset()

    # -- registration -----------------------------------------------------------
    @property
    def on_epoch_end(self) -> Any:
        """Marks the end of an epoch in `train_loop`: in plain-line mode the bar
        then writes a line when it next runs (on that batch's end)."""
        return self._epoch_mark

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
        self._values.commit(elapsed, logs)
        size = 0 if batch is None else batch_size(batch)
        after = elapsed.update(size)
        self._epoch(logs, elapsed, after)
        self._update(after)

    @observer
    def __loop_callback__(self, loop_state: LoopState) -> None:
        # None: no logs, no state (the loop applies nothing)
        values = self._values  # `values.follow(history, logs)`, written out
        values.history, values._live = loop_state.history, loop_state.logs
        if self._attend:  # an epoch ended, summaries wait, the run starts or ended
            self._attend_to(loop_state)
        # the cheap per-step test: no redraw is due and the total is not reached
        # (`_row[0]`: `loop_state.elapsed.steps`, without building it)
        elif _time.monotonic() >= self._due or loop_state._row[0] >= self._quiet_below:
            self._update(loop_state.elapsed_after)

    def _attend_to(self, loop_state: LoopState) -> None:
        """The step's call when the cheap test does not decide (`_attend`)."""
        if self._epoch_ended or self._summaries or self._epoch_from is None:
            self._epoch(loop_state.logs, loop_state.elapsed, loop_state.elapsed_after)
        if not self._finished and (
            _time.monotonic() >= self._due
            or self._epoch_ended
            or loop_state.elapsed.steps >= self._quiet_below
        ):
            self._update(loop_state.elapsed_after)
        self._attend = bool(
            self._epoch_ended
            or self._summaries
            or self._epoch_from is None
            or self._finished
        )

    def __loop_end__(self, loop_state: LoopState) -> None:
        """Shows the final values and closes the bar (normal end, Ctrl-C, error)."""
        if not self._finished and self._open:
            # what the loop committed last, also from a batch cut short (Ctrl-C)
            # after the bar's own call
            self._finish(loop_state.elapsed, loop_state.accumulated_logs)
        self._reset()

    def close(self) -> None:
        """Closes the bar by hand (if it is open); the next call starts a new one."""
        if self._open and not self._finished:
            self._end_summarized = self._print_summaries(
                drain=True, end=self._last_position[0]
            )
            self._close(*self._last_position, self._values.read_final())
            self.closed = True
        self._reset()

    # -- epoch summaries ----------------------------------------------------------
    def _summarizes(self) -> bool:
        """Whether epoch ends get a summary line: in plain mode (subclasses may
        say otherwise)."""
        return self._plain

    def _epoch(self, logs: Any, before: Elapsed, after: Elapsed) -> None:
        """At an epoch end, queues its summary (the scalar losses and metrics of
        the step's history row, read once on the host); prints the queued ones
        whose rows are on the host."""
        if self._finished:  # the total is reached: the bar is closed
            self._epoch_ended = False
            return
        if self._epoch_from is None:  # where this run's first epoch started
            self._epoch_from = (before.steps, float(before.date))
        if self._epoch_ended and not self._open:  # an epoch of one batch
            self._start(progress(self.total, after)[0])
        if self._epoch_ended and self._summarizes():
            self._epoch_ended = False  # the summary replaces the progress line,
            self._last_draw = _time.monotonic()  # and counts as one for the interval
            self._due = self._last_draw + self._every
            steps, since = self._epoch_from
            now = _time.time()
            per_step = (
                (now - since) / (after.steps - steps) if after.steps > steps else None
            )
            self._epoch_from = (after.steps, now)
            current, target, unit = progress(self.total, after)
            values: dict[str, Any] = {}  # the step's, read only if its row is not
            for collection in SHOWN_COLLECTIONS:
                values.update((logs or {}).get(collection) or {})
            where = (current, target, unit, run_seconds(after), per_step)
            stop = self._values.rows_after(after.steps - before.steps)
            self._summaries.append((stop, where, values))
        elif self._epoch_ended:
            self._epoch_from = (after.steps, _time.time())
        if self._summaries:
            self._print_summaries()

    def _print_summaries(self, drain: bool = False, end: float | None = None) -> bool:
        """Prints the queued summaries whose rows are on the host (all with
        `drain`, waiting); whether the last one printed was at `end`."""
        summaries, shown_values = self._summaries, self._values
        history = shown_values.history
        if summaries and history is not None:
            history.poll()
        while summaries:
            stop, (current, target, unit, seconds, per_step), values = summaries[0]
            row = shown_values.row(stop)
            if row is None and drain and history is not None:
                if stop <= len(history):  # committed: wait for it
                    history.fetch(stop)
                    row = shown_values.row(stop)
                else:  # not committed yet (the bar closes within its batch)
                    host = history.wait_for(list(values.values()))
                    row = {
                        name: scalar
                        for name, scalar in zip(values, map(number, host))
                        if scalar is not None
                    }
            if row is None:
                if not drain:
                    break
                row = {}
            summaries.popleft()
            # first-logged first (train entries, then the test ones), like Keras
            seen = {name: i for i, name in enumerate(shown_values.names())}
            order = list(row)
            names = sorted(order, key=lambda n: seen.get(n, len(seen) + order.index(n)))
            shown = {name: row[name] for name in names}
            self._seconds = seconds
            self._draw_epoch(current, target, unit, shown, per_step)
            self._summary_at = current
        return end is not None and self._summary_at == end

    # -- internals ----------------------------------------------------------------
    def _start(self, current: float) -> None:
        """A new run: decides the output mode and starts measuring the rate."""
        self._open, self.closed = True, False
        plain = self.plain
        self._plain = not is_terminal(self._stream()) if plain is None else plain
        self._every = self.plain_interval if self._plain else self.interval
        self._origin = (current, _time.time())
        if self._plain:  # the first line after an interval, or at an epoch end
            self._last_draw = _time.monotonic()
        self._due = self._last_draw + self._every  # the next redraw's time

    def _update(self, done: Elapsed) -> None:
        if self._finished:
            return
        current, target, unit = progress(self.total, done)
        if not self._open:
            self._start(current)
        self._last_position = (current, target, unit)
        self._seconds = run_seconds(done)
        if target is not None and current >= target:
            self._finish(done)
            return
        epoch_end, self._epoch_ended = self._epoch_ended, False
        now = _time.monotonic()
        # a terminal redraws at most every `interval`, epochs or not
        if now - self._last_draw < self._every and not (epoch_end and self._plain):
            return
        if self._plain and self._summaries:  # an epoch's summary comes first
            return
        self._last_draw = now
        self._due = now + self._every
        self._draw(current, target, unit, self._values.read())

    def _finish(self, done: Elapsed, logs: Any = None) -> None:
        current, target, unit = progress(self.total, done)
        drawn = self._last_position
        if drawn is not None and drawn[0] > current:
            # an error inside a step: never move the bar backwards
            current, target, unit = drawn
        if not self._open:
            self._start(current)
        self._end_summarized = self._print_summaries(drain=True, end=current)
        self._seconds = run_seconds(done)
        self._finished = self._attend = True
        self._close(current, target, unit, self._values.read_final(logs))
        self.closed = True

    def _rate(self, current: float) -> float | None:
        """Seconds per unit measured by this bar since its run started (so neither
        a resumed run nor a slow, compiling first step skews it); None until it
        has timed some progress."""
        if self._origin is None:
            return None
        first, started = self._origin
        seconds = _time.time() - started
        if current > first and seconds > 0:
            return seconds / (current - first)
        return None

    def _reset(self) -> None:
        self._values.clear()
        self._summaries.clear()
        self._epoch_from: tuple[int, float] | None = None  # (steps, wall time)
        self._end_summarized = False  # the final position's summary was printed
        self._summary_at: float | None = None  # where the last summary was
        self._last_draw = -math.inf
        self._every = self.interval
        self._due = -math.inf  # `_last_draw + _every`: the next redraw's time
        # the per-step call takes its long path (`_attend_to`): set when an
        # epoch ends, a run starts or the bar finishes
        self._attend = True
        self._open = False  # started, not closed yet
        self._finished = False  # reached `total`; later calls are ignored
        self._epoch_ended = False
        self._plain = False  # this run's mode, decided when it starts
        self._origin: tuple[float, float] | None = None  # (current, wall time)
        self._seconds = 0.0  # since the run started counting (Elapsed.date_start)
        self._last_position: tuple[float, float | None, str] | None = None

    # -- drawing (subclasses) -----------------------------------------------------
    def _stream(self) -> Any:
        """Where the bar writes (to tell a terminal from a file)."""
        raise NotImplementedError

    def _draw(
        self, current: float, target: float | None, unit: str, values: dict
    ) -> None:
        raise NotImplementedError

    def _draw_epoch(
        self,
        current: float,
        target: float | None,
        unit: str,
        values: dict,
        per_step: float | None,
    ) -> None:
        """One epoch-summary line; `per_step`: the epoch's seconds per step."""
        raise NotImplementedError

    def _close(
        self, current: float, target: float | None, unit: str, values: dict
    ) -> None:
        raise NotImplementedError


class _EpochEnd:
    """A bar's `on_epoch_end`: tells the bar the current batch ends an epoch."""

    reads_batch = False  # its hooks never read the loop's batch

    __slots__ = ("bar",)

    def __init__(self, bar: ProgressBar):
        self.bar = bar

    def __loop_callback__(self, loop_state: LoopState) -> tuple[None, None]:
        self.bar._epoch_ended = self.bar._attend = True
        return None, None

    def __call__(self, *args: Any) -> None:
        self.bar._epoch_ended = self.bar._attend = True

    def __repr__(self) -> str:
        return f"{type(self.bar).__name__}.on_epoch_end"
