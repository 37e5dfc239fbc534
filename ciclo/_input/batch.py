"""What a batch counts as: its number of samples (`batch_size`, the largest first
axis among its leaves), `Steps` (a batch that counts as `n` steps) and `Item` (a
batch on its way to a step: its placed copy, its pass end, its data position)."""

from __future__ import annotations

import dataclasses
import numbers
import sys
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from ciclo._short import short

__all__ = [
    "Item",
    "Steps",
    "as_numpy",
    "batch_shapes",
    "batch_size",
    "foreign",
    "items_of",
    "placed_for",
]


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


class Item:
    """One batch on its way from the dataset to a step, as the input stage
    (`ciclo._input.stage`) hands it to the loop.

    The loop takes it apart: callbacks get `batch`; `loop_state.placed` holds
    the item, where the batch's managed step finds its placed copy (so the copy
    travels with its batch: nothing is looked up by identity) and the epoch-end
    schedule its pass end (`ciclo._schedules.epoch.EpochEnd`).

    Attributes:
        batch: the batch (a `Steps` for a fused call).
        placed: its copy placed on the device for `strategy` ahead of the step,
            or None (the step places the batch itself).
        strategy: what `placed` was placed for (None: not placed).
        last_of_pass: whether it is the last batch of its pass; None while the
            stage does not know yet (it reads the next batch of the pass to
            learn it only when asked, `Inputs.last_of_pass`).
        position: the data iterator's position after this batch (`get_state()`
            of a checkpointable iterator, as Grain's), else None.
        own: `batch` is ciclo's own copy (a fused stack, a batch copied when it
            was read ahead): reading the next batch cannot change it.
    """

    # the defaults, read until set (the stage makes an item per batch: its
    # common one sets `batch` alone, without an `__init__` call)
    placed = strategy = last_of_pass = position = None
    own = False

    def __init__(self, batch: Any, position: Any = None, own: bool = False):
        self.batch = batch
        if position is not None:
            self.position = position
        if own:
            self.own = True

    def keep(self) -> None:
        """Makes `batch` ciclo's own copy (its numpy leaves copied; other leaves
        are immutable), unless it already is: done before the next batch is
        read, which may refill the buffer this one lives in."""
        if not self.own:
            if type(self.batch) is not Steps:
                self.batch = host_copy(self.batch)
            self.own = True

    def __repr__(self) -> str:
        return f"Item({self.batch!r:.60}, last_of_pass={self.last_of_pass})"


def host_copy(batch: Any) -> Any:
    """`batch` with its numpy leaves copied (others are immutable)."""
    kind = type(batch)
    if kind is tuple or kind is list:  # (x, y): a plain loop, no tree walk
        copies = []
        for x in batch:
            if type(x) is not np.ndarray:
                break
            copies.append(x.copy())
        else:
            return kind(copies)
    elif kind is dict:
        if all(type(x) is np.ndarray for x in batch.values()):
            return {k: x.copy() for k, x in batch.items()}
    elif kind is np.ndarray:
        return batch.copy()
    elif kind is int or kind is float:
        return batch
    return jax.tree.map(lambda x: x.copy() if isinstance(x, np.ndarray) else x, batch)


def shapes_size(
    shapes: list[tuple[int, ...]],
    batch_size_fn: Callable[[list[tuple[int, ...]]], int] | None = None,
) -> int:
    """The number of samples of a batch whose leaves have `shapes`:
    `batch_size_fn(shapes)` (checked), else the largest first axis (1 when no
    leaf has one), as `batch_size`."""
    if batch_size_fn is None:
        return max((shape[0] for shape in shapes if shape), default=0) or 1
    size = batch_size_fn(shapes)
    if type(size) is int and size >= 0:
        return size
    return _checked_size(size, batch_size_fn)


