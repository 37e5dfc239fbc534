"""Fused execution: `fuse` groups a dataset's batches into `Steps` super-batches.

A `Steps` (see `ciclo._input.batch`) is `n` consecutive batches stacked on a new leading
axis; the loop counts it as `n` steps and a managed step runs its `n` steps in one
compiled call (`jax.lax.scan`). Schedules are checked once per call (with the
`elapsed` before it), so they fire at call boundaries; `stop` in steps is exact
(the last call is shortened), other periods are checked after each call. The
input stage (`ciclo._input.stage`) groups each pass's `Item`s with `groups`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import jax
import numpy as np

from ciclo._input.batch import Item, Steps, batch_size, items_of
from ciclo._short import short

__all__ = ["check_steps", "declared_steps", "fuse", "groups"]


def check_steps(steps_per_call: Any, where: str) -> int:
    if (
        isinstance(steps_per_call, bool)
        or not isinstance(steps_per_call, int)
        or steps_per_call < 1
    ):
        raise TypeError(
            f"{where}: `steps_per_call` must be a positive int (the steps fused in "
            f"one compiled call), got {short(steps_per_call)}."
        )
    return steps_per_call


def _signature(batch: Any) -> tuple[Any, ...]:
    """What must match to stack batches: structure, shapes and dtypes. A tuple,
    list or dict of numpy arrays (the common batch) is read without flattening."""
    kind = type(batch)
    if kind is tuple or kind is list or kind is dict:
        signature = [kind, *batch] if kind is dict else [kind, len(batch)]
        for x in batch.values() if kind is dict else batch:
            if type(x) is not np.ndarray:
                break
            signature += (x.shape, x.dtype)
        else:
            return tuple(signature)
    leaves, tree = jax.tree.flatten(batch)
    return (
        tree,
        *((getattr(x, "shape", None), getattr(x, "dtype", type(x))) for x in leaves),
    )


def _leaves(batch: Any) -> tuple[list[Any], Any]:
    """The leaves of `batch` and how to rebuild it (`_rebuild`); a tuple, list or
    dict of numpy arrays (the common batch) without flattening."""
    kind = type(batch)
    if kind is tuple or kind is list:
        for x in batch:
            if type(x) is not np.ndarray:
                break
        else:
            return list(batch), kind
    elif kind is dict:
        values = list(batch.values())
        for x in values:
            if type(x) is not np.ndarray:
                break
        else:
            return values, list(batch)
    return jax.tree.flatten(batch)


def _rebuild(how: Any, leaves: list[Any]) -> Any:
    if how is tuple or how is list:
        return how(leaves)
    if type(how) is list:
        return dict(zip(how, leaves))
    return jax.tree.unflatten(how, leaves)


class _Group:
    """The batches of one `Steps`, each copied into its slot of the stack as it is
    read: a loader that refills one buffer for every batch still gives each step
    its own batch, and the stack is built without `np.stack`'s second copy. Device
    arrays and Python scalars (immutable) are kept and stacked at the end."""

    def __init__(self, first: Any, k: int):
        leaves, self.how = _leaves(first)
        self.slots = [
            np.empty((k, *x.shape), x.dtype) if isinstance(x, np.ndarray) else []
            for x in leaves
        ]
        self.n = self.samples = 0

    def add(self, batch: Any, size: int) -> None:
        how = self.how
        # the group's batches share a signature: when the first was a tuple or
        # list of numpy arrays, so is this one, and it is its own leaves
        leaves = batch if how is tuple or how is list else _leaves(batch)[0]
        for slot, x in zip(self.slots, leaves):
            if type(slot) is list:
                slot.append(x)
            else:
                slot[self.n] = x
        self.n += 1
        self.samples += size

    def steps(self) -> Steps:
        n = self.n
        stacked = []
        for i, slot in enumerate(self.slots):
            if type(slot) is not list:
                stacked.append(slot[:n])
                continue
            try:
                stacked.append(_stack_values(slot))
            except (TypeError, ValueError) as error:
                raise self._unstackable(i, slot[0], error) from error
        return Steps(_rebuild(self.how, stacked), n, self.samples)

    def _unstackable(self, i: int, value: Any, error: Exception) -> TypeError:
        """The error for leaf `i`, whose values (`value` the first) do not stack:
        named as the input stage's (the loop's note), not the dataset's."""
        how = self.how
        if how is tuple or how is list:
            path = f"[{i}]"
        elif type(how) is list:  # a dict's keys
            path = f"[{how[i]!r}]"
        else:
            leaves = jax.tree_util.tree_leaves_with_path(
                jax.tree.unflatten(how, [0] * how.num_leaves)
            )
            path = jax.tree_util.keystr(leaves[i][0])
        out = TypeError(
            f"A fused call (steps_per_call) stacks each leaf of its batches into "
            f"one array, but the leaf batch{path} holds {type(value).__name__} "
            f"values ({value!r:.40}), which do not stack ({error}). Batches for "
            f"fused steps hold numpy or jax arrays and numbers: drop or encode "
            f"the other leaves in the data pipeline, or run without "
            f"steps_per_call."
        )
        out.ciclo_stage = "stacking the batches of the fused call"
        return out


