"""The run's `History` in a checkpoint, bit for bit: pieces of rows as JSON.

A checkpoint's history is saved as pieces, each a run of rows (`Piece`: rows
`start` to `stop`). `snapshot` takes, on the loop's thread, the rows since the
previous save (host copies of those rows only) and the step's row when it is not
committed yet; `encode` writes a piece as JSON (in orbax's background thread),
`decode` reads it back, and `join` puts pieces together as one `History` would
have held them (a column that turned from ints to floats, or to a list when a
non-number arrived, turns so across pieces too). How the pieces are laid out in
a checkpoint is `history_segments`.

Numeric columns are stored as base64 of their raw bytes (`array.array`), and
logged values that are not plain numbers (numpy arrays and scalars, lists,
tuples, dicts) as tagged JSON, so that values come back exactly; a value a
checkpoint cannot store (a Python object) is left out of the saved history with
a warning, and the state still saves. Checkpoints written before ciclo saved the
history in pieces hold it whole in one JSON (`history_from_json`); those written
before ciclo saved the history have none and restore an empty one.
"""

from __future__ import annotations

import array
import base64
import dataclasses
import itertools
import json
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from ciclo._history.columns import Column
from ciclo._history.history import History
from ciclo._input.batch import Steps
from ciclo._logs import Logs
from ciclo._time import Elapsed
from ciclo._warn import warn

__all__ = [
    "Piece",
    "decode",
    "encode",
    "history_from_json",
    "join",
    "snapshot",
    "to_history",
]

_ELAPSED_TYPES = ("q", "q", "d", "d")  # steps, samples, time, date


@dataclasses.dataclass
class Piece:
    """Rows `start` to `stop` of a history as host data: the four `elapsed`
    fields of those rows, and per logged entry `(collection, name, rows,
    values)`, `rows` the indices (from the history's first row) of the rows
    that logged it and `values` an `array.array` (numbers) or a list."""

    start: int
    stop: int
    elapsed: list[array.array]
    columns: list[tuple[str, str, array.array, array.array | list]]

    @classmethod
    def empty(cls, at: int = 0) -> Piece:
        return cls(at, at, [array.array(t) for t in _ELAPSED_TYPES], [])


# -- on the loop's thread -------------------------------------------------------------
def snapshot(
    history: History,
    start: int,
    row: tuple[Elapsed, Logs] | None = None,
    batch: Any = None,
) -> tuple[Piece, Piece | None]:
    """The rows of `history` from `start` on (their lagged values fetched first),
    and the step's row `row` — `(elapsed, logs)`, not committed yet — as a piece
    of its own (None without one).

    When `batch` is a fused call (`ciclo.Steps`) whose step left per-step logs,
    `row` stands for its `batch.n` rows, committed as the loop commits them
    (`commit_steps`): every step of the call is saved with its own values.
    Values a checkpoint cannot store are left out, with a warning."""
    state = history.rows_since(start)
    piece = Piece(start, state["rows"], state["elapsed"], _storable(state["columns"]))
    fused = type(batch) is Steps and batch.rows is not None
    if row is None or not (row[1] or fused):
        return piece, None
    pending = History(lag=history.lag)  # the row(s) alone, committed as the loop does
    if fused:
        pending.commit_steps(row[0], batch, row[1])
    else:
        pending.commit(*row)
    state = pending.rows_since(0)
    first = piece.stop
    columns = [
        (c, n, array.array("q", [first + r for r in rows]), values)
        for c, n, rows, values in state["columns"]
    ]
    tail = Piece(first, first + state["rows"], state["elapsed"], _storable(columns))
    return piece, tail


def _storable(columns: list[tuple]) -> list[tuple]:
    """`columns` without the values a checkpoint cannot store (said in a
    warning). Checked here, on the caller's thread; encoded in the background."""
    out = []
    for collection, name, rows, values in columns:
        if isinstance(values, list):
            where = f"{collection}.{name}"
            bad = None
            for i, value in enumerate(values):
                try:
                    _check(value, where)
                except TypeError as error:
                    bad = (i, error)
                    break
            if bad is not None:
                keep = [i for i, v in enumerate(values) if _fits(v)]
                warn(
                    f"{bad[1]} Its value(s) at {len(values) - len(keep)} row(s) "
                    f"are left out of the saved history."
                )
                rows = array.array("q", [rows[i] for i in keep])
                values = [values[i] for i in keep]
                if not keep:
                    continue
        out.append((collection, name, rows, values))
    return out


