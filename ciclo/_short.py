"""`short`: a value as an error message shows it (one line, arrays by shape)."""

from __future__ import annotations

from typing import Any

__all__ = ["short"]


def short(value: Any, limit: int = 100) -> str:
    """`value` for an error message, on one line: an array by its type, shape and
    dtype (never its multi-line repr), anything else by its repr cut at `limit`."""
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is not None and dtype is not None and not isinstance(value, type):
        return f"a {type(value).__name__} of shape {tuple(shape)} and dtype {dtype}"
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
