"""Read-ahead: upcoming batches read and placed on the device ahead of the step.

`ahead` wraps a pass's `Item`s for a loop whose state carries a strategy (a
managed or Flax state; `placer`). When the loop takes item `n`, it reads items up
to `n + depth` and places each with the strategy (`Strategy.place_batch`; for a
strategy that leaves batches to `jit` — `jit`, `eager` — through a compiled
identity, whose argument transfer costs the host far less than `jax.device_put`;
a fused `Steps` in the layout its compiled call takes). Placement is
asynchronous, so the transfers of the next batches run while the device
computes the steps already dispatched. The placed copy rides in its `Item`
(`Item.placed`): the loop gives callbacks the batch (counted, logged and
checkpointed as without read-ahead) and keeps the item in `loop_state.placed`,
where the batch's managed step finds its placed copy instead of placing it again.
A batch read ahead is copied on the host when it is read (numpy leaves; a fused
`Steps` is already a fresh stack, see `ciclo._input.fused`): reading the next batch
cannot change it, so a loader that refills one buffer trains on the right data.

Design (measured on an NVIDIA H100, see docs/performance.md): the read-ahead runs
inline in the caller's thread. A thread per batch was slower on a dispatch-bound
model (0.40-0.90x the naive loop: it competes for the GIL with the dispatch),
while one-ahead inline `device_put` gave a compute-bound model 1.09x (its
ceiling). No thread also means a dataset's exception surfaces in the caller's
thread, at its batch (it is kept until the loop reaches that batch), and Ctrl-C
cannot leave a reader behind.

Only consumed batches count: each item carries the data position after its
batch, and the stage (`ciclo._input.stage.Inputs`) puts a checkpointable
iterator back after the last batch trained when the loop ends, so batches read
ahead but not trained on are read again by whoever iterates next. A plain
generator cannot be put back: the read-ahead never passes a `stop` in steps, and
`prefetch=0` turns it off.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import jax
import numpy as np

from ciclo._input.batch import Item, Steps
from ciclo._short import short

__all__ = ["AUTO_MIN_BYTES", "ahead", "check_prefetch", "placer"]

# `prefetch=None` (auto) reads one batch ahead on an accelerator when one step's
# batch holds at least this many bytes of host arrays (a fused `Steps`: its stack
# divided by its steps). Below it the transfer takes less device time than an
# explicit `device_put` costs the host, so placing ahead cannot pay. On an H200
# (benchmarks/RESULTS.md, 2026-11-27): the digits' 8 KiB batches ran at 0.70-0.74x
# the raw loop off and 0.45 one ahead, fused K=32 at 8.64x off and 6.45-6.71 one
# ahead; the compute-bound model's 4 MiB batches at 1.84x one ahead and 1.61 off
# (fused: 1.80-1.86 against 1.40), with two ahead no better (1.68, fused 1.71).
AUTO_MIN_BYTES = 256 * 1024


def check_prefetch(prefetch: Any, where: str) -> int | None:
    """Validates `prefetch`: None (auto) or an int >= 0 (batches read ahead)."""
    if prefetch is None:
        return None
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
        raise ValueError(
            f"{where}: `prefetch` must be None (automatic: one batch ahead on an "
            f"accelerator for large batches) or an int >= 0 (the batches read and "
            f"placed on the device ahead of the step; 0 turns it off), got "
            f"{short(prefetch)}."
        )
    return prefetch


def placer(state: Any, depth: int | None) -> Callable[[Any], Any] | None:
    """How the state's strategy places a batch ahead; None when nothing is read
    ahead: `depth == 0`, a state without a strategy (nothing to place), or the
    automatic depth (None) on a CPU (no transfer to overlap: no reader at all)."""
    if depth == 0 or getattr(state, "strategy", None) is None:
        return None
    if depth is None and not _accelerator():
        return None
    from ciclo._strategies.registry import strategy_of
    from ciclo.managed._placement import place_ahead  # only with a managed state

    strategy = strategy_of(state)
    if strategy is None:
        return None
    return lambda batch: (strategy, place_ahead(strategy, batch))


def _host_bytes(batch: Any) -> int:
    leaves = jax.tree.leaves(batch.batch if type(batch) is Steps else batch)
    return sum(x.nbytes for x in leaves if isinstance(x, np.ndarray))


_ACCELERATOR: list[bool] = []


def _accelerator() -> bool:
    """Whether the default backend is not the CPU (read once)."""
    if not _ACCELERATOR:
        _ACCELERATOR.append(jax.default_backend() != "cpu")
    return _ACCELERATOR[0]


def _auto_depth(batch: Any) -> int:
    """`prefetch=None`: 1 on an accelerator when one step's batch holds at least
    `AUTO_MIN_BYTES` host bytes (a fused `Steps`: its stack over its `n` steps);
    else 0 (see `AUTO_MIN_BYTES`)."""
    if not _accelerator():
        return 0
    size = _host_bytes(batch)
    if type(batch) is Steps:
        size //= max(batch.n, 1)
    return 1 if size >= AUTO_MIN_BYTES else 0


def ahead(
    items: Iterable[Item], place: Callable[[Any], Any], depth: int | None
) -> Iterator[Item]:
    """The `Item`s of `items`, each handed out with the next `depth` already read
    and placed (`place(batch) -> (strategy, placed)`); `depth=None` chooses per
    `_auto_depth` at the first item. An item read ahead is copied on the host
    first (numpy leaves, unless it is ciclo's own copy). Each item handed out
    says whether it ends the pass when that is known without reading more (the
    next item is queued: no; the items ended: yes). The dataset's exception
    while reading ahead is raised when its item is due (the queued ones first);
    Ctrl-C while reading ahead propagates (the loop ends; the stage puts a
    checkpointable iterator back after the last batch trained).

    Example:
        >>> from ciclo._input.batch import items_of
        >>> from ciclo._input.prefetch import ahead
        >>> out = ahead(items_of(iter(range(3))), lambda b: ("cpu", b * 10), 2)
        >>> [(i.batch, i.placed, i.last_of_pass) for i in out]
        [(0, 0, False), (1, 10, False), (2, 20, True)]
    """
    source = iter(items)
    queue: collections.deque = collections.deque()
    failed: Exception | None = None  # raised when its item is due
    ended = False

    def placed(item: Item) -> Item:
        item.keep()  # reading the next batch must not change it (one buffer)
        try:
            item.strategy, item.placed = place(item.batch)
        except Exception:  # e.g. a batch that does not split: the step says so
            item.strategy = item.placed = None
        return item

    while True:
        if queue:
            item = queue.popleft()
        else:
            if failed is not None:
                raise failed
            if ended:
                return
            try:
                item = next(source)
            except StopIteration:
                return
            if depth is None:
                depth = _auto_depth(item.batch)
            if depth:
                placed(item)
        while failed is None and not ended and len(queue) < depth:
            try:
                queue.append(placed(next(source)))
            except StopIteration:
                ended = True
            except Exception as error:  # the dataset's: raised when its batch is due
                failed = error
        if item.last_of_pass is None and depth:
            item.last_of_pass = False if queue or failed else ended or None
        yield item
