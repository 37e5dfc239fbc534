"""`ShapeWatch`: a warning, once per loop, when the batches reaching a compiled
step (a `jax.jit` function, a managed or Flax step) take a third shape.

Each new input shape compiles such a step again (seconds, and memory for another
executable), silently. Full batches and a smaller last one are two shapes, which
an epoch's remainder gives every pass: expected, not worth a warning. A third
shape means the data is ragged, so the loop warns once, naming the shapes seen and
the fix (pad, or drop the remainder). The check compares a tuple of the batch's
leaf shapes with those seen (no host sync, no device op), only in loops that have
a compiled step, and stops once it warned.
"""

from __future__ import annotations

import functools
import os
import sys
import warnings
from typing import Any

from ciclo._input.batch import Steps, batch_shapes

__all__ = ["MESSAGE", "RecompileWarning", "ShapeWatch", "compiles_per_shape"]

# The start of the warning's message: `warnings.filterwarnings("ignore",
# message=MESSAGE)` silences it (documented in docs/loop.md).
MESSAGE = "ciclo: the batches reaching"
LIMIT = 3  # distinct shapes that make the warning (2: full batches + a remainder)
_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


class RecompileWarning(UserWarning):
    """A compiled step met batches of several shapes (it compiles for each)."""


def compiles_per_shape(callback: Any) -> bool:
    """Whether `callback` compiles once per input shape: a `jax.jit` function or
    a managed step (also bound to a state, as a Flax state's `train_step`)."""
    if isinstance(callback, functools.partial):
        callback = callback.func
    callback = getattr(callback, "__func__", callback)
    return bool(getattr(callback, "compiles_per_shape", False)) or callable(
        getattr(callback, "lower", None)
    )


def signature(batch: Any) -> tuple[Any, ...]:
    """The shapes of a batch's leaves (a fused call's: of one step's batch)."""
    kind = type(batch)
    if kind is tuple or kind is list:  # (x, y): the common case, no flatten
        try:
            if len(batch) == 2:
                return (batch[0].shape, batch[1].shape)
            return tuple([leaf.shape for leaf in batch])
        except AttributeError:  # nested, or a leaf without a shape
            pass
    elif kind is dict:  # {"image": x, "label": y}: no flatten either
        try:
            return tuple([leaf.shape for leaf in batch.values()])
        except AttributeError:  # nested, or a leaf without a shape
            pass
    elif kind is Steps:
        return tuple(shape[1:] for shape in batch_shapes(batch.batch))
    elif hasattr(batch, "shape"):  # one array
        return (batch.shape,)
    return tuple(batch_shapes(batch))


def _user_stacklevel() -> int:
    """The `stacklevel` of the first frame outside ciclo, seen from the caller."""
    frame, level = sys._getframe(2), 2
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level


class ShapeWatch:
    """The batch shapes the compiled steps of one loop have been given.

    Example:
        >>> import warnings
        >>> import numpy as np
        >>> from ciclo._shapes import ShapeWatch
        >>> watch = ShapeWatch()
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     for n in (8, 8, 3, 8, 3):  # full batches and a remainder
        ...         watch(np.zeros((n, 2)), "step")
        >>> len(caught)
        0
    """

    __slots__ = ("done", "last", "seen")

    def __init__(self) -> None:
        self.seen: dict[tuple[Any, ...], None] = {}
        self.last: tuple[Any, ...] | None = None  # the previous batch's shapes
        self.done = False

    def __call__(self, batch: Any, name: str, shapes: Any = None) -> None:
        """Notes `batch`'s leaf shapes (`shapes`, when the caller has them
        already: `signature(batch)`); warns once at `LIMIT` distinct ones."""
        if self.done or batch is None:
            return
        if shapes is None:
            shapes = signature(batch)
        if shapes == self.last:  # the common case: compared, not hashed
            return
        self.last = shapes
        if shapes not in self.seen:
            self.seen[shapes] = None
            if len(self.seen) >= LIMIT:
                self.done = True
                self._warn(name)

    def _warn(self, name: str) -> None:
        shapes = "; ".join(
            ", ".join(str(s) for s in signature) for signature in self.seen
        )
        warnings.warn(
            RecompileWarning(
                f"{MESSAGE} {name} have taken {len(self.seen)} shapes so far "
                f"(leaf shapes: {shapes}): it compiles again for each new shape "
                f"(seconds each, and memory for each executable). Give every batch "
                f"one shape: pad the last batch to the batch size (with "
                f"sample_weight=0 on the padded rows, so averages ignore them), or "
                f"drop it (tf.data `batch(..., drop_remainder=True)`, PyTorch "
                f"`DataLoader(..., drop_last=True)`). One smaller last batch per "
                f"pass is expected and not warned about. To silence this warning: "
                f"warnings.filterwarnings('ignore', message={MESSAGE!r})."
            ),
            stacklevel=_user_stacklevel(),
        )
