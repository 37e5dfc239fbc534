"""The cells of a `History`: a column per logged entry (`Column`) and per `elapsed`
field (`ElapsedColumn`).

A scalar costs 8 bytes in a typed `array.array`; anything else is kept in a list.
`HistoryStore` (`ciclo._history.store`) fills them, `History` reads them.
"""

from __future__ import annotations

import array
import operator
from typing import Any

import jax.numpy as jnp
import numpy as np

from ciclo._interrupts import DEFERRED

__all__ = ["Column", "ElapsedColumn", "column_values", "elapsed_columns", "settle"]


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


class ElapsedColumn:
    """An `elapsed` field: present in every row, so its rows are implicit.

    A commit only notes the row's `Elapsed` in the list the four fields share
    (`waiting`, one append per row); reading `values` first moves the waiting
    rows into each field's typed array (`elapsed_columns`)."""

    __slots__ = ("_convert", "_field", "_group", "_values", "waiting")

    def __init__(self, typecode: str, field: str = "steps", waiting=None, group=()):
        self._values = array.array(typecode)
        self._field = operator.attrgetter(field)
        self._convert = int if typecode == "q" else float
        self.waiting: list[Any] = [] if waiting is None else waiting
        self._group: tuple[ElapsedColumn, ...] = group or (self,)

    @property
    def values(self) -> array.array:
        if self.waiting:
            settle(self._group)
        return self._values

    @values.setter
    def values(self, values: array.array) -> None:
        if self.waiting:
            settle(self._group)
        self._values = values

    @property
    def rows(self) -> range:
        return range(len(self.values))


def elapsed_columns(fields: dict[str, str]) -> tuple[ElapsedColumn, ...]:
    """The columns of the `elapsed` fields (`{field: typecode}`), sharing the
    list of the rows' `Elapsed`s that wait to be split into them."""
    waiting: list[Any] = []
    group: list[ElapsedColumn] = []
    for field, typecode in fields.items():
        group.append(ElapsedColumn(typecode, field, waiting))
    for column in group:
        column._group = tuple(group)
    return tuple(group)


def settle(group: tuple[ElapsedColumn, ...]) -> None:
    """Moves the `Elapsed`s waiting in `group`'s shared list into its columns."""
    waiting = group[0].waiting
    with DEFERRED:  # Ctrl-C meanwhile: raised once every column has them
        for column in group:
            column._values.extend(map(column._convert, map(column._field, waiting)))
        waiting.clear()


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
