"""`History`: the committed logs of a run, read back.

What was stored (`HistoryStore`, `ciclo._history.store`: column-wise, fetched
lagged) read as aligned lists (`collect`), as rows of `Logs` (indexing,
iteration) or exported whole (`to_dict`, `to_pandas`, `plot`).
"""

from __future__ import annotations

import array
import bisect
import difflib
from collections.abc import Iterator
from typing import Any

import numpy as np

from ciclo._history import transfer
from ciclo._history.columns import ElapsedColumn, column_values
from ciclo._history.store import HistoryStore
from ciclo._interrupts import DEFERRED
from ciclo._locate import locate
from ciclo._logs import Logs

__all__ = ["History", "history"]


class History(HistoryStore):
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

        Keys are bare entry names (`"loss"`, `"steps"`) or `"collection.name"`;
        the elapsed keys (`"steps"`, `"samples"`, `"time"`, `"date"`) always
        exist. A key never logged is a `KeyError` suggesting close names (a typo
        is not mistaken for "not logged yet"; `keys()` lists what was logged). An
        entry logged in the step in progress of the loop writing this history,
        not committed yet (an `on_epoch_end` callback reading `"loss_test"` in
        the step that logs it first), gives empty lists.

        Returns:
            A list for one key, a tuple of lists for several.

        Raises:
            KeyError: if a key was never logged.
            ValueError: if a bare name lives in several collections.

        Example:
            >>> import ciclo
            >>> history = ciclo.history()
            >>> logs = ciclo.logs().add_loss("loss", 0.5)
            >>> history.commit(ciclo.Elapsed.create(), logs)
            >>> history.collect("steps", "loss")
            ([0], [0.5])
            >>> history.collect("los")
            Traceback (most recent call last):
            KeyError: "History.collect: 'los' was never logged. Did you mean 'loss'? ..."
        """
        self._flush()
        found = [self._resolve(k) for k in (key, *keys)]
        if any(f is None for f in found):
            live = self._live.logs if self._live is not None else {}
            in_step = [(c, n) for c, entries in live.items() for n in entries]
            for k, f in zip((key, *keys), found):
                if f is None and locate(in_step, k, "the step's logs") is None:
                    raise KeyError(self._never_logged(k))
            return [] if not keys else tuple([] for _ in found)
        columns = [self._columns[f] for f in found]
        if len(columns) == 1:
            return column_values(columns[0])
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

    def _never_logged(self, key: str) -> str:
        """The message for `key`, never logged: close names, where to look."""
        pairs = list(self._columns)
        names = [f"{c}.{n}" for c, n in pairs] if "." in key else [n for _, n in pairs]
        close = difflib.get_close_matches(key, dict.fromkeys(names), n=3)
        guess = " or ".join(repr(k) for k in close)
        return (
            f"History.collect: {key!r} was never logged."
            + (f" Did you mean {guess}?" if guess else "")
            + " `history.keys()` lists what was logged."
        )

    # -- the stream, for observers --------------------------------------------------
    def fetch(self, upto: int | None = None) -> None:
        """Brings the values of the rows below `upto` (all by default) to the host,
        waiting for the device for those rows only (what `on_host` counts)."""
        if upto is None or upto >= self._rows:
            self._flush()
            return
        self._flush(upto)

    def poll(self) -> int:
        """Moves the stream on without waiting: reads the transfers in flight whose
        values are computed and, when none is left in flight, starts one for the
        rows committed since (read by a later poll or commit). For a reader that
        shows the newest values on a clock (a progress bar's redraw) rather than
        every `lag` commits. Returns `on_host`."""
        in_flight = self._in_flight
        with DEFERRED:  # Ctrl-C meanwhile: raised once the rows read are in
            while in_flight and in_flight[0][2].ready():
                self._complete()
            if not in_flight and self._rows > self._started:
                self._start(self._rows)
                if in_flight and in_flight[0][2].ready():  # host values: at once
                    self._complete()
        return self._fetched

    def read_within(self, rows: int | None) -> None:
        """Asks the stream to start a transfer at least every `rows` commits (at
        least every commit), so that a reader that must see rows within about
        `rows` commits (nan_guard's `max_lag`) finds them on the host, computed
        and read, while the device keeps up; None: back to every `lag` commits.
        The bound on rows pending (`4 * lag`) is unchanged."""
        self._every = self.lag if rows is None else max(1, min(self._every, rows))
        self._reschedule()

    def row_at(self, step: int, lo: int = 0) -> int:
        """The index of the first row from `lo` on whose `steps` is `step` or
        more (`len(history)` when none is): rows below it are the steps before
        `step`."""
        steps = self._elapsed[0].values
        return bisect.bisect_left(steps, step, lo, len(steps))

    def latest(self, collections: tuple[str, ...]) -> dict[str, Any]:
        """The newest value on the host of each entry of `collections` (no
        transfer, no wait), by bare name (a name in several of them takes the
        value of the last one listed)."""
        out: dict[str, Any] = {}
        by_collection: dict[str, list[tuple[str, Any]]] = {}
        for (owner, name), column in self._columns.items():
            values = column.values
            if owner in collections and len(values):
                by_collection.setdefault(owner, []).append((name, values[-1]))
        for collection in collections:
            out.update(by_collection.get(collection, ()))
        return out

    def host_entries(
        self, start: int, stop: int
    ) -> list[tuple[int, dict[tuple[str, str], Any]]]:
        """The rows `start` to `stop` that are on the host (below `on_host`; no
        transfer, no wait), each as `(steps, {(collection, name): value})`."""
        stop = min(stop, self._fetched)
        if stop <= start:
            return []
        entries: list[dict[tuple[str, str], Any]] = [{} for _ in range(stop - start)]
        for key, column in self._columns.items():
            if isinstance(column, ElapsedColumn):
                continue
            rows, values = column.rows, column.values
            lo = bisect.bisect_left(rows, start)
            for i in range(lo, bisect.bisect_left(rows, stop, lo)):
                entries[rows[i] - start][key] = values[i]
        steps = self._elapsed[0].values[start:stop]
        return list(zip(steps, entries, strict=True))

    def wait_for(self, values: list[Any]) -> list[Any]:
        """`values` of the step in progress (logged, not committed yet) on the
        host, waiting for them: the stream's one synchronous read, for a reader
        that must see a step before its row is committed (a bar's final line,
        `nan_guard(max_lag=0)`). A value that cannot be read becomes None."""
        return transfer.get(values)

    def host_rows(
        self, start: int, stop: int, collections: tuple[str, ...]
    ) -> list[tuple[int, int, float, dict[str, Any]]]:
        """The rows `start` to `stop` that are on the host (below `on_host`; no
        transfer, no wait), each as `(steps, samples, time, entries)`: `entries`
        maps the bare name of each entry of `collections` to its host value (a
        name in several of them takes the value of the last one listed)."""
        stop = min(stop, self._fetched)
        if stop <= start:
            return []
        entries: list[dict[str, Any]] = [{} for _ in range(stop - start)]
        for collection in collections:
            for (owner, name), column in self._columns.items():
                if owner != collection or isinstance(column, ElapsedColumn):
                    continue
                rows, values = column.rows, column.values
                lo = bisect.bisect_left(rows, start)
                for i in range(lo, bisect.bisect_left(rows, stop, lo)):
                    entries[rows[i] - start][name] = values[i]
        steps, samples, time, _ = self._elapsed
        return list(
            zip(
                steps.values[start:stop],
                samples.values[start:stop],
                time.values[start:stop],
                entries,
                strict=True,
            )
        )

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
            if isinstance(column, ElapsedColumn):
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
            if isinstance(column, ElapsedColumn):
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

        The figure is made through pyplot: in a script `plt.show()` shows it
        (close it with `plt.close(figure)` when making many); in a notebook
        (Jupyter, Colab) it shows inline, once, as the cell's last expression or
        with `plt.show()`.

        Returns:
            The `matplotlib.figure.Figure`, held by pyplot.

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
        from ciclo._history.plot import (
            plot,  # matplotlib only when a plot is asked for
        )

        return plot(self, keys, path, x)


def history(lag: int = 64) -> History:
    """Creates an empty `History`.

    Example:
        >>> import ciclo
        >>> len(ciclo.history())
        0
    """
    return History(lag=lag)
