"""`HistoryStore`: the write side of `History` (`ciclo._history.history` reads it).

Rows staged as committed, put in their columns (`ciclo._history.columns`) together
before any read, their values fetched to the host lagged (`ciclo._history.transfer`),
and pickling (so checkpoints) as host data.
"""

from __future__ import annotations

import array
import bisect
import collections
import operator
import types
from collections.abc import Mapping
from typing import Any

from ciclo._history import transfer
from ciclo._history.columns import Column, ElapsedColumn
from ciclo._input.batch import Steps
from ciclo._interrupts import DEFERRED
from ciclo._logs import Logs, same_entries
from ciclo._short import short
from ciclo._time import Elapsed, new_elapsed

__all__ = ["ELAPSED", "HistoryStore"]

ELAPSED = "elapsed"
_ELAPSED_FIELDS = ("steps", "samples", "time", "date")
_HOST_NUMBERS = frozenset((float, int))  # logged as they are: no transfer


def _fields(elapsed: Any) -> Any:
    """The `elapsed` fields a row keeps, read from anything that has them."""
    try:
        return types.SimpleNamespace(
            steps=int(elapsed.steps),
            samples=int(elapsed.samples),
            time=float(elapsed.time),
            date=float(elapsed.date),
        )
    except (AttributeError, TypeError, ValueError) as error:
        raise TypeError(
            f"History.commit: `elapsed` must be a ciclo.Elapsed (numeric steps, "
            f"samples, time and date), got {short(elapsed)} "
            f"({type(elapsed).__name__}): {error}. Pass the loop's `elapsed`, or "
            f"ciclo.Elapsed.create(steps=n)."
        ) from None


_ELAPSED_OF = operator.itemgetter(0)
_LOGS_OF = operator.itemgetter(1)
_TIMES = operator.attrgetter(*_ELAPSED_FIELDS)


def _times(staged: list[tuple[Any, Logs]]) -> list[array.array]:
    """The staged rows' `elapsed` fields as four arrays (steps, samples, time,
    date), built whole before any column changes, in one C-level pass."""
    fields = list(zip(*map(_ELAPSED_OF, staged))) or [()] * 4
    out = []
    for values, typecode in zip(fields, "qqdd"):
        try:  # the loop's own: Python numbers, converted in C
            out.append(array.array(typecode, values))
        except (TypeError, ValueError, OverflowError):  # e.g. steps as a float
            convert = int if typecode == "q" else float
            out.append(array.array(typecode, [convert(v) for v in values]))
    return out


def _put(column: Column, value: Any) -> None:
    """One committed value into its column: a host number straight in when
    nothing of the column is pending (no transfer: lr_monitor's), else pending."""
    if type(value) in _HOST_NUMBERS and not column.pending:
        column.append(value)
    else:
        column.pending.append(value)


