"""What a writer writes: a `Row` per step (its elapsed fields and entries), the
single-number values that go in it (`numeric`, `host_scalar`), and the tag of
each entry name (`Tags`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ciclo._short import short

__all__ = ["ELAPSED_COLUMNS", "Row", "Tags", "host_scalar", "numeric"]

ELAPSED_COLUMNS = ("steps", "samples", "time", "completed")


def host_scalar(value: Any) -> int | float | None:
    """A host value as a Python int/float when it is a single number, else None."""
    if isinstance(value, bool | np.bool_):
        return int(value)
    if isinstance(value, int | float):
        return value
    if isinstance(value, np.ndarray | np.generic) and value.size == 1:
        kind = value.dtype.kind
        if kind == "b":
            return int(value.reshape(()))
        if kind in "iu":
            return int(value.reshape(()))
        if kind == "f" or (kind == "V" and np.issubdtype(value.dtype, np.floating)):
            return float(value.reshape(()))
        try:  # ml_dtypes such as bfloat16
            return float(value.reshape(()).astype(np.float32))
        except (TypeError, ValueError):
            return None
    return None


class Tags:
    """A writer's tag for each entry name: the bare name, or with a prefix.

    `prefix` is None (bare names), a string put before every name (`"train/"`),
    or a dict from a test name to its prefix, `""` standing for entries of no
    listed test: `{"": "train/", "test": "val/"}` writes `loss` as `train/loss`
    and `loss_test` (train_loop's test loop, `test_name="test"`) as `val/loss`.
    """

    def __init__(self, prefix: str | Mapping[str, str] | None, owner: str):
        if prefix is None or isinstance(prefix, str):
            self._default, self._tests = prefix or "", {}
        elif isinstance(prefix, Mapping) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in prefix.items()
        ):
            self._default = prefix.get("", "")
            self._tests = {f"_{k}": v for k, v in prefix.items() if k}
        else:
            raise TypeError(
                f"ciclo.{owner}: `prefix` must be None, a string such as 'train/', "
                f"or a dict from a test name to its prefix such as "
                f"{{'': 'train/', 'test': 'val/'}}; got {short(prefix)}."
            )
        self._cache: dict[str, str] = {}

    def __call__(self, name: str) -> str:
        tag = self._cache.get(name)
        if tag is None:
            tag = self._default + name
            for suffix, prefix in self._tests.items():
                if name.endswith(suffix) and len(name) > len(suffix):
                    tag = prefix + name[: -len(suffix)]
                    break
            self._cache[name] = tag
        return tag


_NUMBERS = (bool, int, float, np.float32, np.float64, np.int32, np.int64, np.bool_)


def numeric(value: Any) -> bool:
    """Cheap per-step filter: could `value` be a single number (no conversion)."""
    if type(value) in _NUMBERS or isinstance(value, bool | int | float | np.number):
        return True
    shape = getattr(value, "shape", None)
    return shape is not None and (shape == () or math.prod(shape) == 1)


class Row:
    """One step: its elapsed fields and `{entry name: value}` (values may still be
    on the device)."""

    __slots__ = ("completed", "entries", "samples", "steps", "time")

    def __init__(
        self,
        steps: int,
        samples: int,
        time: float,
        entries: dict,
        completed: int | None = None,
    ):
        self.steps, self.samples, self.time = steps, samples, time
        self.entries = entries
        self.completed = steps + 1 if completed is None else completed

    @classmethod
    def of(cls, elapsed: Any, entries: dict) -> Row:
        return cls(
            int(elapsed.steps), int(elapsed.samples), float(elapsed.time), entries
        )
