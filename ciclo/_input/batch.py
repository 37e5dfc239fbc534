"""What a batch counts as: its number of samples (`batch_size`, the largest first
axis among its leaves) and `Steps`, a batch that counts as `n` steps."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax

__all__ = ["Steps", "batch_shapes", "batch_size"]


class Steps:
    """A batch that counts as `n` steps: `n` batches stacked on a new leading axis.

    The loop recognises it (the one hook of fused execution): `elapsed_after`
    advances by `n` steps and `samples` samples, so `elapsed` keeps counting real
    steps. A step that understands it (a managed step, see
    `managed.train_step(steps_per_call=...)`) runs the `n` steps in one compiled
    call and may leave one log row per step in `rows` (a `Logs` whose values have a
    leading axis of `n`, the last step's included); the loop then commits `n`
    history rows, at steps `elapsed.steps + i` and samples
    `elapsed.samples + i * samples // n`, the last row also holding the call's
    other logs. Without `rows`, the call's logs are committed once, at the
    `elapsed` before the call. `ciclo.fuse` (and `steps_per_call=` of the loops)
    builds them from any dataset.

    Attributes:
        batch: the stacked batch; every leaf has shape `(n, batch_size, ...)`.
        n: the number of steps it counts as.
        samples: the samples of all `n` batches.
        rows: per-step logs left by the step for the history (None: none).

    Example:
        >>> import ciclo, numpy as np
        >>> fused = ciclo.Steps(np.zeros((4, 32, 3)), n=4, samples=128)
        >>> elapsed = ciclo.Elapsed.create().update(fused.samples, steps=fused.n)
        >>> elapsed.steps, elapsed.samples
        (4, 128)
    """

    __slots__ = ("batch", "n", "rows", "samples")

    def __init__(self, batch: Any, n: int, samples: int):
        self.batch, self.n, self.samples = batch, int(n), int(samples)
        self.rows = None

    def __repr__(self) -> str:
        return f"Steps(n={self.n}, samples={self.samples})"


class Placed:
    """A batch read ahead by the input stage, with its copy placed on the device
    for `strategy` (`value`). The loop takes it apart: callbacks get `batch`, and
    `loop_state.placed` holds this item for the batch's managed step, so the
    placed copy travels with its batch (nothing is looked up by identity)."""

    __slots__ = ("batch", "strategy", "value")

    def __init__(self, batch: Any, strategy: Any, value: Any):
        self.batch, self.strategy, self.value = batch, strategy, value

    def __repr__(self) -> str:
        return f"Placed({self.batch!r:.60})"


def placed_for(item: Placed | None, strategy: Any) -> Any:
    """The copy `item` placed for `strategy`, or None (not read ahead, or read
    ahead for another strategy): the step then places the batch itself."""
    if item is not None and item.strategy is strategy:
        return item.value
    return None


def _leaves(batch: Any) -> list[Any]:
    """Leaves of a batch, looking inside dataclasses that are not registered pytrees."""
    common = type(batch) is tuple or type(batch) is list  # (x, y): no flatten
    if common and all(hasattr(leaf, "shape") for leaf in batch):
        return list(batch)
    out = []
    for leaf in jax.tree.leaves(batch):
        if dataclasses.is_dataclass(leaf) and not isinstance(leaf, type):
            out.extend(
                _leaves([getattr(leaf, f.name) for f in dataclasses.fields(leaf)])
            )
        else:
            out.append(leaf)
    return out


def batch_shapes(batch: Any) -> list[tuple[int, ...]]:
    """The shape of every leaf of `batch` (`()` for a leaf without a shape)."""
    return [tuple(getattr(leaf, "shape", ())) for leaf in _leaves(batch)]


def batch_size(
    batch: Any, batch_size_fn: Callable[[list[tuple[int, ...]]], int] | None = None
) -> int:
    """The number of samples in `batch`: the largest first axis among its leaves.

    A batch whose leaves have no shape (Python scalars, strings) counts as 1.
    `batch_size_fn`, when given, receives the list of leaf shapes and decides.
    """
    if batch_size_fn is not None:
        return int(batch_size_fn(batch_shapes(batch)))
    size = 0
    kind = type(batch)
    if kind is tuple or kind is list or kind is dict:  # (x, y), {"x": x}: no flatten
        for leaf in batch.values() if kind is dict else batch:
            shape = getattr(leaf, "shape", None)
            if shape is None:  # nested: the general path below
                size = 0
                break
            if shape and shape[0] > size:
                size = shape[0]
        else:
            return int(size) if size else 1
    for leaf in _leaves(batch):
        shape = getattr(leaf, "shape", None)
        if shape and shape[0] > size:
            size = shape[0]
    return int(size) if size else 1