def _stack_values(xs: list[Any]) -> Any:
    if all(isinstance(x, np.ndarray | np.generic | int | float) for x in xs):
        return np.stack(xs)
    import jax.numpy as jnp

    return jnp.stack(xs)


def fuse(
    dataset: Iterable[Any],
    steps_per_call: int,
    batch_size_fn: Callable[[list[tuple[int, ...]]], int] | None = None,
    limit: int | None = None,
) -> Iterator[Steps]:
    """Groups consecutive batches of `dataset` into `Steps` of `steps_per_call`.

    Batches are stacked on a new leading axis: each numpy leaf is copied into its
    slot of the stack when the batch is read (so a loader that refills one buffer
    still gives each step its own batch), device arrays are stacked with
    `jnp.stack`. A group ends early when the next batch has
    another structure, shape or dtype (e.g. a last partial batch), and at the end
    of the data: nothing is dropped, the last calls may be shorter. `Steps` in
    `dataset` pass through unchanged.

    Args:
        dataset: any iterable of batches.
        steps_per_call: the most batches per `Steps`.
        batch_size_fn: as in `ciclo.loop`, to count each batch's samples.
        limit: the most batches to read in all (e.g. the steps left until `stop`).

    Yields:
        `Steps`.

    Example:
        >>> import ciclo, numpy as np
        >>> fused = list(ciclo.fuse([np.ones((2, 3))] * 5, 2))
        >>> [(s.n, s.samples, s.batch.shape) for s in fused]
        [(2, 4, (2, 2, 3)), (2, 4, (2, 2, 3)), (1, 2, (1, 2, 3))]
    """
    k = check_steps(steps_per_call, "ciclo.fuse")
    left = None if limit is None else [limit]
    for item in groups(items_of(iter(dataset), left), k, batch_size_fn):
        yield item.batch


def groups(
    items: Iterable[Item],
    k: int,
    batch_size_fn: Callable[[list[tuple[int, ...]]], int] | None = None,
) -> Iterator[Item]:
    """The `Item`s of `items` grouped into `Item`s of `Steps` of at most `k`
    batches (see `fuse`), each with the data position after its last batch. A
    `Steps` among the items passes through (it ends the group before it)."""
    group: _Group | None = None
    signature = size = position = None
    for item in items:
        batch = item.batch
        if type(batch) is Steps:
            if group is not None:
                yield Item(group.steps(), position, own=True)
                group = None
            yield item
            continue
        current = _signature(batch)
        if group is not None and current != signature:
            yield Item(group.steps(), position, own=True)
            group = None
        if group is None:  # the group's batches have equal shapes, so equal sizes
            size = batch_size(batch, batch_size_fn)
            group = _Group(batch, k)
        signature = current
        group.add(batch, size)
        position = item.position
        if group.n == k:
            yield Item(group.steps(), position, own=True)
            group = None
    if group is not None:
        yield Item(group.steps(), position, own=True)


def _owner_steps(callback: Any) -> Any:
    value = getattr(callback, "steps_per_call", None)
    if value is None and hasattr(callback, "func"):  # functools.partial
        value = getattr(callback.func, "steps_per_call", None)
    return value


def declared_steps(callback_groups: Iterable[Any], *extra: Any) -> int | None:
    """The `steps_per_call` the callbacks (or the `extra` objects) declare, if any.

    Raises:
        ValueError: if two of them declare different values.
    """
    found: dict[int, Any] = {}
    candidates: list[Any] = list(extra)
    for group in callback_groups:
        if isinstance(group, list | tuple):
            candidates.extend(group)
        elif isinstance(group, Mapping):
            continue
        elif group is not None:
            candidates.append(group)
    for callback in candidates:
        value = _owner_steps(callback)
        if value is not None and value != 1:
            found.setdefault(check_steps(value, repr(callback)), callback)
    if len(found) > 1:
        raise ValueError(
            f"Callbacks declare different `steps_per_call`: "
            f"{ {k: repr(v) for k, v in found.items()} }; pass steps_per_call= to "
            f"the loop to choose one."
        )
    return next(iter(found), None)
