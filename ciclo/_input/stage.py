"""The input stage: the one way a loop's batches go from its dataset to its steps.

`inputs(dataset, ...)` is called by `ciclo.loop` for its own dataset and by
`train_loop` for its passes (which hands the result to `loop`), so `loop`,
`train_loop`, `test_loop`, `predict_loop` and `ciclo.iterate` read their data
one way:

    dataset
      → `Passes` (`passes.py`): one pass for `loop`; `train_loop`'s data re-read
        per epoch; a resumed run positioned where it stopped (`resume.py`: a
        factory called with the start step, a checkpointable iterator given its
        saved state, a plain one read back)
      → each pass's `Item`s (`batch.items_of`): the batch (torch / TensorFlow
        tensors as numpy arrays) and the data position after it; never read past
        a `stop` in steps
      → fused calls (`fused.groups`, `steps_per_call > 1`): each batch copied into
        its slot of a stack as it is read
      → read-ahead (`prefetch.ahead`, a state with a strategy and `prefetch`):
        the next items copied and placed on the device, the copy in its item
      → `Inputs` → `Item`s to `ciclo._loop.run.Run`, which gives callbacks
        `item.batch` and keeps the item in `loop_state.placed`.

Whether an item ends its pass (`Item.last_of_pass`) is known when it is handed
out if it was read ahead; otherwise the stage reads the next item of the pass
the first time it is asked (`Inputs.last_of_pass`: the epoch-end schedule,
`ciclo._schedules.epoch.EpochEnd`, asks it when neither its duration nor
`stop` decides) and hands that item out next. Only consumed
batches count: the position a checkpoint saves (`get_state`) is after the last
item handed out, and `close` puts a checkpointable iterator back after the last
batch trained. Everything runs in the caller's thread: a dataset's exception is
raised when its batch is due, and Ctrl-C interrupts the reading like a step.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from typing import Any

from ciclo._input.batch import Item, Steps, items_of, shapes_size
from ciclo._input.fused import groups
from ciclo._input.passes import Passes, one_pass, train_data
from ciclo._input.prefetch import ahead, placer
from ciclo._input.resume import Start, checkpointable
from ciclo._period import Period
from ciclo._time import Elapsed

__all__ = ["Inputs", "inputs"]

# iterators that know exactly how many items are left (`__length_hint__`)
_COUNTED = (type(iter([])), type(iter(())), type(iter(range(0))))


class Inputs:
    """The `Item`s of a loop's data, pass after pass.

    Each pass's batches are grouped into fused calls of `steps_per_call` and, with
    a `place`r, read `depth` items ahead (see the module docstring). `left`: a
    one-element list, the most steps left to read (a `stop` in steps), shared by
    the passes. `completed` counts the passes read to their end; `empty` is True
    until an item is handed out; `handed` counts the steps handed out from a
    checkpointable iterator (to put it back, `close`).

    Example:
        >>> from ciclo._input.passes import Passes
        >>> from ciclo._input.stage import Inputs
        >>> data = Inputs(Passes(lambda: iter([1, 2, 3]), passes=2))
        >>> first = next(data)
        >>> first.batch, data.last_of_pass(first)  # reads batch 2 to know it
        (1, False)
        >>> [item.batch for item in data]
        [2, 3, 1, 2, 3]
    """

    def __init__(
        self,
        passes: Passes,
        *,
        steps_per_call: int = 1,
        place: Callable[[Any], Any] | None = None,
        depth: int | None = 0,
        left: list[int] | None = None,
        batch_size_fn: Callable[[list[tuple[int, ...]]], int] | None = None,
    ):
        self._passes, self._k, self._place, self._depth = (
            passes, steps_per_call, place, depth,
        )  # fmt: skip
        self._left, self.batch_size_fn = left, batch_size_fn
        self._items: Iterator[Item] | None = None  # the current pass's
        self._counted: Any = None  # its list (tuple, range) iterator, if it is one
        self._read = 0  # items read from the current pass
        self._ahead: Item | None = None  # read to learn a pass end, handed next
        self._failed: Exception | None = None  # the dataset's, raised at its batch
        self._broken = False  # the dataset raised: nothing more is read
        self._source: Any = None  # the single pass's checkpointable iterator
        self._position: Any = None  # its position after the last item handed
        self._marks: collections.deque = collections.deque(maxlen=4)
        self.handed = 0
        self.empty = True
        # whether a batch is copied before the next one is read to learn its pass
        # end: the loop turns it off when nothing after that check reads the
        # batch (`ciclo._loop.loop`)
        self.keep_batches = True
        self._open()

    @property
    def completed(self) -> int:
        """The passes read to their end (a resumed run's included)."""
        return self._passes.completed

    def _open(self) -> bool:
        """Opens the next pass, if any is left (and `stop` is not reached)."""
        if self._broken or (self._left is not None and self._left[0] <= 0):
            return False
        iterator = self._passes.open()
        if iterator is None:
            return False
        saves = self._passes.bound == 1 and checkpointable(iterator)
        items = items_of(iterator, self._left, saves)
        if self._k > 1:
            items = groups(items, self._k, self.batch_size_fn)
        if self._place is not None:
            items = ahead(items, self._place, self._depth)
        self._items, self._read = items, 0
        # a list's (tuple's, range's) own iterator says exactly how many batches
        # are left in the pass, and reading on cannot refill a batch's buffer:
        # its pass end is known without reading ahead (one batch at a time only)
        self._counted = (
            iterator
            if type(iterator) in _COUNTED
            and items is not None
            and self._k == 1
            and self._place is None
            else None
        )
        if saves:
            self._source, self._position = iterator, iterator.get_state()
            self._marks.append((self.handed, self._position))
        return True

    def __iter__(self) -> Inputs:
        return self

    def __next__(self) -> Item:
        item = self._ahead
        if item is not None:
            self._ahead = None
        else:
            while True:
                if self._failed is not None:
                    failed, self._failed = self._failed, None
                    raise failed
                items = self._items
                if items is None:
                    if not self._open():
                        raise StopIteration
                    items = self._items
                try:  # the next item of the pass (the hot path)
                    item = next(items)
                except StopIteration:
                    self._items = None
                    self._passes.ended(self._read)
                    continue
                except BaseException:
                    self._items, self._broken = None, True
                    raise
                self._read += 1
                break
        self.empty = False
        if self._source is not None:  # a checkpointable iterator: its marks
            self.handed += item.batch.n if type(item.batch) is Steps else 1
            self._position = item.position
            self._marks.append((self.handed, item.position))
        return item

    def last_of_pass(self, item: Item) -> bool:
        """Whether `item`, the last handed out, is the last of its pass. When not
        known yet, reads the next item of the pass (handed out next); `item`'s
        batch is copied first unless it is ciclo's own (reading on may refill
        the buffer it lives in) or nothing reads it after this check
        (`keep_batches` off). When the dataset raises reading it, the pass
        did not end and the error is raised when that batch is due."""
        if item.last_of_pass is None:
            counted = self._counted
            if counted is not None and self._ahead is None:
                left = self._left
                if left is None or left[0] > 0:
                    item.last_of_pass = counted.__length_hint__() == 0
                    return item.last_of_pass
            if self.keep_batches:
                item.keep()
            items = self._items
            if items is None:
                item.last_of_pass = True
                return True
            try:  # the next item of the pass, handed out next
                self._ahead = next(items)
            except StopIteration:
                self._items = None
                self._passes.ended(self._read)
                item.last_of_pass = True
                return True
            except Exception as error:
                self._items, self._broken = None, True
                self._failed = error
                item.last_of_pass = False
                return False
            except BaseException:
                self._items, self._broken = None, True
                raise
            self._read += 1
            item.last_of_pass = False
            return False
        return item.last_of_pass

    def get_state(self) -> Any:
        """The data position after the last item handed out, for a single pass
        over a checkpointable iterator (Grain's); else None."""
        return self._position

    def close(self, consumed: int) -> None:
        """Puts a checkpointable iterator back after the last batch trained (the
        first `consumed` steps handed out), so the batches read ahead, or handed
        out but not trained on (Ctrl-C in the middle of a batch), are read again
        by whoever iterates next."""
        source = self._source
        if source is None:
            return
        target = self._position
        if consumed < self.handed:
            earlier = [p for n, p in self._marks if n <= consumed]
            target = earlier[-1] if earlier else self._marks[0][1]
        try:
            moved = bool(source.get_state() != target)
        except Exception:  # states that do not compare: put it back anyway
            moved = True
        if moved:
            source.set_state(target)
        self._position = target


def inputs(
    dataset: Any,
    *,
    state: Any = None,
    elapsed: Elapsed | None = None,
    start_at: Start | None = None,
    stop: Period | None = None,
    steps_per_call: int = 1,
    prefetch: int | None = 0,
    batch_size_fn: Callable[[list[tuple[int, ...]]], int] | None = None,
    reread: bool = False,
    epochs: int | None = None,
    epoch_duration: Any = None,
) -> Inputs:
    """A loop's data as `Inputs`, from the step it starts at.

    Args:
        dataset: `ciclo.loop`'s (an iterable or a factory `dataset(start_step)`),
            or with `reread` `train_loop`'s (also a zero-argument factory; read
            in passes with `epochs`).
        state: the state the loop starts with; its strategy places the batches
            read ahead.
        elapsed, start_at: where the loop starts (a resumed run's restored
            `Elapsed`, and `ciclo._input.resume.prepare`'s `Start`).
        stop: nothing is read past a `stop` in steps.
        steps_per_call: batches per fused call (1: none).
        prefetch: items read and placed ahead (`ciclo.loop`'s argument).
        batch_size_fn: counts a batch's samples (`Inputs.batch_size_fn`, the
            loop's count: `sample_counter`).
        reread, epochs, epoch_duration: `train_loop`'s data (`train_data`).

    Raises:
        TypeError / ValueError: for a dataset that cannot be read as asked, or
            bad `epochs` (see `one_pass` and `train_data`).
    """
    start_at = Start() if start_at is None else start_at
    if stop is not None and elapsed is not None and stop.reached(elapsed):
        data = Passes.once(iter(()))  # nothing left: no batch is read (back)
    elif reread:
        data = train_data(dataset, epochs, epoch_duration, elapsed, start_at)
    else:
        data = one_pass(dataset, elapsed, start_at)
    left = None
    if stop is not None and stop.steps is not None:
        start = 0 if elapsed is None else int(elapsed.steps)
        left = [max(int(stop.steps) - start, 0)]
    return Inputs(
        data, steps_per_call=steps_per_call, place=placer(state, prefetch),
        depth=prefetch, left=left, batch_size_fn=sample_counter(batch_size_fn, state),
    )  # fmt: skip


def sample_counter(
    batch_size_fn: Callable[[list[tuple[int, ...]]], int] | None, state: Any
) -> Callable[[list[tuple[int, ...]]], int] | None:
    """How the loop counts a batch's samples (`elapsed.samples`): `batch_size_fn`
    (or the largest first axis), times the process-local slices that make one
    global batch under the state's strategy (multi-process `"sharded"`: each
    process counts what all of them feed, as the single-process run does)."""
    if getattr(state, "strategy", None) is None:  # no strategy: whole batches
        return batch_size_fn
    from ciclo._strategies.registry import strategy_of  # (lazily: optional deps)

    slices = getattr(strategy_of(state), "_batch_slices", None)
    factor = 1 if slices is None else int(slices())
    if factor == 1:
        return batch_size_fn

    return lambda shapes: shapes_size(shapes, batch_size_fn) * factor
