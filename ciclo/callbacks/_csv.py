"""`csv_logger` and `jsonl_logger`: a row per logged step in a local file."""

from __future__ import annotations

import csv
import io
import json
import math
import os
from typing import Any, TextIO

from ciclo._logs import SHOWN_COLLECTIONS
from ciclo._short import short
from ciclo.callbacks._rows import ELAPSED_COLUMNS, Row
from ciclo.callbacks._writer import Writer

__all__ = ["csv_logger", "jsonl_logger"]

_JSON = json.JSONEncoder()  # what json.dumps uses by default
# json's text of the floats `repr` spells otherwise
_SPECIAL = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}
_ELAPSED = frozenset(ELAPSED_COLUMNS)
_INF = math.inf


def _record(row: Row) -> dict[str, Any]:
    """A row as one dict: its elapsed fields, then its entries (an entry named
    like an elapsed field takes its place)."""
    record = {
        "steps": row.steps,
        "samples": row.samples,
        "time": row.time,
        "completed": row.completed,
    }
    record.update(row.entries)
    return record


def _json_line(row: Row, keys: dict[str, str]) -> str | None:
    """`json.dumps` of a row's record (its elapsed fields, then its entries),
    written out for the common row of Python numbers (`keys`: each entry name's
    JSON key, cached); None for any other row (then `json` encodes it)."""
    steps, samples, time, completed = row.steps, row.samples, row.time, row.completed
    if (
        type(steps) is not int
        or type(samples) is not int
        or type(completed) is not int
        or type(time) is not float
        or not -_INF < time < _INF  # nan, inf
    ):
        return None
    cells = [
        f'{{"steps": {steps!r}, "samples": {samples!r}, "time": {time!r}, '
        f'"completed": {completed!r}'
    ]
    for name, value in row.entries.items():
        kind = type(value)
        if kind is float:
            text = f"{value!r}"
            if text[-1] in "fn":  # inf, -inf, nan
                text = _SPECIAL[text]
        elif kind is int:
            text = f"{value!r}"
        else:
            return None
        key = keys.get(name)
        if key is None:
            if type(name) is not str or name in _ELAPSED:
                return None  # an entry named like an elapsed field replaces it
            key = keys[name] = f"{json.dumps(name)}: "
        cells.append(key + text)
    return ", ".join(cells) + "}"


