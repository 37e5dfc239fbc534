"""The input path: upcoming batches read and placed on the device ahead of the step.

`Prefetch` wraps the batch iterator of a loop whose state carries a strategy (a
managed or Flax state). When the loop takes batch `n`, it reads batches up to
`n + depth` and places each with the strategy (`Strategy.place_batch`; for a
strategy that leaves batches to `jit` — `jit`, `eager` — through a compiled
identity, whose argument transfer costs the host far less than `jax.device_put`;
a fused `Steps` in the layout its compiled call takes). Placement is
asynchronous, so the transfers of the next batches run while the device
computes the steps already dispatched. The reader hands out `Placed(batch,
strategy, copy)` items: the loop gives callbacks the batch (counted, logged and
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

Only consumed batches count: `get_state()` (Grain-style checkpointable
iterators) returns the position after the last batch handed to the loop, and
`close()` puts such an iterator back there, so batches read ahead but not trained
on are read again by whoever iterates next. A plain generator cannot be put
back: the read-ahead never passes a `stop` in steps, and `prefetch=0` turns it off.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from ciclo._input.batch import Placed, Steps
from ciclo._input.resume import checkpointable

__all__ = [
    "AUTO_MIN_BYTES",
    "Prefetch",
    "check_prefetch",
    "placer",
    "prefetch_passes",
]

# `prefetch=None` (auto) reads one batch ahead on an accelerator when a batch holds
# at least this many bytes of host arrays (a fused `Steps` always). Below it the
# transfer itself takes less device time than an explicit `device_put` costs the
# host (~100-180 us per call on the H100 VM, vs ~80 us for the implicit transfer
# of a jitted call), so placing ahead cannot pay: the small-model row ran at 0.74x
# with one-ahead `device_put`; the compute-bound model (4 MiB batches) at 1.09x.
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
            f"{prefetch!r}."
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


def _host_copy(batch: Any) -> Any:
    """`batch` with its numpy leaves copied (others are immutable)."""
    kind = type(batch)
    if (kind is tuple or kind is list) and all(type(x) is np.ndarray for x in batch):
        return kind([x.copy() for x in batch])
    return jax.tree.map(lambda x: x.copy() if isinstance(x, np.ndarray) else x, batch)


def _host_bytes(batch: Any) -> int:
    leaves = jax.tree.leaves(batch.batch if type(batch) is Steps else batch)
    return sum(x.nbytes for x in leaves if isinstance(x, np.ndarray))


_ACCELERATOR: list[bool] = []
_UNPLACED = object()


def _accelerator() -> bool:
    """Whether the default backend is not the CPU (read once)."""
    if not _ACCELERATOR:
        _ACCELERATOR.append(jax.default_backend() != "cpu")
    return _ACCELERATOR[0]


def _auto_depth(batch: Any) -> int:
    """`prefetch=None`: 1 on an accelerator for a fused `Steps` or a batch of at
    least `AUTO_MIN_BYTES` host bytes; else 0 (see `AUTO_MIN_BYTES`)."""
    if not _accelerator():
        return 0
    if type(batch) is Steps:
        return 1
    return 1 if _host_bytes(batch) >= AUTO_MIN_BYTES else 0


class Prefetch:
    """Batches of `source`, each next `depth` read and placed ahead (`place(batch)
    -> (strategy, placed)`); `depth=None` chooses per `_auto_depth` at the first
    batch. `limit`: a one-element list, the most steps left to read (a `Steps`
    counts as its `n`), shared by the readers of consecutive passes.

    Example:
        >>> from ciclo._input.prefetch import Prefetch
        >>> it = Prefetch(iter(range(5)), lambda b: ("cpu", b * 10), depth=2)
        >>> item = next(it)
        >>> item.batch, item.value, it.ahead
        (0, 0, 2)
        >>> [item.batch for item in it]
        [1, 2, 3, 4]
    """

    def __init__(
        self,
        source: Iterator[Any],
        place: Callable[[Any], Any],
        depth: int | None,
        limit: list[int] | None = None,
    ):
        self._source, self._place, self._depth = source, place, depth
        self._left = limit
        self._queue: collections.deque = collections.deque()
        self._error: BaseException | None = None  # raised at its batch
        self._ended = False
        self._saves = checkpointable(source)
        # the source's position after the last batch handed out
        self._position = source.get_state() if self._saves else None
        self.handed = 0  # steps handed out (a `Steps` counts as its `n`)
        # (steps handed, position after them) of the last batches handed out
        self._marks = collections.deque([(0, self._position)], maxlen=depth or 8)
        if self._saves:
            self.get_state, self.set_state = self._get_state, self._set_state

    @property
    def ahead(self) -> int:
        """Batches read but not handed out yet."""
        return len(self._queue)

    def __iter__(self) -> Prefetch:
        return self

    def _read(self) -> bool:
        """Reads (and places, when ahead) one batch into the queue."""
        if self._ended or self._error is not None:
            return False
        left = self._left
        if left is not None and left[0] <= 0:
            self._ended = True
            return False
        try:
            batch = next(self._source)
        except StopIteration:
            self._ended = True
            return False
        except Exception as error:  # the dataset's: raised when its batch is due
            self._error = error
            return False
        if type(batch) is Steps:
            if left is not None:
                left[0] -= batch.n
        else:
            if left is not None:
                left[0] -= 1
            if self._depth != 0:  # the next read must not change it (one buffer)
                batch = _host_copy(batch)
        position = self._source.get_state() if self._saves else None
        self._queue.append([batch, _UNPLACED, position])
        return True

    def _placed(self, batch: Any) -> Any:
        try:
            return self._place(batch)
        except Exception:  # e.g. a batch that does not split: the step says so
            return None

    def __next__(self) -> Any:
        queue = self._queue
        if not queue and not self._read():
            if self._error is not None:
                error, self._error = self._error, None
                raise error
            raise StopIteration
        if self._depth is None:
            self._depth = _auto_depth(queue[0][0])
        item = queue.popleft()
        if item[1] is _UNPLACED:  # read just now (the first, or after a stall)
            item[1] = self._placed(item[0]) if self._depth else None
        try:
            while len(queue) < self._depth and self._read():
                queue[-1][1] = self._placed(queue[-1][0])
        except BaseException:  # Ctrl-C while reading ahead: the batch stays due
            queue.appendleft(item)
            raise
        batch, where, self._position = item
        self.handed += batch.n if type(batch) is Steps else 1
        if self._saves:
            self._marks.append((self.handed, self._position))
        if where is not None and where is not _UNPLACED:
            return Placed(batch, *where)
        return batch

    def _get_state(self) -> Any:
        """The source's position after the last batch handed out."""
        return self._position

    def _set_state(self, state: Any) -> None:
        self._queue.clear()
        self._error, self._ended = None, False
        self._source.set_state(state)
        self._position = state

    def close(self, consumed: int | None = None) -> None:
        """Puts a checkpointable source back after the
        last batch consumed (the first `consumed` steps handed out; default: all),
        so the batches read ahead, or handed out but not trained on (Ctrl-C in
        the middle of a batch), are read again by whoever iterates next."""
        if not self._saves:
            return
        target = self._position
        if consumed is not None and consumed < self.handed:
            earlier = [p for n, p in self._marks if n <= consumed]
            target = earlier[-1] if earlier else self._marks[0][1]
        if self._queue or target is not self._position:
            self._queue.clear()
            self._source.set_state(target)
            self._position = target


