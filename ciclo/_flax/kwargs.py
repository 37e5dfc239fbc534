"""Calling losses and metrics with the keyword arguments they name.

A loss or metric declares what it needs by parameter name (`preds`, `target`,
`inputs`, `params`, `batch_stats`, `sample_weight`, `key`, a computed loss's name,
an extra key of a dict batch, ...). Its signature is read once, when the state is
created; each step passes it exactly the arguments it names.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from ciclo._loop.callback import describe as _describe

__all__ = ["KeywordCall"]


class KeywordCall:
    """A callable bound to the keyword arguments it asks for.

    Args:
        kind: what it is, for messages (`"loss"`, `"metric"`, ...).
        name: the name it was given (the key in `losses=` / `metrics=`).
        fn: the callable. Positional-or-keyword and keyword-only parameters are
            filled by name; a `**kwargs` parameter receives every available value.

    Raises:
        TypeError: if `fn` is not callable, its signature cannot be read, or it
            has positional-only parameters without defaults (ciclo passes by name).

    Example:
        >>> from ciclo._flax.kwargs import KeywordCall
        >>> call = KeywordCall("loss", "mse", lambda preds, target: (preds - target) ** 2)
        >>> call({"preds": 3.0, "target": 1.0, "inputs": None})
        4.0
    """

    def __init__(self, kind: str, name: str, fn: Callable[..., Any]):
        if not callable(fn):
            raise TypeError(
                f"{kind} {name!r} must be callable, got {type(fn).__name__}: {fn!r}."
            )
        try:
            parameters = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError) as error:
            raise TypeError(
                f"Cannot read the signature of {kind} {name!r} ({_describe(fn)}): "
                f"{error}. Wrap it in a function with named parameters, e.g. "
                f"lambda preds, target: ..."
            ) from None
        self.kind, self.name, self.fn = kind, name, fn
        self.takes_all = False
        wanted, required = [], []
        for p in parameters:
            if p.kind == p.VAR_KEYWORD:
                self.takes_all = True
            elif p.kind == p.VAR_POSITIONAL:
                continue
            elif p.kind == p.POSITIONAL_ONLY:
                if p.default is p.empty:
                    raise TypeError(
                        f"{kind} {name!r} ({_describe(fn)}) has the positional-only "
                        f"parameter {p.name!r}; ciclo passes arguments by name. Wrap "
                        f"it, e.g. lambda preds, target: fn(preds, target)."
                    )
            else:
                wanted.append(p.name)
                if p.default is p.empty:
                    required.append(p.name)
        self.wanted: tuple[str, ...] = tuple(wanted)
        self.required: tuple[str, ...] = tuple(required)

    def __repr__(self) -> str:
        return f"KeywordCall({self.kind!r}, {self.name!r}, {_describe(self.fn)})"

    def takes(self, argument: str) -> bool:
        """Whether the callable names `argument` (or takes `**kwargs`)."""
        return self.takes_all or argument in self.wanted

    def __call__(self, available: Mapping[str, Any]) -> Any:
        """Calls the function with the entries of `available` it names.

        Raises:
            TypeError: if a required parameter is not in `available`; the message
                names the loss/metric, the argument, and what is available.
        """
        missing = [r for r in self.required if r not in available]
        if missing:
            raise TypeError(
                f"{self.kind} {self.name!r} ({_describe(self.fn)}) asks for the "
                f"argument {missing[0]!r}, which this step does not have. Available "
                f"arguments: {sorted(available)}. Rename the parameter to one of "
                f"them, give it a default, or add it to the batch (a dict batch's "
                f"extra keys are passed by name)."
            )
        given = (
            available
            if self.takes_all
            else {k: available[k] for k in self.wanted if k in available}
        )
        try:
            return self.fn(**given)
        except Exception as error:  # named: the step's own name says little
            shapes = ", ".join(f"{k}: {_shape(v)}" for k, v in given.items())
            error.add_note(
                f"Raised by the {self.kind} {self.name!r} ({_describe(self.fn)}), "
                f"called with {shapes or 'no arguments'}."
            )
            raise


def _shape(value: Any) -> str:
    """An argument as a note shows it: an array by its shape and dtype."""
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        return f"shape {tuple(shape)} {dtype}"
    return type(value).__name__