class _FileWriter(Writer):
    """A writer to one local file, truncated at its first write (unless `append`)
    and appended to afterwards, also by later loops using the same object."""

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        append: bool = False,
        collections: tuple[str, ...] = SHOWN_COLLECTIONS,
        max_pending: int = 256,
        every: int = 32,
    ):
        super().__init__(collections=collections, max_pending=max_pending, every=every)
        if not isinstance(path, str | os.PathLike):
            raise TypeError(f"`path` must be a file path, got {short(path)}.")
        self.path = os.fspath(path)
        self._append = bool(append)
        self._file: TextIO | None = None

    def _target(self) -> str:
        return self.path

    def _open(self, rows: list[Row]) -> TextIO:
        if self._file is None:
            directory = os.path.dirname(self.path)
            if directory:
                os.makedirs(directory, exist_ok=True)
            mode = "a" if self._append else "w"
            if not self._append:  # the first write: an earlier run's rows below
                start = self._resume_point(rows)  # the start step stay
                if start > 0 and os.path.exists(self.path):
                    self._keep_below(start)
                    mode = "a"
            self._opened = True
            self._file = open(self.path, mode, newline="")  # noqa: SIM115
            self._append = True  # later opens (a new loop) continue the file
        return self._file

    def _keep_below(self, start: int) -> None:
        """Rewrites the file with its rows of steps below `start` (atomically)."""
        raise NotImplementedError

    def _begin(self) -> None:
        self._open([])

    def _close(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            file.close()


class jsonl_logger(_FileWriter):
    """Writes a JSON object per logged step to a JSON-lines file.

    Each line holds `steps`, `samples`, `time` (the loop's elapsed before the batch,
    as in `History`) and the step's single-number losses, metrics and stateful
    metrics by bare name (`{"steps": 3, "samples": 96, "time": 0.41, "loss":
    0.52}`); NaN and infinities are written as `NaN` / `Infinity` (Python's
    `json` reads them back). Rows are written lagged, once the device has computed
    them, in batches (see `every`), each flushed; at the end of the loop (also on
    Ctrl-C or an error) the remaining rows are written and the file is closed, so
    every row committed to the history is in the file when the loop returns.

    Registration and use as `ciclo.tensorboard`: `on_train_batch_end` in
    `train_loop(callbacks=[...])`, `**` last in a `ciclo.loop` task dict, or by
    hand `logger(elapsed, logs)` then `logger.close()`.

    Args:
        path: the file; its directory is created. The first write truncates it
            (unless `append=True`); later loops with the same logger append.
        append: keep an existing file's lines.
        collections: the collections written.
        max_pending: kept for compatibility (the history bounds the rows that
            wait for the device).
        every: used by hand, the rows between two writes (in a loop, rows are
            written when the loop's history brings them to the host, at its end,
            Ctrl-C and `close()`); never one write per step.

    Example:
        >>> import json, os, tempfile, ciclo
        >>> path = os.path.join(tempfile.mkdtemp(), "log.jsonl")
        >>> def train_step(state, batch):
        ...     return ciclo.logs().add_loss("loss", float(batch)), state
        >>> _ = ciclo.loop(
        ...     None, range(3), {ciclo.every(1): train_step, **ciclo.jsonl_logger(path)})
        >>> with open(path) as file:
        ...     [json.loads(line)["loss"] for line in file]
        [0.0, 1.0, 2.0]
    """

    def _keep_below(self, start: int) -> None:
        kept = []
        with open(self.path) as file:
            for line in file:
                try:
                    steps = int(json.loads(line)["steps"])
                except (ValueError, KeyError, TypeError):
                    continue  # a line cut by the crash
                if steps < start:
                    kept.append(line if line.endswith("\n") else line + "\n")
        _replace(self.path, "".join(kept))

    def _write(self, rows: list[Row]) -> None:
        if not rows:
            return
        file = self._open(rows)
        encode, lines = _JSON.encode, []
        keys = self.__dict__.setdefault("_json_keys", {})  # name -> its JSON key
        for row in rows:
            line = _json_line(row, keys)
            if line is None:  # not all Python numbers: json encodes it
                line = encode(_record(row))
            lines.append(line)
        lines.append("")
        file.write("\n".join(lines))
        self.rows_written += len(rows)
        file.flush()


class csv_logger(_FileWriter):
    """Writes a CSV row per logged step.

    The columns are `steps`, `samples`, `time` (the loop's elapsed before the
    batch, as in `History`), then the single-number losses, metrics and stateful
    metrics by bare name in the order first logged; a step that did not log an
    entry leaves its cell empty. When a new entry appears (`accuracy_test` after
    the first epoch), the file is rewritten with the wider header (to a temporary
    file, then atomically renamed over the old one), so no row is lost. Rows are
    written lagged, once the device has computed them, in batches (see `every`),
    each flushed; at the end of the loop (also on Ctrl-C or an error) the remaining
    rows are written and the file is closed, so every row committed to the history
    is in the file when the loop returns.

    Registration and use as `ciclo.tensorboard`. Read it back with
    `csv.DictReader` or `pandas.read_csv`.

    Args:
        path: the file; its directory is created. The first write truncates it
            (unless `append=True`, which keeps its rows and header); later loops
            with the same logger append.
        append: keep an existing file's rows.
        collections: the collections written.
        max_pending: kept for compatibility (the history bounds the rows that
            wait for the device).
        every: used by hand, the rows between two writes (in a loop, rows are
            written when the loop's history brings them to the host, at its end,
            Ctrl-C and `close()`); never one write per step.

    Example:
        >>> import csv, os, tempfile, ciclo
        >>> path = os.path.join(tempfile.mkdtemp(), "log.csv")
        >>> def train_step(state, batch):
        ...     logs = ciclo.logs().add_loss("loss", float(batch))
        ...     if batch == 2:
        ...         logs.add_metric("accuracy", 0.5)  # a new column
        ...     return logs, state
        >>> _ = ciclo.loop(
        ...     None, range(3), {ciclo.every(1): train_step, **ciclo.csv_logger(path)})
        >>> with open(path, newline="") as file:
        ...     [(r["steps"], r["loss"], r["accuracy"]) for r in csv.DictReader(file)]
        [('0', '0.0', ''), ('1', '1.0', ''), ('2', '2.0', '0.5')]
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        append: bool = False,
        collections: tuple[str, ...] = SHOWN_COLLECTIONS,
        max_pending: int = 256,
        every: int = 32,
    ):
        super().__init__(
            path,
            append=append,
            collections=collections,
            max_pending=max_pending,
            every=every,
        )
        self._fields: list[str] = []

    def _open(self, rows: list[Row]) -> TextIO:
        if self._file is None and self._append and not self._fields:
            self._fields = _header(self.path)  # an existing file: keep its columns
        return super()._open(rows)

    def _keep_below(self, start: int) -> None:
        fields = _header(self.path)
        with open(self.path, newline="") as file:
            rows = list(csv.DictReader(file))
        kept = []
        for row in rows:
            try:
                steps = int(row.get("steps") or "")
            except ValueError:
                continue  # a row cut by the crash
            if steps < start and None not in row and None not in row.values():
                kept.append(row)
        self._fields = fields
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fields, restval="")
        writer.writeheader()
        writer.writerows(kept)
        _replace(self.path, buffer.getvalue())

    def _write(self, rows: list[Row]) -> None:
        if not rows:
            return
        file = self._open(rows)
        new = []
        known = set(self._fields).difference(ELAPSED_COLUMNS)
        clash = False  # an entry named like an elapsed column (its value wins)
        for row in rows:
            for name in row.entries:
                if name not in known:
                    if name in ELAPSED_COLUMNS:
                        clash = True
                    else:
                        known.add(name)
                        new.append(name)
        if new or not self._fields:
            fields = self._fields or list(ELAPSED_COLUMNS)
            self._fields = fields + new
            file = self._rewrite()
        fields, lines = self._fields, []
        n = len(ELAPSED_COLUMNS)
        if not clash and tuple(fields[:n]) == ELAPSED_COLUMNS:  # ciclo's header
            names = fields[n:]
            for row in rows:  # the cells in the header's order ("" where not logged)
                get = row.entries.get  # numbers: csv writes nan/inf as float() reads
                lines.append(
                    [row.steps, row.samples, row.time, row.completed]
                    + [get(name, "") for name in names]
                )
        else:  # a header of another order (an existing file's), or a clash
            for row in rows:
                cells = _record(row)
                lines.append([cells.get(field, "") for field in fields])
        csv.writer(file).writerows(lines)
        self.rows_written += len(lines)
        file.flush()

    def _rewrite(self) -> TextIO:
        """Rewrites the file with the current header and its rows so far."""
        assert self._file is not None
        self._file.close()
        self._file = None
        rows: list[dict[str, str]] = []
        if os.path.exists(self.path) and os.path.getsize(self.path):
            with open(self.path, newline="") as old:
                rows = list(csv.DictReader(old))
        temporary = self.path + ".tmp"
        with open(temporary, "w", newline="") as new:
            writer = csv.DictWriter(new, self._fields, restval="")
            writer.writeheader()
            writer.writerows(rows)
        os.replace(temporary, self.path)
        self._file = open(self.path, "a", newline="")  # noqa: SIM115
        return self._file


def _replace(path: str, text: str) -> None:
    """Writes `text` to `path` through a temporary file renamed over it."""
    temporary = path + ".tmp"
    with open(temporary, "w", newline="") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)


def _header(path: str) -> list[str]:
    if not os.path.exists(path) or not os.path.getsize(path):
        return []
    with open(path, newline="") as file:
        return next(csv.reader(file), [])