class Closer:
    """An end hook (`__loop_end__`) closing the `Prefetch` readers of a loop's
    passes, given the steps the loop consumed (`loop_state.elapsed` at the end
    counts exactly those); also a no-op callback (for `on_end`)."""

    def __init__(self, start: int):
        self.start, self.readers = start, []

    def __call__(self) -> None:
        return None

    def __loop_end__(self, loop_state: Any) -> None:
        consumed = int(loop_state.elapsed.steps) - self.start
        for reader in self.readers:
            left = consumed
            consumed -= reader.handed
            reader.close(left)


def prefetch_passes(
    data: Any, state: Any, depth: int | None, stop_at: Any, start: Any
) -> Closer | None:
    """Reads each pass of `data` (`ciclo._input.passes.Passes`) through a `Prefetch`
    (none for a state without a strategy, or `depth == 0`), never past `stop_at`'s
    step count. Returns the `Closer` of the passes' readers (None without)."""
    place = placer(state, depth)
    if place is None:
        return None
    closer = Closer(int(start.steps))
    opened = closer.readers
    left = None
    if stop_at is not None and stop_at.steps is not None:
        left = [max(stop_at.steps - start.steps, 0)]

    def each_pass(batches: Iterator[Any]) -> Iterator[Any]:
        reader = Prefetch(batches, place, depth, left)
        opened.append(reader)
        return reader

    data.transform(each_pass)
    return closer