def _fits(value: Any) -> bool:
    try:
        _check(value, "")
    except TypeError:
        return False
    return True


def _check(value: Any, where: str) -> None:
    """Raises the TypeError `_encode` would raise for `value` (nothing encoded)."""
    if value is None or isinstance(value, bool | str | int | float):
        return
    if isinstance(value, np.ndarray | np.generic):
        if value.dtype.hasobject:
            raise TypeError(
                f"ciclo.checkpoint: history entry {where} holds a numpy array of "
                f"Python objects, which a checkpoint cannot store; log numbers or "
                f"numeric arrays."
            )
        return
    if isinstance(value, list | tuple):
        for v in value:
            _check(v, where)
        return
    if isinstance(value, Mapping):
        for v in value.values():
            _check(v, where)
        return
    raise TypeError(
        f"ciclo.checkpoint: history entry {where} holds a {type(value).__name__}, "
        f"which a checkpoint cannot store (it saves the history beside the state); "
        f"log numbers, strings or arrays (lists/dicts of them) to resume it."
    )


# -- encoding (in the background) ----------------------------------------------------------
def _bytes(values: array.array) -> dict[str, str]:
    return {"typecode": values.typecode, "b64": base64.b64encode(values).decode()}


def _from_bytes(item: Mapping[str, str]) -> array.array:
    values = array.array(item["typecode"])
    values.frombytes(base64.b64decode(item["b64"]))
    return values


