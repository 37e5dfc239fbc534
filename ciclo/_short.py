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
    text = _brief(value, 3) if isinstance(value, list | tuple | dict) else None
    if text is None:
        text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _brief(value: Any, depth: int) -> str:
    """A container with its arrays shown by type, shape and dtype (its first
    items; a few levels deep): `[(ndarray(16, 8) float64, ndarray(16,) float64)]`."""
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is not None and dtype is not None and not isinstance(value, type):
        return f"{type(value).__name__}{tuple(shape)} {dtype}"
    if depth == 0 or not isinstance(value, list | tuple | dict):
        return " ".join(repr(value).split())[:40]
    if isinstance(value, dict):
        items = [f"{k!r}: {_brief(v, depth - 1)}" for k, v in list(value.items())[:3]]
        more = ", ..." if len(value) > 3 else ""
        return "{" + ", ".join(items) + more + "}"
    items = [_brief(v, depth - 1) for v in value[:3]]
    more = f", ... ({len(value)} items)" if len(value) > 3 else ""
    if isinstance(value, tuple):
        return "(" + ", ".join(items) + ("," if len(value) == 1 else "") + more + ")"
    return "[" + ", ".join(items) + more + "]"