class HistoryStore:
    """What a `History` stores (see its docstring). Subclasses read it through
    `_rows` (the committed rows), `_columns` (`(collection, name) -> column`, the
    `elapsed` ones first) and `_flush()` (brings every committed value to the host).
    """

    def __init__(self, lag: int = 64):
        if not isinstance(lag, int) or lag < 1:
            raise ValueError(f"`lag` must be a positive int, got {short(lag)}.")
        self.lag = lag
        # commits between two transfers: `lag`, or less while a reader in the
        # loop asks for rows sooner (`read_within`, e.g. nan_guard's `max_lag`)
        self._every = lag
        self._rows = 0
        # the rows committed but not yet in their columns: `(elapsed, logs)`,
        # put in them together (`_settle`) before anything reads the columns
        self._staged: list[tuple[Any, Logs]] = []
        self._elapsed_columns = tuple(ElapsedColumn(t) for t in ("q", "q", "d", "d"))
        self._all_columns: dict[tuple[str, str], Column | ElapsedColumn] = {
            (ELAPSED, name): column
            for name, column in zip(_ELAPSED_FIELDS, self._elapsed_columns)
        }
        self._entry_columns: list[Column] = []  # the columns of logged entries
        # collection -> name -> column: `_all_columns` without a key per entry
        self._by_collection: dict[str, dict[str, Column]] = {}
        self._fetched = 0  # rows below this one are all on the host
        # the rows committed at the last read that brought them all to the host
        # (a checkpoint's save, `collect`): their values were computed by then
        self._flushed_at = -1
        self._started = 0  # rows below this one are on the host or in flight
        # the row count at which a commit runs `_advance`: at most the first at
        # which `_every` rows are not in flight or `4 * lag` not on the host
        # (`_reschedule`; earlier is harmless, `_advance` checks both itself)
        self._due = lag
        # started transfers, oldest first: (rows below `upto`, [(column, n)], transfer)
        self._in_flight: collections.deque[tuple[int, list, Any]] = collections.deque()
        # the `LoopState` of the loop writing this history, while it runs: its
        # step's logs are logged but not committed yet (`History.collect`)
        self._live: Any = None
        # (collection, name) -> the aggregation mode a committed step declared
        # for it (`logs.add_metric(..., aggregation=...)`); `inner_loop` reads it
        self._declared: dict[tuple[str, str], str] = {}

    @property
    def on_host(self) -> int:
        """How many rows have all their values on the host: it grows by the lagged
        transfer (every `lag` commits) and by a read's flush (e.g. a checkpoint's
        save); observers that write rows out write then."""
        return self._fetched

    @property
    def flushed_at(self) -> int:
        """How many rows were committed when a read last brought every committed
        row to the host, waiting for the device (a checkpoint's save, `collect`);
        -1 before any. The lagged transfer and `poll` do not count."""
        return self._flushed_at

    # -- writing ------------------------------------------------------------------
    def commit(self, elapsed: Elapsed, logs: Logs | Mapping[str, Any]) -> None:
        """Appends one row: the `elapsed` fields plus every entry of `logs`.

        Values are not converted here; they reach the host lagged, several rows
        per transfer.

        Raises:
            TypeError: if `logs` is not a dict of collections to entries, or
                `elapsed` has no numeric `steps`, `samples`, `time` and `date`.
        """
        if type(logs) is not Logs and not isinstance(logs, Logs):
            logs = Logs(logs)
        if type(elapsed) is not Elapsed:  # its fields checked before the row starts
            elapsed = _fields(elapsed)
        with DEFERRED:  # Ctrl-C meanwhile: raised once the row is whole
            self._append(elapsed, logs)
            self._settle()  # the caller may change `logs` after

    def _append(self, elapsed: Elapsed, logs: Logs) -> None:
        """Commits one row at `elapsed` (`_append_row`)."""
        self._append_row(_TIMES(elapsed), logs)

    def _append_row(self, at: tuple[int, int, float, float], logs: Logs) -> None:
        """Commits one row at `at`, `elapsed`'s `(steps, samples, time, date)`:
        staged as it is (a few bytecodes a step), put in its columns with the
        other staged rows by `_settle`. `logs` is not changed after (the loop's
        are each batch's own; `commit` settles at once)."""
        declared = logs._aggregations
        if declared:
            self._declared.update(declared)
        self._staged.append((at, logs))
        self._rows = row = self._rows + 1
        if row >= self._due:
            self._advance()

    # -- the columns, the staged rows put in first ------------------------------------
    @property
    def _columns(self) -> dict[tuple[str, str], Column | ElapsedColumn]:
        """`(collection, name) -> column`, the `elapsed` ones first."""
        if self._staged:
            self._settle()
        return self._all_columns

    @property
    def _elapsed(self) -> tuple[ElapsedColumn, ...]:
        """The columns of the `elapsed` fields (steps, samples, time, date)."""
        if self._staged:
            self._settle()
        return self._elapsed_columns

    @property
    def _entries(self) -> list[Column]:
        """The columns of logged entries."""
        if self._staged:
            self._settle()
        return self._entry_columns

    def _settle(self) -> None:
        """Puts the staged rows in their columns, in order: when every staged row
        logged the same entries (the loop's common case), each column takes its
        values in one C-level pass; otherwise row by row."""
        staged = self._staged
        if not staged:
            return
        with DEFERRED:  # Ctrl-C meanwhile: raised once the rows are in
            first = self._rows - len(staged)
            times = _times(staged)
            groups = same_entries(list(map(_LOGS_OF, staged)))
            steps, samples, time, date = self._elapsed_columns
            steps.values.extend(times[0])
            samples.values.extend(times[1])
            time.values.extend(times[2])
            date.values.extend(times[3])
            if groups is None:
                for row, (_, logs) in enumerate(staged, first):
                    self._place(row, logs)
            else:
                rows = range(first, first + len(staged))
                for collection, name, values in groups:
                    column = self._column(collection, name)
                    column.rows.extend(rows)
                    if not set(map(type, values)) & _HOST_NUMBERS:
                        column.pending.extend(values)  # device values (or others)
                    else:
                        for value in values:
                            _put(column, value)
            self._staged = []

    def _place(self, row: int, logs: Logs) -> None:
        """Puts the entries of `logs`, committed as row `row`, in their columns."""
        by_collection = self._by_collection
        for collection, entries in logs.items():
            named = by_collection.get(collection)
            if named is None:
                named = by_collection[collection] = {}
            for name, value in entries.items():
                column = named.get(name)
                if column is None:
                    column = named[name] = self._column(collection, name)
                column.rows.append(row)
                _put(column, value)

    def _column(self, collection: str, name: str) -> Column:
        """The column of an entry, registered (empty) if it is new."""
        column = self._all_columns.get((collection, name))
        if column is None:
            column = Column()
            self._entry_columns.append(column)  # flushed before it is readable
            self._all_columns[(collection, name)] = column
        return column

    def commit_steps(self, elapsed: Elapsed, steps: Steps, logs: Logs) -> None:
        """Appends the `steps.n` rows of a fused call: row `i` at `elapsed.steps + i`
        (samples likewise, each step counting `steps.samples // steps.n`) with
        the per-step values of `steps.rows`; the last row also holds `logs` (the
        call's other entries; an entry in both is taken from `logs`).

        No value is sliced on the device: each stacked array is fetched once, in
        the next lagged transfer, and split on the host.
        """
        n = steps.n
        if n < 1:
            return
        if not isinstance(logs, Logs):
            logs = Logs(logs)
        with DEFERRED:  # Ctrl-C meanwhile: raised once the n rows are whole
            self._append_steps(elapsed, steps, logs)

    def _append_steps(self, elapsed: Elapsed, steps: Steps, logs: Logs) -> None:
        n, rows = steps.n, steps.rows
        per_step = steps.samples // n
        self._settle()  # the rows before these first
        in_last = {(c, name) for c, name, _ in logs.entries()}
        first = self._rows
        for collection, name, value in Logs(rows).entries():
            column = self._column(collection, name)
            count = n - 1 if (collection, name) in in_last else n
            column.rows.extend(range(first, first + count))
            column.pending.extend(transfer.rows(value, count))
        # rows 0 .. n-2 (the last one is committed below, with `logs`)
        steps_column, samples, time, date = self._elapsed_columns
        s0, m0 = int(elapsed.steps), int(elapsed.samples)
        steps_column.values.extend(range(s0, s0 + n - 1))
        samples.values.extend([m0 + i * per_step for i in range(n - 1)])
        time.values.extend([float(elapsed.time)] * (n - 1))
        date.values.extend([float(elapsed.date)] * (n - 1))
        self._rows = row = first + n - 1
        if row >= self._due:
            self._advance()
        last = new_elapsed(
            s0 + n - 1, m0 + (n - 1) * per_step, elapsed.date, elapsed.date_start
        )
        self._append(last, logs)

    def _advance(self) -> None:
        """The lagged transfer, every `lag` commits (`_every`): reads the started transfers
        whose values are computed (oldest first, without waiting), then starts
        one for the rows committed since. When `4 * lag` rows are not on the host
        yet (the device is far behind), waits for the oldest `lag` of them."""
        self._settle()
        in_flight = self._in_flight
        wait = self._rows - self._fetched >= 4 * self.lag
        goal = self._fetched + self.lag
        while in_flight and (
            in_flight[0][2].ready() or (wait and self._fetched < goal)
        ):
            self._complete()
        if wait and self._fetched < goal:  # nothing was in flight for those rows
            self._flush(goal)
        if self._rows - self._started >= self._every:
            self._start(self._rows)
        self._reschedule()

    def _reschedule(self) -> None:
        """Sets `_due` from the rows in flight and on the host; called where the
        row at which a transfer is due may come sooner (`_every` lowered, a
        transfer in flight dropped) and after each `_advance`."""
        self._due = min(self._started + self._every, self._fetched + 4 * self.lag)

    def _take(self, upto: int) -> list[tuple[Column, int, int]]:
        """`(column, skip, n)`: the `n` pending values of each column for rows below
        `upto`, after the `skip` ones already in flight."""
        claimed: dict[int, int] = {}
        for _, taken, _ in self._in_flight:
            for column, n in taken:
                claimed[id(column)] = claimed.get(id(column), 0) + n
        out = []
        for column in self._entries:
            pending = column.pending
            skip = claimed.get(id(column), 0)
            if len(pending) <= skip:
                continue
            first = len(column.rows) - len(pending) + skip
            n = bisect.bisect_left(column.rows, upto, lo=first) - first
            if n:
                out.append((column, skip, n))
        return out

    def _start(self, upto: int) -> None:
        """Starts the transfer of the rows in flight-free rows below `upto`."""
        taken = self._take(upto)
        if taken:
            started = transfer.start([c.pending[s : s + n] for c, s, n in taken])
            self._in_flight.append((upto, [(c, n) for c, _, n in taken], started))
        elif not self._in_flight:
            self._fetched = upto
        self._started = upto

    def _complete(self) -> None:
        """Reads the oldest transfer in flight (waiting for it if needed) into its
        columns."""
        upto, taken, started = self._in_flight[0]
        fetched = started.result()  # before anything changes: Ctrl-C loses nothing
        for (column, n), values in zip(taken, fetched):
            column.extend(values)
            column.pending = column.pending[n:]
        self._in_flight.popleft()
        self._fetched = upto

    def _flush(self, upto: int | None = None) -> None:
        """Brings the values of rows below `upto` (all by default) to the host,
        waiting for the device for those rows only: a transfer in flight that
        also holds newer rows not computed yet is dropped (its rows are fetched
        again later), and the rows are copied as they are (no stacking, which
        would wait for every step queued since)."""
        full = upto is None or upto >= self._rows  # `flushed_at` then
        if upto is None:
            upto = self._rows
        if upto > self._fetched:
            with DEFERRED:  # Ctrl-C meanwhile: raised once the values are in
                self._fetch_below(upto)
        if full:
            self._flushed_at = self._rows

    def _fetch_below(self, upto: int) -> None:
        partial = upto < self._rows
        in_flight = self._in_flight
        while in_flight and self._fetched < upto:
            if partial and in_flight[0][0] > upto and not in_flight[0][2].ready():
                in_flight.clear()  # its values are still pending: fetched again
                self._started = self._fetched
                self._reschedule()
                break
            self._complete()
        if self._fetched < upto:
            taken = self._take(upto)
            if taken:
                # fetched before anything changes: Ctrl-C in the transfer loses nothing
                fetched = transfer.fetch(
                    [c.pending[:n] for c, _, n in taken], stack=not partial
                )
                for (column, _, n), values in zip(taken, fetched):
                    column.extend(values)
                    column.pending = column.pending[n:]
            self._fetched = upto
            self._started = max(self._started, upto)

    # -- pickling (and checkpoints) ---------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        """The rows as host data (the lagged values fetched first): `lag`, `rows`,
        the four `elapsed` fields as `array.array`s, and per logged entry
        `(collection, name, rows, values)`, `rows` an `array.array` of row indices
        and `values` an `array.array` (scalars) or a list. Copies: the history can
        go on being written."""
        self._flush()
        columns = []
        for (collection, name), column in self._columns.items():
            if isinstance(column, ElapsedColumn):
                continue
            values = column.values
            values = (
                array.array(values.typecode, values)
                if isinstance(values, array.array)
                else list(values)
            )
            columns.append((collection, name, array.array("q", column.rows), values))
        return {
            "lag": self.lag,
            "rows": self._rows,
            "elapsed": [
                array.array(c.values.typecode, c.values) for c in self._elapsed
            ],
            "columns": columns,
        }

    def first_row_at(self, step: int) -> int:
        """The first row whose `elapsed.steps` is `step` or later (`len` when
        none is; the rows are in step order). No transfer, no copy."""
        return bisect.bisect_left(self._elapsed[0].values, step)

    def rows_since(self, start: int) -> dict[str, Any]:
        """The rows from `start` on as host data (the lagged values fetched first),
        in `__getstate__`'s form, plus `start`: each column's `rows` are the
        indices of its rows from `start` on (counted from the history's first
        row), `elapsed` the fields of those rows. What a checkpoint adds to the
        previous one. Copies."""
        self._flush()
        columns = []
        for (collection, name), column in self._columns.items():
            if isinstance(column, ElapsedColumn):
                continue
            lo = bisect.bisect_left(column.rows, start)
            if lo < len(column.rows):
                columns.append((collection, name, column.rows[lo:], column.values[lo:]))
        return {
            "lag": self.lag,
            "start": start,
            "rows": self._rows,
            "elapsed": [c.values[start:] for c in self._elapsed],
            "columns": columns,
        }

    def __setstate__(self, state: Mapping[str, Any]) -> None:
        """The history `__getstate__` described (its arrays are taken, not copied)."""
        self.__init__(lag=int(state["lag"]))
        self._rows = self._fetched = self._started = int(state["rows"])
        self._reschedule()
        for column, values in zip(self._elapsed, state["elapsed"]):
            column.values = values
        for collection, name, rows, values in state["columns"]:
            column = self._columns[(collection, name)] = Column()
            column.rows, column.values = rows, values
            self._entries.append(column)
