"""`History`: the committed logs of a run, stored column-wise and fetched lagged."""

from __future__ import annotations

import array
import bisect
import collections
from collections.abc import Iterator, Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np

from ciclo import _transfer as transfer
from ciclo._logs import Logs, locate
from ciclo._time import Elapsed, Steps, new_elapsed
from ciclo._transfer import Row

__all__ = ["History", "history"]

ELAPSED = "elapsed"
_ELAPSED_FIELDS = ("steps", "samples", "time", "date")


class _Column:
    """One entry's values: the rows they were logged at and the values.

    A commit appends the row and the raw value to `pending` (O(1)); a flush moves
    converted values to `values`. Scalars live in a typed `array.array` (8 bytes
    each); anything else in a list. `values[i]` belongs to `rows[i]`.
    """

    __slots__ = ("pending", "rows", "values")

    def __init__(self):
        self.rows = array.array("q")
        self.values: array.array | list = array.array("q")
        self.pending: list[Any] = []

    def append(self, value: Any) -> None:
        values = self.values
        if isinstance(values, array.array):
            scalar = _scalar(value)
            if scalar is not None:
                if isinstance(scalar, float) and values.typecode == "q":
                    values = self.values = array.array("d", values)
                values.append(scalar)
                return
            values = self.values = list(values)
        if (
            isinstance(value, np.ndarray | np.generic)
            and value.shape == ()
            and value.dtype.kind == "b"
        ):
            value = bool(value)  # a singleton: 8 bytes in the list
        values.append(value)

    def extend(self, values: np.ndarray | list[Any]) -> None:
        """Appends fetched values: a 1-d numpy array of scalars in bulk, else each."""
        if (
            isinstance(values, np.ndarray)
            and values.ndim == 1
            and isinstance(self.values, array.array)
        ):
            kind = values.dtype.kind
            if kind in "iu" and self.values.typecode == "q":
                self.values.extend(values.astype(np.int64).tolist())
                return
            if kind == "f" and values.dtype.itemsize >= 4:
                if self.values.typecode == "q":
                    self.values = array.array("d", self.values)
                self.values.extend(values.astype(np.float64).tolist())
                return
        for value in values:
            self.append(value)


class _ElapsedColumn:
    """An `elapsed` field: present in every row, so its rows are implicit."""

    __slots__ = ("values",)

    def __init__(self, typecode: str):
        self.values = array.array(typecode)

    @property
    def rows(self) -> range:
        return range(len(self.values))


def _scalar(value: Any) -> int | float | None:
    """`value` as a Python int/float when it is a real 0-d number, else None.

    Booleans are kept as lists (they stay `bool` when read back).
    """
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    if isinstance(value, np.ndarray | np.generic) and value.ndim == 0:
        kind = value.dtype.kind
        if kind in "iu":
            return int(value)
        if kind == "f" or (kind == "V" and jnp.issubdtype(value.dtype, jnp.floating)):
            return float(value)  # float16/32/64 and ml_dtypes such as bfloat16
    return None


