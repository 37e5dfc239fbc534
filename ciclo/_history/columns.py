"""The cells of a `History`: a column per logged entry (`Column`) and per `elapsed`
field (`ElapsedColumn`).

A scalar costs 8 bytes in a typed `array.array`; anything else is kept in a list.
`HistoryStore` (`ciclo._history.store`) fills them, `History` reads them.
"""

from __future__ import annotations

import array
from typing import Any

import jax.numpy as jnp
import numpy as np

__all__ = ["Column", "ElapsedColumn", "column_values"]


class Column:
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
        if (
            type(value) is float
            and type(values) is array.array
            and values.typecode == "d"
        ):  # the common host number: no conversion
            values.append(value)
            return
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
            # copied in bulk, as the typed array's own 8-byte items
            if kind in "iu" and self.values.typecode == "q":
                self.values.frombytes(values.astype(np.int64).tobytes())
                return
            if kind == "f" and values.dtype.itemsize >= 4:
                if self.values.typecode == "q":
                    self.values = array.array("d", self.values)
                self.values.frombytes(values.astype(np.float64).tobytes())
                return
        for value in values:
            self.append(value)


class ElapsedColumn:
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


def column_values(column: Column | ElapsedColumn) -> list[Any]:
    values = column.values
    return values.tolist() if isinstance(values, array.array) else list(values)