def _checked_size(size: Any, batch_size_fn: Callable[..., Any]) -> int:
    """A `batch_size_fn` result that is not a plain int: a numpy or jax integer
    (or a 0-d integer array) as an int; anything else an error naming it."""
    dtype = getattr(size, "dtype", None)
    integral = isinstance(size, numbers.Integral) and not isinstance(size, bool)
    if not integral and (
        dtype is None or getattr(size, "shape", None) != () or dtype.kind not in "iu"
    ):
        name = getattr(batch_size_fn, "__qualname__", repr(batch_size_fn))
        raise TypeError(
            f"`batch_size_fn` ({name}) returned {short(size)} ({type(size).__name__}); "
            f"it must return the batch's number of samples, an int, given the list "
            f"of the batch's leaf shapes (e.g. lambda shapes: shapes[0][0])."
        )
    if int(size) < 0:
        raise ValueError(f"`batch_size_fn` returned a negative size: {size!r}.")
    return int(size)


def placed_for(item: Item | None, strategy: Any) -> Any:
    """The copy of `item`'s batch placed for `strategy`, or None (not read
    ahead, or read ahead for another strategy): the step then places the batch
    itself."""
    if item is not None and item.strategy is strategy:
        return item.placed
    return None


def items_of(
    iterator: Iterator[Any], left: list[int] | None = None, positions: bool = False
) -> Iterator[Item]:
    """The batches of `iterator` as `Item`s, each with the iterator's position
    after it (with `positions`: a checkpointable iterator's `get_state()`).
    `left`: a one-element list, the most steps left to read (a `Steps` counts as
    its `n`), shared by the readers of consecutive passes; nothing is read once
    it is 0."""
    get_state = iterator.get_state if positions else None
    convert = None  # whether the batches hold torch/TensorFlow tensors: the first says
    if left is None and get_state is None:  # the common case, kept lean
        new = object.__new__
        for batch in iterator:
            if convert is None:
                convert = foreign(batch)
            item = new(Item)  # `Item(batch)`, without the call
            item.batch = as_numpy(batch) if convert else batch
            yield item
        return
    while left is None or left[0] > 0:
        try:
            batch = next(iterator)
        except StopIteration:
            return
        if left is not None:
            left[0] -= batch.n if type(batch) is Steps else 1
        if convert is None:
            convert = foreign(batch)
        if convert:
            batch = as_numpy(batch)
        yield Item(batch, None if get_state is None else get_state())


def _tensor_types() -> tuple[type, ...]:
    """The tensor types of the frameworks already imported (none is imported
    here): `torch.Tensor`, TensorFlow's `tf.Tensor`."""
    types = []
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(getattr(torch, "Tensor", None), type):
        types.append(torch.Tensor)
    tf = sys.modules.get("tensorflow")
    if tf is not None and isinstance(getattr(tf, "Tensor", None), type):
        types.append(tf.Tensor)
    return tuple(types)


def foreign(batch: Any) -> bool:
    """Whether `batch` holds torch or TensorFlow tensors (a PyTorch
    `DataLoader`'s default collate, a `tf.data` dataset iterated as is), which
    jitted steps do not take: the input stage gives them as numpy arrays."""
    types = _tensor_types()
    return bool(types) and any(isinstance(x, types) for x in jax.tree.leaves(batch))


def as_numpy(batch: Any) -> Any:
    """`batch` with its torch / TensorFlow tensors as numpy arrays: a CPU tensor's
    array shares its memory (no copy); a GPU tensor, or one that requires grad,
    is copied to the host."""
    types = _tensor_types()
    torch = sys.modules.get("torch")

    def host(x: Any) -> Any:
        if not isinstance(x, types):
            return x
        if torch is None or not isinstance(x, torch.Tensor):
            return x.numpy()  # TensorFlow's
        if x.dtype == torch.bfloat16:  # numpy has none: jax's, from the same bits
            import ml_dtypes

            return x.detach().cpu().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return x.numpy(force=True)  # detached, on the host

    return jax.tree.map(host, batch)


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
        return shapes_size(batch_shapes(batch), batch_size_fn)
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