class History:
    """The committed logs of a run: one row per step that logged.

    Values are kept on device when committed and brought to the host in batches
    (or all at once when read): every `lag` commits, a transfer of the rows
    committed since is started (device scalars stacked on the device, not waited
    for), and the transfers started before whose values are computed are read,
    so a commit never waits for the device. Only when `4 * lag` rows are still
    not on the host (the device is far behind) does a commit wait for the oldest
    `lag` of them, which bounds the device memory held by pending values; the
    device still has about `3 * lag` steps queued then. Storage is column-wise: a
    logged scalar costs ~16 bytes.

    Args:
        lag: how often (in commits) ready values are fetched; `4 * lag` bounds the
            rows pending on device.

    Example:
        >>> import ciclo
        >>> history = ciclo.history()
        >>> elapsed = ciclo.Elapsed.create()
        >>> for i in range(3):
        ...     logs = ciclo.logs()
        ...     _ = logs.add_metric("loss", 1.0 / (i + 1))
        ...     history.commit(elapsed, logs)
        ...     elapsed = elapsed.update(batch_size=8)
        >>> history.collect("steps", "loss")
        ([0, 1, 2], [1.0, 0.5, 0.3333333333333333])
    """

    def __init__(self, lag: int = 64):
        if not isinstance(lag, int) or lag < 1:
            raise ValueError(f"`lag` must be a positive int, got {lag!r}.")
        self.lag = lag
        self._rows = 0
        self._elapsed = tuple(_ElapsedColumn(t) for t in ("q", "q", "d", "d"))
        self._columns: dict[tuple[str, str], _Column | _ElapsedColumn] = {
            (ELAPSED, name): column
            for name, column in zip(_ELAPSED_FIELDS, self._elapsed)
        }
        self._entries: list[_Column] = []  # the columns of logged entries
        # collection -> name -> column: `_columns` without building a key per entry
        self._by_collection: dict[str, dict[str, _Column]] = {}
        self._fetched = 0  # rows below this one are all on the host
        self._started = 0  # rows below this one are on the host or in flight
        # started transfers, oldest first: (rows below `upto`, [(column, n)], transfer)
        self._in_flight: collections.deque[tuple[int, list, Any]] = collections.deque()
        # True while a commit or flush is under way: one that is still True when
        # the next starts was cut short (Ctrl-C), and `_heal` undoes its traces.
        self._writing = False

    # -- writing ------------------------------------------------------------------
    def commit(self, elapsed: Elapsed, logs: Logs | Mapping[str, Any]) -> None:
        """Appends one row: the `elapsed` fields plus every entry of `logs`.

        Values are not converted here; they reach the host lagged, several rows
        per transfer.

        Raises:
            TypeError: if `logs` is not a dict of collections to entries.
        """
        if type(logs) is not Logs and not isinstance(logs, Logs):
            logs = Logs(logs)
        if self._writing:
            self._heal()
        self._writing = True
        row, by_collection = self._rows, self._by_collection
        for collection, entries in logs.items():
            named = by_collection.get(collection)
            if named is None:
                named = by_collection[collection] = {}
            for name, value in entries.items():
                column = named.get(name)
                if column is None:
                    column = named[name] = self._column(collection, name)
                column.rows.append(row)
                column.pending.append(value)
        steps, samples, time, date = self._elapsed
        steps.values.append(int(elapsed.steps))
        samples.values.append(int(elapsed.samples))
        time.values.append(float(elapsed.time))
        date.values.append(float(elapsed.date))
        # Publishing the row is this one store: cut short before it, the entries
        # appended above are left-overs that `_heal` removes; after it, the row
        # is complete. So an interrupted commit leaves the row out or in, whole.
        self._rows = row = row + 1
        if row - self._started >= self.lag or row - self._fetched >= 4 * self.lag:
            self._advance()
        self._writing = False

    def _column(self, collection: str, name: str) -> _Column:
        """The column of an entry, registered (empty) if it is new."""
        column = self._columns.get((collection, name))
        if column is None:
            column = _Column()
            self._entries.append(column)  # flushed before it is readable
            self._columns[(collection, name)] = column
        return column

    def _heal(self) -> None:
        """Undoes what a commit or flush cut short (by Ctrl-C) left behind.

        A commit publishes its row last (`_rows += 1`): entries of an unpublished
        row are removed. A flush appends converted values before dropping them
        from `pending`: values converted twice are dropped from `pending`. A
        column registered without entries is removed.
        """
        rows = self._rows
        self._by_collection.clear()  # columns may be removed below
        self._in_flight.clear()  # their values are still pending: fetched again
        self._started = self._fetched
        for column in self._elapsed:
            del column.values[rows:]
        for column in self._entries:
            stale = 0
            while column.rows and column.rows[-1] >= rows:
                column.rows.pop()
                stale += 1
            expected = len(column.rows) - len(column.values)
            pending = column.pending
            if len(pending) > expected:
                # an unpublished row's value sits at the end; values a flush
                # already converted sit at the front
                keep = (
                    pending[:expected] if stale else pending[len(pending) - expected :]
                )
                column.pending = keep
        empty = [key for key, c in self._columns.items() if not len(c.rows)]
        for key in empty:
            if key[0] != ELAPSED:
                column = self._columns.pop(key)
                self._entries = [c for c in self._entries if c is not column]
        for column in self._entries:  # registered in `_entries` but not by key
            if all(column is not c for c in self._columns.values()):
                self._entries = [c for c in self._entries if c is not column]
        self._writing = False

    def commit_steps(self, elapsed: Elapsed, steps: Steps, logs: Logs) -> None:
        """Appends the `steps.n` rows of a fused call: row `i` at `elapsed.steps + i`
        (samples likewise, each step counting `steps.samples // steps.n`) with
        the per-step values of `steps.rows`; the last row also holds `logs` (the
        call's other entries; an entry in both is taken from `logs`).

        No value is sliced on the device: each stacked array is fetched once, in
        the next lagged transfer, and split on the host.
        """
        n, rows = steps.n, steps.rows
        if n < 1:
            return
        if not isinstance(logs, Logs):
            logs = Logs(logs)
        if self._writing:
            self._heal()
        self._writing = True  # rows are published by `_rows`, as in `commit`
        per_step = steps.samples // n
        in_last = {(c, name) for c, name, _ in logs.entries()}
        first = self._rows
        for collection, name, value in Logs(rows).entries():
            column = self._column(collection, name)
            count = n - 1 if (collection, name) in in_last else n
            column.rows.extend(range(first, first + count))
            column.pending.extend(Row(value, i) for i in range(count))
        # rows 0 .. n-2 (the last one is committed below, with `logs`)
        steps_column, samples, time, date = self._elapsed
        s0, m0 = int(elapsed.steps), int(elapsed.samples)
        steps_column.values.extend(range(s0, s0 + n - 1))
        samples.values.extend([m0 + i * per_step for i in range(n - 1)])
        time.values.extend([float(elapsed.time)] * (n - 1))
        date.values.extend([float(elapsed.date)] * (n - 1))
        self._rows = row = first + n - 1
        if row - self._started >= self.lag or row - self._fetched >= 4 * self.lag:
            self._advance()
        last = new_elapsed(
            s0 + n - 1, m0 + (n - 1) * per_step, elapsed.date, elapsed.date_start
        )
        # rows 0 .. n-2 are published and whole: nothing for `commit` to heal (which
        # would drop the transfers in flight)
        self._writing = False
        self.commit(last, logs)

    def _advance(self) -> None:
        """The lagged transfer, every `lag` commits: reads the started transfers
        whose values are computed (oldest first, without waiting), then starts
        one for the rows committed since. When `4 * lag` rows are not on the host
        yet (the device is far behind), waits for the oldest `lag` of them."""
        in_flight = self._in_flight
        wait = self._rows - self._fetched >= 4 * self.lag
        goal = self._fetched + self.lag
        while in_flight and (
            in_flight[0][2].ready() or (wait and self._fetched < goal)
        ):
            self._complete()
        if wait and self._fetched < goal:  # nothing was in flight for those rows
            self._flush(goal)
        if self._rows - self._started >= self.lag:
            self._start(self._rows)

    def _take(self, upto: int) -> list[tuple[_Column, int, int]]:
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
        """Brings the values of rows below `upto` (all by default) to the host."""
        standalone = upto is None  # a read's flush, not a commit's
        if standalone:
            if self._writing:  # after an interrupted write
                self._heal()
            upto = self._rows
        if upto <= self._fetched:
            return
        self._writing = True
        while self._in_flight and self._fetched < upto:
            self._complete()
        if self._fetched < upto:
            taken = self._take(upto)
            if taken:
                # fetched before anything changes: Ctrl-C in the transfer loses nothing
                fetched = transfer.fetch([c.pending[:n] for c, _, n in taken])
                for (column, _, n), values in zip(taken, fetched):
                    column.extend(values)
                    column.pending = column.pending[n:]
            self._fetched = upto
            self._started = max(self._started, upto)
        if standalone:
            self._writing = False

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
            if isinstance(column, _ElapsedColumn):
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

    def __setstate__(self, state: Mapping[str, Any]) -> None:
        """The history `__getstate__` described (its arrays are taken, not copied)."""
        self.__init__(lag=int(state["lag"]))
        self._rows = self._fetched = self._started = int(state["rows"])
        for column, values in zip(self._elapsed, state["elapsed"]):
            column.values = values
        for collection, name, rows, values in state["columns"]:
            column = self._columns[(collection, name)] = _Column()
            column.rows, column.values = rows, values
            self._entries.append(column)

    # -- reading ------------------------------------------------------------------
    def __len__(self) -> int:
        return self._rows

    def keys(self) -> list[str]:
        """Every key ever logged, as `"collection.name"` (the elapsed ones included)."""
        self._flush()
        return [f"{c}.{n}" for c, n in self._columns]

    def _resolve(self, key: str) -> tuple[str, str] | None:
        return locate(self._columns, key, "history")

    def collect(self, key: str, *keys: str) -> list[Any] | tuple[list[Any], ...]:
        """Aligned lists of values over the steps where ALL `keys` were logged.

        Keys are bare entry names (`"loss"`, `"steps"`) or `"collection.name"`. A
        key never logged gives empty lists (see `keys()` for what was logged).

        Returns:
            A list for one key, a tuple of lists for several.

        Raises:
            ValueError: if a bare name lives in several collections.

        Example:
            >>> import ciclo
            >>> history = ciclo.history()
            >>> history.commit(ciclo.Elapsed.create(), ciclo.logs().add_metric("a", 1))
            >>> history.collect("a"), history.collect("a", "not_logged")
            ([1], ([], []))
        """
        self._flush()
        found = [self._resolve(k) for k in (key, *keys)]
        if any(f is None for f in found):
            return [] if not keys else tuple([] for _ in found)
        columns = [self._columns[f] for f in found]
        if len(columns) == 1:
            return _values(columns[0])
        common = np.asarray(columns[0].rows)
        for column in columns[1:]:
            common = np.intersect1d(common, np.asarray(column.rows), assume_unique=True)
        out = []
        for column in columns:
            rows = np.asarray(column.rows)
            index = np.searchsorted(rows, common)
            values = column.values
            out.append([values[i] for i in index.tolist()])
        return tuple(out)

    def __getitem__(self, index: int | slice) -> Logs | list[Logs]:
        """The logs of row `index` (negative indices count from the end), or a list
        of them for a slice."""
        if isinstance(index, slice):
            return self._rows_logs(range(*index.indices(self._rows)))
        if not -self._rows <= index < self._rows:
            raise IndexError(f"History has {self._rows} rows, got index {index}.")
        return self._rows_logs([index % self._rows])[0]

    def _rows_logs(self, rows: range | list[int]) -> list[Logs]:
        """The logs of `rows` (increasing), in one pass over each column."""
        self._flush()
        out = [Logs() for _ in rows]
        if not out:
            return out
        first, last = rows[0], rows[-1]
        for (collection, name), column in self._columns.items():
            values, column_rows = column.values, column.rows
            if isinstance(column, _ElapsedColumn):
                pairs = ((row, values[row]) for row in rows)
            else:
                lo = bisect.bisect_left(column_rows, first)
                hi = bisect.bisect_right(column_rows, last)
                wanted = set(rows) if len(rows) < last - first + 1 else None
                pairs = (
                    (column_rows[i], values[i])
                    for i in range(lo, hi)
                    if wanted is None or column_rows[i] in wanted
                )
            for row, value in pairs:
                out[
                    rows.index(row) if isinstance(rows, list) else row - first
                ].add_entry(collection, name, value)
        return out

    def __iter__(self) -> Iterator[Logs]:
        chunk = 4096
        for start in range(0, self._rows, chunk):
            yield from self._rows_logs(range(start, min(start + chunk, self._rows)))

    def __repr__(self) -> str:
        return f"History(rows={self._rows}, keys={len(self._columns)})"

    # -- export -------------------------------------------------------------------
    def to_dict(self) -> dict[str, np.ndarray]:
        """Every column as an array over all rows, keyed `"collection.name"`.

        The `elapsed.*` columns have a value per row; an entry missing from a row
        is NaN there (float columns), or None (an object array) when its values
        are not all numbers.

        Example:
            >>> import ciclo
            >>> history = ciclo.history()
            >>> history.commit(ciclo.Elapsed.create(), ciclo.logs().add_loss("l", 1.0))
            >>> history.commit(ciclo.Elapsed.create(steps=1), ciclo.logs())
            >>> columns = history.to_dict()
            >>> columns["elapsed.steps"].tolist(), columns["losses.l"].tolist()
            ([0, 1], [1.0, nan])
        """
        self._flush()
        out: dict[str, np.ndarray] = {}
        for (collection, name), column in self._columns.items():
            values = column.values
            if isinstance(column, _ElapsedColumn):
                out[f"{collection}.{name}"] = np.asarray(values)
                continue
            rows = np.asarray(column.rows, dtype=np.int64)
            numbers = isinstance(values, array.array)
            full = (
                np.full(self._rows, np.nan)
                if numbers
                else np.full(self._rows, None, dtype=object)
            )
            if numbers:
                full[rows] = np.asarray(values, dtype=np.float64)
            else:
                for row, value in zip(rows.tolist(), values):
                    full[row] = value
            out[f"{collection}.{name}"] = full
        return out

    def to_pandas(self) -> Any:
        """The history as a `pandas.DataFrame`, a row per committed step and a
        column per `"collection.name"` (see `to_dict`).

        Raises:
            ImportError: if pandas is not installed.

        Example:
            >>> import ciclo
            >>> history = ciclo.history()
            >>> history.commit(ciclo.Elapsed.create(), ciclo.logs().add_loss("l", 1.0))
            >>> history.to_pandas()["losses.l"].tolist()
            [1.0]
        """
        try:
            import pandas
        except ImportError:
            raise ImportError(
                "History.to_pandas needs pandas, which is not installed: "
                "pip install pandas."
            ) from None
        return pandas.DataFrame(self.to_dict())

    def plot(self, *keys: str, path: Any = None, x: str = "steps") -> Any:
        """Plots learning curves with matplotlib; returns the figure.

        One axis per key, steps on x: a key's train series and its `_test` (any
        `<key>_<suffix>`) series share the axis, so `history.plot("loss",
        "accuracy")` shows train and test loss together and train and test
        accuracy together. Without keys: every loss and metric logged (test
        series join their train one). A key is a bare name or
        `"collection.name"`.

        Args:
            *keys: the entries to plot.
            path: when given, the figure is also written there as a PNG.
            x: the elapsed field on the x axis (`"steps"`, `"samples"`, `"time"`).

        Returns:
            The `matplotlib.figure.Figure` (not shown; call `plt.show()`).

        Raises:
            ImportError: if matplotlib is not installed ("install ciclo[plot]").
            ValueError: if a key was never logged.

        Example:
            >>> import os, tempfile, ciclo
            >>> history = ciclo.history()
            >>> for step in range(3):
            ...     logs = ciclo.logs().add_loss("loss", 1.0 / (step + 1))
            ...     if step == 2:
            ...         _ = logs.add_loss("loss_test", 0.4)
            ...     history.commit(ciclo.Elapsed.create(steps=step), logs)
            >>> path = os.path.join(tempfile.mkdtemp(), "curves.png")
            >>> figure = history.plot("loss", path=path)
            >>> [line.get_label() for line in figure.axes[0].get_lines()]
            ['loss', 'loss_test']
            >>> os.path.getsize(path) > 0
            True
        """
        from ciclo._plot import plot  # matplotlib only when a plot is asked for

        return plot(self, keys, path, x)


def _values(column: _Column | _ElapsedColumn) -> list[Any]:
    values = column.values
    return values.tolist() if isinstance(values, array.array) else list(values)


def history(lag: int = 64) -> History:
    """Creates an empty `History`.

    Example:
        >>> import ciclo
        >>> len(ciclo.history())
        0
    """
    return History(lag=lag)
