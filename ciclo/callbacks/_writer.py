"""`Writer`: what the metric writers (`tensorboard`, `csv_logger`, `jsonl_logger`,
`wandb_logger`) share.

The protocol (loop element, self-registration on `on_train_batch_end`,
`__loop_callback__`, `__loop_end__`, the by-hand call and `close()`), and the lagged
reading: a row keeps references to the step's device values and is written once
`LaggedQueue` finds them computed, so a writer never makes the host wait for the
device during training. Subclasses only write: `_write(rows)` and `_close()`.

Rows use the loop's `elapsed` BEFORE the batch, as `History` does, so a writer's
rows equal the history's; each row also carries `completed`, the number of steps
completed once its batch ran (`steps + 1`; for the row `on_end` logs after the
last batch, `steps`), the step TensorBoard and W&B plot it at, as Keras, clu and
Jaxloop do.

Across interruptions a writer holds each committed step once. The loop tells it,
before the first batch, where it starts (`__loop_start__(elapsed)`: after a resume,
the restored checkpoint's step S); the first write of a writer object then keeps
what an earlier run wrote below S and drops what it wrote from S on (the steps a
crashed run logged after its last checkpoint, which this run logs again). Used by
hand, the first row's step stands for S. The row of the current step is held back until the next
call (or the loop's end), so that at the end it can be completed with what was
committed after the writer ran: entries logged by callbacks after it in the last
step, the logs of a batch cut by Ctrl-C, the logs of `on_end`. A held row whose
batch did not count (Ctrl-C cut it before it changed the state: the history has no
row for it and the loop's `elapsed` excludes it) is dropped, so a loop that returns
(normally or on Ctrl-C) leaves exactly the history's rows. A loop that raises
leaves them plus the failing step's row as the writer saw it (e.g. the NaN loss
that `nan_guard` stopped on), which the history does not commit.

Ctrl-C arriving while a writer updates its rows in a loop is deferred to the end
of that writer's call (the loop's interrupt scope, `ciclo._interrupts`), so a row
is never lost or written twice by an interrupt landing mid-write.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ciclo._interrupts import DEFERRED
from ciclo._time import Elapsed
from ciclo.callbacks._base import LoopElement
from ciclo.callbacks._lagged import SHOWN_COLLECTIONS, LaggedQueue
from ciclo.callbacks._rows import Row, host_scalar, numeric

__all__ = ["Writer", "missing"]


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
        max_pending: rows kept waiting for the device at most; past that a call
            waits for the oldest (the device is that many steps behind).
    """

    def __init__(
        self,
        *,
        collections: tuple[str, ...] = SHOWN_COLLECTIONS,
        max_pending: int = 256,
    ):
        if isinstance(collections, str) or not all(
            isinstance(c, str) for c in collections
        ):
            raise TypeError(
                f"`collections` must be a tuple of collection names such as "
                f"('losses', 'metrics'), got {collections!r}."
            )
        self.collections = tuple(collections)
        self._queue = LaggedQueue(max_pending)
        self._held: Row | None = None
        self._mark: tuple[Any, int] | None = None  # (history, index of held row)
        self._start: int | None = None  # the step the first loop starts from
        self._opened = False  # wrote before: later loops continue the output
        self.rows_written = 0

    # -- resuming -----------------------------------------------------------------
    def __loop_start__(self, elapsed: Elapsed | None) -> None:
        """Told by the loop, before its first batch, the step it starts from (the
        restored checkpoint's after a resume). The first write keeps the rows an
        earlier run wrote below it and drops those from it on."""
        if not self._opened:
            self._start = 0 if elapsed is None else int(elapsed.steps)

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
        written lagged; call `close()` at the end to write the rest and close."""
        entries = self._entries(logs)
        if entries:
            self._push(Row.of(elapsed, entries))
        self._write_ready()

    def __loop_callback__(self, loop_state: Any) -> tuple[None, None]:
        with DEFERRED:  # Ctrl-C during the call: raised as it ends
            if self._held is not None and self._held.entries:
                self._push(self._held)
            self._held = Row.of(loop_state.elapsed, self._entries(loop_state.logs))
            self._mark = (loop_state.history, len(loop_state.history))
            self._write_ready()
        return None, None

    def __loop_end__(self, loop_state: Any) -> None:
        """Writes every remaining row (waiting for the device once) and closes, on
        every exit path of the loop (its end, Ctrl-C, an error)."""
        try:
            for row in self._completed(loop_state):
                if row.entries:
                    self._push(row)
        finally:
            self._held = self._mark = None
            self.close()

    def _completed(self, loop_state: Any) -> list[Row]:
        """The rows the history committed from the held one on: the held row
        completed from the history when its batch was committed, and the rows
        committed after it at the end of the loop (the last batch when the writer
        did not run on it, `on_end`).

        The held batch counts when its step is below the loop's `elapsed_after`
        (the count the loop returns; when it raises, the count with the failing
        batch). One that Ctrl-C cut before it counted left no history row, so the
        writer writes none (a row at that step is `on_end`'s, written as its own);
        the failing batch of a loop that raises is written as the writer saw it."""
        held, mark = self._held, self._mark
        if held is None or mark is None:
            return []
        history, index = mark
        counted = held.steps < int(loop_state.elapsed_after.steps)
        if history is not loop_state.history:  # another loop's: as the writer saw it
            return [held]
        if len(history) <= index:  # nothing committed since the writer's call
            return [held] if counted else []
        try:
            tail = history[index:]  # one transfer, at the end
        except Exception:  # a failed device value: keep what the writer saw
            return [held] if counted else []
        rows = []
        final = int(loop_state.elapsed.steps)
        last = final - 1
        for i, logs in enumerate(tail):
            elapsed = logs.get("elapsed", {})
            steps = int(elapsed.get("steps", -1))
            if i == 0 and counted and steps == held.steps:
                held.entries.update(self._entries(logs))
                rows.append(held)
            elif steps >= held.steps and steps >= last:
                rows.append(
                    Row(
                        steps,
                        int(elapsed.get("samples", 0)),
                        float(elapsed.get("time", 0.0)),
                        self._entries(logs),
                        # `on_end`'s row comes after the last batch: nothing more
                        # completed than its step counts
                        steps if steps >= final else steps + 1,
                    )
                )
        return rows

    def close(self) -> None:
        """Writes every queued row (waiting for the device) and closes the output;
        the next call opens it again (appending)."""
        try:
            self._write(self._host_rows(self._queue.drain()))
        finally:
            self._queue.clear()
            self._close()

    # -- internals ----------------------------------------------------------------
    def _push(self, row: Row) -> None:
        names = list(row.entries)
        self._queue.push((row, names), [row.entries[n] for n in names])

    def _write_ready(self) -> None:
        if len(self._queue):
            ready = self._queue.pop_ready()
            if ready:
                self._write(self._host_rows(ready))

    @staticmethod
    def _host_rows(items: list[tuple[Any, list[Any]]]) -> list[Row]:
        rows = []
        for (row, names), values in items:
            entries = {}
            for name, value in zip(names, values):
                number = host_scalar(value)
                if number is not None:
                    entries[name] = number
            rows.append(Row(row.steps, row.samples, row.time, entries, row.completed))
        return rows

    # -- output (subclasses) --------------------------------------------------------
    def _write(self, rows: list[Row]) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        raise NotImplementedError
