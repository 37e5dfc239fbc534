"""The `history` item of a checkpoint: the run's `History` as JSON, bit for bit.

Each checkpoint holds the run's `History` up to the save (this step's logs
included), so that a resumed run continues it. Numeric columns are stored as
base64 of their raw bytes (`array.array`), and logged values that are not plain
numbers (numpy arrays and scalars, lists, tuples, dicts) as tagged JSON, so that
values come back exactly; an entry a checkpoint cannot store (a Python object) is
left out of the saved history with a warning, and the state still saves.
Checkpoints written before ciclo saved the history have no `history` item and
restore an empty one.
"""

from __future__ import annotations

import array
import base64
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from ciclo._history.history import History
from ciclo._input.batch import Steps
from ciclo._logs import Logs
from ciclo._time import Elapsed
from ciclo._warn import warn

__all__ = ["history_from_json", "history_json"]


def _bytes(values: array.array) -> dict[str, str]:
    return {"typecode": values.typecode, "b64": base64.b64encode(values).decode()}


def _from_bytes(item: Mapping[str, str]) -> array.array:
    values = array.array(item["typecode"])
    values.frombytes(base64.b64decode(item["b64"]))
    return values


def _encode(value: Any, where: str) -> Any:
    """A logged value (already on the host) as JSON, exactly."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int | float):
        return {"float": value.hex()} if isinstance(value, float) else value
    if isinstance(value, np.ndarray | np.generic):
        if value.dtype.hasobject:
            raise TypeError(
                f"ciclo.checkpoint: history entry {where} holds a numpy array of "
                f"Python objects, which a checkpoint cannot store; log numbers or "
                f"numeric arrays."
            )
        data = np.asarray(value)  # tobytes() is C order
        kind = "ndarray" if isinstance(value, np.ndarray) else "scalar"
        return {
            kind: base64.b64encode(data.tobytes()).decode(),
            "dtype": data.dtype.name,  # bfloat16 & co. by name
            "shape": list(data.shape),
        }
    if isinstance(value, list | tuple):
        items = [_encode(v, where) for v in value]
        return {"list": items} if isinstance(value, list) else {"tuple": items}
    if isinstance(value, Mapping):
        return {"dict": [[str(k), _encode(v, where)] for k, v in value.items()]}
    raise TypeError(
        f"ciclo.checkpoint: history entry {where} holds a {type(value).__name__}, "
        f"which a checkpoint cannot store (it saves the history beside the state); "
        f"log numbers, strings or arrays (lists/dicts of them) to resume it."
    )


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


def history_json(
    history: History,
    row: tuple[Elapsed, Logs] | None = None,
    batch: Any = None,
) -> dict[str, Any]:
    """`history` (its lagged values fetched first), plus `row` — the current step's
    `(elapsed, logs)`, not committed yet — as the JSON of the `history` item.

    When `batch` is a fused call (`ciclo.Steps`) whose step left per-step logs,
    `row` stands for its `batch.n` rows, committed as the loop commits them
    (`commit_steps`): every step of the call is saved with its own values."""
    state = history.__getstate__()
    fused = type(batch) is Steps and batch.rows is not None
    if row is not None and (row[1] or fused):
        copy = History.__new__(History)
        copy.__setstate__(state)  # takes the copied arrays: `history` is untouched
        if fused:
            copy.commit_steps(row[0], batch, row[1])
        else:
            copy.commit(*row)
        state = copy.__getstate__()
    columns = []
    for collection, name, rows, values in state["columns"]:
        where = f"{collection}.{name}"
        if isinstance(values, array.array):
            encoded = _bytes(values)
        else:
            try:
                encoded = {"list": [_encode(v, where) for v in values]}
            except TypeError as error:  # the state still saves; this entry doesn't
                warn(f"{error} Entry {where} is left out of the saved history.")
                continue
        columns.append(
            {
                "collection": collection,
                "name": name,
                "rows": _bytes(rows),
                "values": encoded,
            }
        )
    return {
        "version": 1,
        "rows": state["rows"],
        "lag": state["lag"],
        "elapsed": [_bytes(f) for f in state["elapsed"]],
        "columns": columns,
    }


def history_from_json(item: Mapping[str, Any] | None) -> History:
    """The `History` saved by `history_json` (an empty one for None)."""
    if item is None:
        return History()
    columns = []
    for saved in item["columns"]:
        values = saved["values"]
        values = (
            [_decode(v) for v in values["list"]]
            if "list" in values
            else _from_bytes(values)
        )
        columns.append(
            (saved["collection"], saved["name"], _from_bytes(saved["rows"]), values)
        )
    history = History.__new__(History)
    history.__setstate__(
        {
            "lag": int(item.get("lag", 64)),
            "rows": int(item["rows"]),
            "elapsed": [_from_bytes(field) for field in item["elapsed"]],
            "columns": columns,
        }
    )
    return history