def _encode(value: Any) -> Any:
    """A logged value (on the host, checked by `_check`) as JSON, exactly."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int | float):
        return {"float": value.hex()} if isinstance(value, float) else value
    if isinstance(value, np.ndarray | np.generic):
        data = np.asarray(value)  # tobytes() is C order
        kind = "ndarray" if isinstance(value, np.ndarray) else "scalar"
        return {
            kind: base64.b64encode(data.tobytes()).decode(),
            "dtype": data.dtype.name,  # bfloat16 & co. by name
            "shape": list(data.shape),
        }
    if isinstance(value, list | tuple):
        items = [_encode(v) for v in value]
        return {"list": items} if isinstance(value, list) else {"tuple": items}
    return {"dict": [[str(k), _encode(v)] for k, v in value.items()]}


def _decode(item: Any) -> Any:
    if not isinstance(item, dict):
        return item
    (kind, data), *_ = item.items()
    if kind == "float":
        return float.fromhex(data)
    if kind in ("ndarray", "scalar"):
        dtype = jax.numpy.dtype(item["dtype"])
        value = np.frombuffer(base64.b64decode(data), dtype=dtype)
        value = value.reshape(
            tuple(item["shape"])
        ).copy()  # writable, like a fetched one
        return value if kind == "ndarray" else value[()]
    if kind == "list":
        return [_decode(v) for v in data]
    if kind == "tuple":
        return tuple(_decode(v) for v in data)
    return {k: _decode(v) for k, v in data}


def _columns_json(columns: list[tuple], start: int, stop: int) -> list[dict[str, Any]]:
    """The columns of rows `start` to `stop`; `"rows": "all"` for a column logged
    in each of them."""
    return [
        {
            "collection": collection,
            "name": name,
            "rows": "all" if len(rows) == stop - start else _bytes(rows),
            "values": (
                _bytes(values)
                if isinstance(values, array.array)
                else {"list": [_encode(v) for v in values]}
            ),
        }
        for collection, name, rows, values in columns
    ]


def _columns_from_json(
    saved: list[Mapping[str, Any]], start: int, stop: int
) -> list[tuple]:
    columns = []
    for column in saved:
        rows = column["rows"]
        if rows == "all":
            rows = array.array("q")
            rows.frombytes(np.arange(start, stop, dtype=np.int64).tobytes())
        else:
            rows = _from_bytes(rows)
        values = column["values"]
        values = (
            [_decode(v) for v in values["list"]]
            if "list" in values
            else _from_bytes(values)
        )
        if len(rows) != len(values):
            raise ValueError("a column of a saved history holds rows without values")
        columns.append((column["collection"], column["name"], rows, values))
    return columns


def encode(piece: Piece) -> bytes:
    """`piece` as the bytes of a JSON file (rows counted from the history's first)."""
    return json.dumps(
        {
            "start": piece.start,
            "stop": piece.stop,
            "elapsed": [_bytes(f) for f in piece.elapsed],
            "columns": _columns_json(piece.columns, piece.start, piece.stop),
        }
    ).encode()


def decode(data: bytes) -> Piece:
    """The piece `encode` wrote.

    Raises:
        ValueError: if `data` is not such a piece (damaged)."""
    try:
        item = json.loads(data)
        start, stop = int(item["start"]), int(item["stop"])
        piece = Piece(
            start,
            stop,
            [_from_bytes(f) for f in item["elapsed"]],
            _columns_from_json(item["columns"], start, stop),
        )
    except (KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"not a piece of a saved history ({error!r})") from None
    if any(len(f) != piece.stop - piece.start for f in piece.elapsed):
        raise ValueError("a piece of a saved history holds rows it does not count")
    return piece


# -- joining -------------------------------------------------------------------------------
def join(pieces: list[Piece]) -> Piece:
    """The pieces (consecutive, in order) as one, each column's values joined as
    a `History` appends them (ints then floats: floats; numbers then another
    value: a list).

    Raises:
        ValueError: if the pieces do not follow each other."""
    if not pieces:
        return Piece.empty()
    if len(pieces) == 1:
        return pieces[0]
    for a, b in itertools.pairwise(pieces):
        if a.stop != b.start:
            raise ValueError(
                f"the saved history's pieces do not follow each other: rows "
                f"{a.start}-{a.stop}, then {b.start}-{b.stop}"
            )
    elapsed = [array.array(t) for t in _ELAPSED_TYPES]
    joined: dict[tuple[str, str], Column] = {}
    for piece in pieces:
        for field, values in zip(elapsed, piece.elapsed):
            field.extend(values)
        for collection, name, rows, values in piece.columns:
            column = joined.get((collection, name))
            if column is None:
                column = joined[(collection, name)] = Column()
                column.values = _copy(values)
                column.rows = array.array("q", rows)
                continue
            column.rows.extend(rows)
            _append(column, values)
    return Piece(
        pieces[0].start,
        pieces[-1].stop,
        elapsed,
        [(c, n, col.rows, col.values) for (c, n), col in joined.items()],
    )


def _copy(values: array.array | list) -> array.array | list:
    return (
        array.array(values.typecode, values)
        if isinstance(values, array.array)
        else list(values)
    )


def _append(column: Column, values: array.array | list) -> None:
    """Appends `values` to `column` as the history appended them."""
    held = column.values
    if isinstance(values, array.array):
        if isinstance(held, list):
            held.extend(values.tolist())
        elif held.typecode == values.typecode:
            held.extend(values)
        elif held.typecode == "q":  # ints, then floats: floats
            column.values = array.array("d", held)
            column.values.extend(values.tolist())
        else:
            held.extend(values.tolist())
        return
    for value in values:  # numbers, then another value: a list (`Column.append`)
        column.append(value)


def to_history(piece: Piece, lag: int) -> History:
    """The `History` of `piece` (rows 0 to `piece.stop`; its arrays are taken)."""
    history = History.__new__(History)
    history.__setstate__(
        {
            "lag": lag,
            "rows": piece.stop,
            "elapsed": piece.elapsed,
            "columns": piece.columns,
        }
    )
    return history


# -- the format before pieces ------------------------------------------------------------
def history_from_json(item: Mapping[str, Any] | None) -> History:
    """The `History` a checkpoint held whole in one JSON (`history/metadata`,
    before ciclo saved it in pieces; an empty one for None)."""
    if item is None:
        return History()
    rows = int(item["rows"])
    piece = Piece(
        0,
        rows,
        [_from_bytes(field) for field in item["elapsed"]],
        _columns_from_json(item["columns"], 0, rows),
    )
    return to_history(piece, int(item.get("lag", 64)))
