"""`Writer`: what the metric writers (`tensorboard`, `csv_logger`, `jsonl_logger`,
`wandb_logger`) share.

The protocol (loop element, self-registration on `on_train_batch_end`,
`__loop_callback__`, `__loop_end__`, the by-hand call and `close()`), and where
rows come from: the loop's `History`, the run's one device-to-host stream. A call
only notes which batch the writer fired at (its row index in the history, its
step and its number of steps: a fused call's rows are all written); the values
are read from the history once it has brought them to the host (its lagged
transfer, every `lag` commits, or a read's flush such as a checkpoint's save), so
a writer makes no transfer of its own and never makes the host wait. Used by
hand, a writer commits to a History of its own (`lag = every`), read the same
way. Subclasses only write: `_write(rows)` and `_close()`.

Rows are written in batches, never one per step: when the history hands over
rows (every few tens of steps), at the loop's end, at Ctrl-C and at `close()`,
each batch written and flushed once. After a checkpoint's save (the history then
has every committed row on the host) the writer also writes, at its next call,
the rows of the batch the checkpoint saved (their values are computed: the save
waited for them). So a SIGKILL loses at most the rows since the history's last
handover (up to about `2 * lag` = 128 steps by default, more while the device runs
far behind), never a row below a checkpoint the run finished saving a batch
before.

Rows use the loop's `elapsed` BEFORE the batch, as `History` does, and are the
history's rows at the steps the writer's schedule fired at; each row also carries
`completed`, the number of steps completed once its batch ran (`steps + 1`; for
the row `on_end` logs after the last batch, `steps`), the step TensorBoard and W&B
plot it at, as Keras, clu and Jaxloop do.

Across interruptions a writer holds each committed step once. The loop tells it,
before the first batch, where it starts (`__loop_start__(elapsed)`: after a resume,
the restored checkpoint's step S); the first write of a writer object then keeps
what an earlier run wrote below S and drops what it wrote from S on (the steps a
crashed run logged after its last checkpoint, which this run logs again). Used by
hand, the first row's step stands for S. At the loop's end it also writes the rows
committed after its last call (`on_end`'s). A batch its schedule skipped is not
written (`every(4)` over 10 batches writes steps 0, 4 and 8), also when Ctrl-C or
an error cut that batch before the writer ran: the loop then runs the cut batch's
observers whose schedules fire there (`Run.finish_observers`), so a writer on
`every(4)` cut at step 8 writes it, at step 6 does not. A batch Ctrl-C cut before
it counted has no history row, so no writer row: a loop that returns (normally or
on Ctrl-C) leaves exactly the history's rows at those steps. A loop that raises
leaves them plus the failing step's row as the writer saw it (e.g. the NaN loss
that `nan_guard` stopped on, whichever of the two runs first), which the history
does not commit.

One writer per output at a time: a writer claims its output (a file, a logdir:
`_target`) from its loop's start (by hand, its first call) to its `close()`; a
second writer on the same output meanwhile is an error naming both, since each
starts its output afresh and would hide the other's rows.

Ctrl-C arriving while a writer updates its rows in a loop is deferred to the end
of that writer's call (the loop's interrupt scope, `ciclo._interrupts`), so a row
is never lost or written twice by an interrupt landing mid-write.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections import deque
from collections.abc import Mapping
from typing import Any

from ciclo._history.history import History
from ciclo._history.transfer import get
from ciclo._interrupts import DEFERRED
from ciclo._logs import SHOWN_COLLECTIONS
from ciclo._loop.callback import observer
from ciclo._loop.state import LoopState
from ciclo._short import short
from ciclo._time import Elapsed
from ciclo._warn import user_line
from ciclo.callbacks._base import LoopElement
from ciclo.callbacks._rows import Row, host_scalar, numeric

__all__ = ["Writer", "missing"]


# an output (its real path) -> the writer writing there now (from its loop's start
# or first call by hand to its close)
_WRITING: weakref.WeakValueDictionary[str, Writer] = weakref.WeakValueDictionary()


def missing(owner: str, module: str, extra: str) -> ImportError:
    """The error of a callback whose optional dependency is not installed."""
    return ImportError(
        f"ciclo.{owner} needs the optional dependency {module!r}, which is not "
        f"installed: install ciclo[{extra}] (pip install 'ciclo[{extra}]')."
    )


class Writer(LoopElement):
    """Base class of the metric writers.

    Args:
        collections: the collections whose single-number entries are written, by
            bare entry name (a name in several of them is written once, with the
            value of the last one listed).
        max_pending: kept for compatibility: the history bounds the rows waiting
            for the device (`4 * lag`).
        every: by hand, rows committed between two writes (the writer's own
            history's `lag`); in a loop the loop's history sets the cadence.
    """

    reads_batch = False  # its hooks never read the loop's batch

    def __init__(
        self,
        *,
        collections: tuple[str, ...] = SHOWN_COLLECTIONS,
        max_pending: int = 256,
        every: int = 32,
    ):
        if isinstance(collections, str) or not all(
            isinstance(c, str) for c in collections
        ):
            raise TypeError(
                f"`collections` must be a tuple of collection names such as "
                f"('losses', 'metrics'), got {short(collections)}."
            )
        for name, value, least in (
            ("max_pending", max_pending, 0),
            ("every", every, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"`{name}` must be an int (rows), got {short(value)}.")
            if value < least:
                raise ValueError(f"`{name}` must be >= {least}, got {value}.")
        self.collections = tuple(collections)
        self.max_pending, self.every = max_pending, every
        self._history: History | None = None  # the stream the marks point into
        self._own: History | None = None  # by hand: the writer's own history
        # batches fired at, not written yet: (row index, step, steps in the batch)
        self._marks: deque[tuple[int, int, int]] = deque()
        self._seen_at: Any = None  # (elapsed, logs) the writer saw at its last call
        self._seen = 0  # the history's `on_host` at the last call
        self._catch_up = 0  # rows to fetch at the next call (after a save)
        self._start: int | None = None  # the step the first loop starts from
        self._opened = False  # wrote before: later loops continue the output
        self.rows_written = 0
        self._made = user_line()  # where the user made it (named in a clash)
        self._key: str | None = None  # its output's real path, once claimed

    # -- one writer per output ----------------------------------------------------
    def _target(self) -> str | None:
        """The path of the output this writer starts afresh (None: nothing
        another writer could hide)."""
        return None

    def _clash(self, other: Writer) -> str:
        """The error's text when `other` writes to this writer's output."""
        return (
            f"Two writers on one file: {self!r} and {other!r}, which is still "
            f"writing there. Each starts the file afresh (or appends rows under its "
            f"own header), so one writer's rows would hide the other's. Give each "
            f"its own path, or close() the first before the second starts."
        )

    def _claim(self) -> None:
        """Registers this writer as the one writing to its output; an error
        naming both if another one is (until that one's `close()`)."""
        key = self._key
        if key is None:
            target = self._target()
            if target is None:
                return
            key = self._key = os.path.realpath(target)
        other = _WRITING.get(key)
        if other is self:
            return
        if other is not None:
            raise ValueError(self._clash(other))
        _WRITING[key] = self

    def _release(self) -> None:
        key = self._key
        if key is not None and _WRITING.get(key) is self:
            del _WRITING[key]

    def __repr__(self) -> str:
        target = self._target()
        shown = "" if target is None else repr(target)
        return f"ciclo.{type(self).__name__}({shown}) made at {self._made}"

    # -- resuming -----------------------------------------------------------------
    def __loop_start__(self, elapsed: Elapsed | None) -> None:
        """Told by the loop, before its first batch, the step it starts from (the
        restored checkpoint's after a resume). The first write keeps the rows an
        earlier run wrote below it and drops those from it on."""
        if not self._opened:
            self._start = 0 if elapsed is None else int(elapsed.steps)
        self._claim()

    def _resume_point(self, rows: list[Row]) -> int:
        """The step from which an earlier run's rows are replaced, at the first
        write (the loop's start step; by hand, the first row's step)."""
        self._opened = True
        if self._start is not None:
            return self._start
        return min((row.steps for row in rows), default=0)

    # -- registration -----------------------------------------------------------
    @property
    def on_train_batch_end(self) -> Writer:
        """The writer itself: `train_loop(callbacks=[writer])` runs it after each
        batch (after the epoch end, so the `_test` entries are in that row)."""
        return self

    @property
    def on_test_batch_end(self) -> Writer:
        """The writer itself, for `test_loop(callbacks=[writer])`."""
        return self

    # -- calling ------------------------------------------------------------------
    def _entries(self, logs: Mapping[str, Mapping[str, Any]] | None) -> dict:
        out: dict[str, Any] = {}
        if not logs:
            return out
        for collection in self.collections:
            entries = logs.get(collection)
            if entries:
                for name, value in entries.items():
                    if numeric(value):
                        out[name] = value
        return out

    def __call__(
        self,
        elapsed: Elapsed,
        logs: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        """Writes one row by hand: `elapsed` as `ciclo.elapse` gave it with the
        batch (the row's step, as in `History`), and that step's logs. Rows are
        written in batches, once on the host; call `close()` at the end to write
        the rest and close."""
        own = self._own
        if own is None:
            self._claim()  # by hand: from the first call to `close()`
            own = self._own = History(lag=self.every)
        if self._history is not own:
            self._follow(own)
        self._marks.append((len(own), int(elapsed.steps), 1))
        own.commit(elapsed, logs if logs else {})
        if own.on_host != self._seen:
            self._seen = own.on_host
            self._write_marks(self._seen)

    @observer
    def __loop_callback__(self, loop_state: LoopState) -> None:
        # returns None (no logs, no state): the loop's cheapest output to apply
        history = loop_state.history
        if history is not self._history:
            self._follow(history)
        elapsed = loop_state.elapsed
        # `len(history)` and `history.on_host`, read without a call (every step)
        index, steps, on_host = history._rows, elapsed.steps, history._fetched
        self._marks.append((index, steps, loop_state.elapsed_after.steps - steps))
        self._seen_at = (elapsed, loop_state.logs)
        if on_host == self._seen and not self._catch_up:
            return  # nothing new on the host: the common step
        if self._catch_up:  # a checkpoint saved the last batch: its rows now
            history.fetch(self._catch_up)  # computed (the save waited)
            self._catch_up = 0
            on_host = history.on_host
        if on_host != self._seen:
            if history.flushed_at == index and self._seen < on_host:
                # every committed row was fetched (a checkpoint's save): the
                # rows of this batch too, at the next call
                self._catch_up = index + self._marks[-1][2]
            self._seen = on_host
            self._write_marks(on_host)

    def __loop_end__(self, loop_state: LoopState) -> None:
        """Writes every remaining row (waiting for the device once) and closes, on
        every exit path of the loop (its end, Ctrl-C, an error)."""
        try:
            rows = self._final_rows(loop_state)
            if rows:
                self._write(rows)
            elif not self._opened and self._start is not None:
                # a loop that wrote no row (Ctrl-C before the first one): the
                # output still drops what an earlier run wrote from its start on
                self._begin()
        finally:
            self._marks.clear()
            self._history = self._seen_at = None
            self._seen = self._catch_up = 0
            self.close()

    def close(self) -> None:
        """Writes every waiting row (waiting for the device) and closes the output;
        the next call opens it again (appending)."""
        try:
            history = self._history
            if history is not None and self._marks:
                history.fetch()
                self._write_marks(history.on_host)
        finally:
            self._marks.clear()
            self._own = self._history = None
            self._seen = 0
            try:
                self._close()
            finally:
                self._release()

    # -- reading the history ---------------------------------------------------------
    def _follow(self, history: History) -> None:
        """Reads `history` from now on (the rows noted in another are written
        first)."""
        previous = self._history
        if previous is not None and self._marks:
            previous.fetch()
            self._write_marks(previous.on_host)
            self._marks.clear()
        self._history, self._seen, self._catch_up = history, history.on_host, 0

    def _write_marks(self, on_host: int) -> None:
        """Writes the rows of the noted batches that are on the host."""
        marks = self._marks
        if not marks or marks[0][0] + marks[0][2] > on_host:
            return
        with DEFERRED:  # Ctrl-C meanwhile: raised once the rows are written
            ready = []
            while marks and marks[0][0] + marks[0][2] <= on_host:
                ready.append(marks.popleft())
            last = ready[-1]
            rows = self._rows_of(ready, ready[0][0], last[0] + last[2])
            if rows:
                self._write(rows)

    def _rows_of(
        self,
        marks: list[tuple[int, int, int]],
        start: int,
        stop: int,
        after: int | None = None,
    ) -> list[Row]:
        """The history's host rows `start` to `stop` of the batches in `marks` (a
        batch's rows: from its mark's index, at steps within its steps); with
        `after`, also the other rows at steps from `after` on."""
        history = self._history
        assert history is not None
        key = None
        if after is None:  # the writers of one history share the rows they write
            key = (start, stop, self.collections, tuple(marks))
            shared = history.__dict__.get("_writer_rows")
            if shared is not None and shared[0] == key:
                return shared[1]
        host = history.host_rows(start, stop, self.collections)
        rows, j, count = [], 0, len(marks)
        for i, (steps, samples, time, entries) in enumerate(host):
            index = start + i
            while j < count and marks[j][0] + marks[j][2] <= index:
                j += 1  # past that batch's rows
            fired = (
                j < count
                and marks[j][0] <= index
                and marks[j][1] <= steps < marks[j][1] + marks[j][2]
            )
            if not fired and (after is None or steps < after):
                continue
            for value in entries.values():
                kind = type(value)  # the history's scalars: Python numbers
                if kind is not float and kind is not int:
                    break
            else:  # the common row: all numbers already (a fresh dict: kept)
                if entries:
                    rows.append(Row(steps, samples, time, entries))
                continue
            numbers = {}
            for name, value in entries.items():
                kind = type(value)
                if kind is float or kind is int:
                    numbers[name] = value
                else:
                    number = host_scalar(value)
                    if number is not None:
                        numbers[name] = number
            if numbers:
                rows.append(Row(steps, samples, time, numbers))
        if key is not None:
            history._writer_rows = (key, rows)
        return rows

    def _final_rows(self, loop_state: LoopState) -> list[Row]:
        """At the loop's end: the rows of the noted batches and, after the last
        one, `on_end`'s rows; a failing batch's row as the writer saw it. (A
        batch Ctrl-C or an error cut before the writer ran is noted all the
        same when the writer's schedule fires there: the loop runs the
        observers of a cut batch, `Run.finish_observers`.)

        The last noted batch counts when its step is below the loop's
        `elapsed_after` (the count the loop returns; when it raises, the count
        with the failing batch). One that Ctrl-C cut before it counted left no
        history row (a row at its step is `on_end`'s, written as its own)."""
        history, marks = self._history, list(self._marks)
        self._marks.clear()
        if history is None or not marks:
            return []
        held = marks[-1]
        counted = held[1] < int(loop_state.elapsed_after.steps)
        if not counted:
            marks.pop()
        final = int(loop_state.elapsed.steps)
        # after the last call: `on_end`'s rows (from `final` on)
        after = max(final, held[1])
        with contextlib.suppress(Exception):  # a failed value: the rows on the host
            history.fetch()  # one wait, at the end
        start = marks[0][0] if marks else held[0]
        rows = self._rows_of(marks, start, len(history), after)
        if counted and not any(row.steps == held[1] for row in rows):
            seen = self._seen_row()  # not in the history: the loop raised there
            if seen is not None:
                rows.append(seen)
                rows.sort(key=lambda row: row.steps)
        for row in rows:
            if row.steps >= final:  # `on_end`'s row: after the last batch
                row.completed = row.steps
        return rows

    def _seen_row(self) -> Row | None:
        """The row of the last batch as the writer saw it (its logs, made host
        values), for a batch the history did not commit."""
        if self._seen_at is None:
            return None
        elapsed, logs = self._seen_at
        entries = self._entries(logs)
        if not entries:
            return None
        values = list(entries.values())
        host = get(values)  # a failed or deleted value: only it is lost (None)
        numbers = {}
        for name, value in zip(entries, host, strict=True):
            number = host_scalar(value)
            if number is not None:
                numbers[name] = number
        return Row.of(elapsed, numbers) if numbers else None

    # -- output (subclasses) --------------------------------------------------------
    def _write(self, rows: list[Row]) -> None:
        raise NotImplementedError

    def _begin(self) -> None:
        """Starts the output without a row (as the first write would: what an
        earlier run wrote from the start step on is dropped)."""

    def _close(self) -> None:
        raise NotImplementedError
