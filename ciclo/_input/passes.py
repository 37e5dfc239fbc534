"""The data as passes: `train_loop`'s dataset re-read per epoch (a re-iterable
dataset iterated again, a zero-argument factory called again), `ciclo.loop`'s
read once; a resumed run's consumed batches read back across passes."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from ciclo._input.resume import checkpointable, position, read_back
from ciclo._short import short


class Passes:
    """The data's passes, opened one at a time by the input stage.

    `open()` returns the iterator of the next pass (`next_pass()`), or None once
    `bound` passes were opened (None: no bound) or a pass was empty (every next
    one would be empty too). `completed` counts the passes read to their end.
    """

    def __init__(self, next_pass: Callable[[], Iterator[Any]], passes=None):
        self._next_pass, self.bound = next_pass, passes
        self._opened = self.completed = 0
        self._resumed: Iterator[Any] | None = None  # where a read-back stopped

    @classmethod
    def once(cls, iterator: Iterator[Any]) -> Passes:
        """A single pass over `iterator`."""
        return cls(lambda: iterator, passes=1)

    def open(self) -> Iterator[Any] | None:
        """The next pass's iterator (the rest of the pass a resumed run stopped
        in, first), or None when no pass is left."""
        if self._resumed is not None:
            resumed, self._resumed = self._resumed, None
            return resumed
        if self.bound is not None and self._opened >= self.bound:
            return None
        self._opened += 1
        return self._next_pass()

    def ended(self, read: int) -> None:
        """The pass opened last ended after `read` batches (fused calls)."""
        self.completed += 1
        if not read:  # an empty pass: every next one would be empty too
            self.bound = self._opened

    def skip(self, n: int, start: int = 0, warn: bool = False) -> None:
        """Reads and discards `n` batches across passes (those a resumed run
        already consumed, up to step `start`); with `warn`, says so first
        (`read_back`). A pass that ends exactly there counts as completed (one
        batch is read to know it, and put back in front of the rest)."""
        current: list[Any] = [None]

        def batches() -> Iterator[Any]:
            while (iterator := self.open()) is not None:
                current[0], read = iterator, 0
                for batch in iterator:
                    read += 1
                    yield batch
                current[0] = None
                self.ended(read)

        if n <= 0:
            return
        done = read_back(batches(), n, start, "train_loop", stacklevel=5, say=warn)
        iterator = current[0]
        if iterator is None:  # the data ended first
            return
        if not done:  # preempted: the rest of the pass is read from there
            self._resumed = iterator
            return
        before = iterator.get_state() if checkpointable(iterator) else None
        try:
            batch = next(iterator)
        except StopIteration:
            self.completed += 1
            return
        except Exception as error:  # the dataset's: raised at its batch
            self._resumed = _Held(iterator, before, error=error)
            return
        self._resumed = _Held(iterator, before, batch=[batch])


class _Held:
    """A pass's iterator with the batch read after a read-back put back in front
    (or the error reading it, raised in its place); a checkpointable iterator's
    `get_state()` / `set_state()` are kept (the position before that batch until
    it is read again)."""

    def __init__(self, iterator, before, batch=(), error=None):
        self._iterator, self._before = iterator, before
        self._held, self._error = list(batch), error
        if checkpointable(iterator):
            self.get_state, self.set_state = self._get_state, self._set_state

    def __iter__(self) -> _Held:
        return self

    def __next__(self) -> Any:
        if self._held:
            return self._held.pop()
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        return next(self._iterator)

    def _get_state(self) -> Any:
        if self._held or self._error is not None:
            return self._before
        return self._iterator.get_state()

    def _set_state(self, state: Any) -> None:
        self._held, self._error = [], None
        self._iterator.set_state(state)


def passes(dataset: Any, epochs: int | None, where: str) -> Passes | None:
    """The data as `Passes` when it is re-iterable (a zero-argument factory, or an
    iterable whose `iter()` is not itself), else None.

    Raises:
        TypeError: with `epochs`, for data that can be read only once.
    """
    if zero_argument_factory(dataset):
        return Passes(lambda: iterate(dataset(), "`dataset()` returned"), epochs)
    if isinstance(dataset, Iterable):
        first = iter(dataset)
        if first is not dataset:
            # the iterator made to tell is the first pass's: a loader makes no
            # iterator it does not use (a shuffled DataLoader draws its seed and
            # starts its workers at `iter()`, so the passes are a plain loop's)
            unused = [first]
            return Passes(lambda: unused.pop() if unused else iter(dataset), epochs)
    if epochs is not None and callable(dataset):
        raise TypeError(
            f"{where}: with `epochs`, a callable `dataset` must be a zero-argument "
            f"factory called once per epoch, but {dataset!r:.80} needs arguments. "
            f"Use e.g. `lambda: make_batches()`."
        )
    if epochs is not None:
        raise TypeError(
            f"{where}: `epochs` needs data it can read once per epoch, but `dataset` "
            f"is {dataset!r:.80} ({type(dataset).__name__}), which can be read only "
            f"once (an iterator or generator). Pass a list / array / re-iterable "
            f"loader, or a zero-argument factory such as `lambda: make_batches()`; "
            f"or drop `epochs` and use `stop=` with an `epoch_duration`."
        )
    return None


def zero_argument_factory(dataset: Any) -> bool:
    """A callable, non-iterable dataset that takes no argument (called per pass)."""
    if not callable(dataset) or isinstance(dataset, Iterable):
        return False
    try:
        inspect.signature(dataset).bind()
    except (TypeError, ValueError):
        return False
    try:  # takes a start step too: the `dataset(start_step)` form wins
        inspect.signature(dataset).bind(0)
    except TypeError:
        return True
    return False


def iterate(batches: Any, what: str) -> Iterator[Any]:
    try:
        return iter(batches)
    except TypeError:
        raise TypeError(
            f"train_loop: {what} {short(batches)} ({type(batches).__name__}), which "
            f"is not iterable; expected an iterable of batches."
        ) from None


def check_epochs(epochs: Any) -> None:
    """Raises ValueError for `epochs` that is not None or an int >= 1."""
    if epochs is not None and (
        isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1
    ):
        raise ValueError(
            f"train_loop: `epochs` must be an int >= 1 (passes over `dataset`, or "
            f"epochs of `epoch_duration`), got {short(epochs)}."
        )


def train_data(
    dataset: Any, epochs: int | None, epoch_duration: Any, elapsed: Any, start_at: Any
) -> Passes:
    """`train_loop`'s data: `Passes` over a re-iterable `dataset` or a zero-argument
    factory (one pass; `epochs` passes with `epochs`; no bound when epochs are
    durations), with the batches a resumed run consumed (`start_at`) skipped; else
    one pass over the iterator positioned where the resumed run stopped.

    Raises:
        ValueError: for `epochs` that is not an int >= 1.
    """
    check_epochs(epochs)
    data = None
    if epochs is not None or zero_argument_factory(dataset):
        repeat = 1 if epochs is None else epochs if epoch_duration is None else None
        data = passes(dataset, repeat, "train_loop")
    if data is None:
        dataset = position(dataset, elapsed, start_at, "train_loop", stacklevel=4)
        return Passes.once(iterate(dataset, "`dataset` is"))
    start = 0 if elapsed is None else int(elapsed.steps)
    indexable = isinstance(dataset, Sequence | np.ndarray)  # read back at no cost
    data.skip(start_at.batches, start, warn=not indexable)
    return data


def one_pass(dataset: Any, elapsed: Any, start_at: Any) -> Passes:
    """`ciclo.loop`'s data: one pass over `dataset` from the start step (a
    factory called with it, a checkpointable iterator given its saved state, a
    plain iterable read back; `position`).

    Raises:
        TypeError: for a dataset that is neither iterable nor a factory.
    """
    dataset = position(dataset, elapsed, start_at, "ciclo.loop", stacklevel=4)
    try:
        iterator = iter(dataset)
    except TypeError:
        raise TypeError(
            f"`dataset` must be an iterable of batches (a list, generator, numpy "
            f"array, tf.data/Grain/PyTorch loader, ...) or a factory "
            f"`dataset(start_step)` returning one; got {short(dataset)} "
            f"({type(dataset).__name__})."
        ) from None
    return Passes.once(iterator)
