"""`train_loop`'s data as passes: re-read per epoch, read one batch ahead when the
epoch end needs to know whether the pass is exhausted."""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from ciclo._input.resume import checkpointable, position, read_back
from ciclo._short import short


class Passes:
    """The training batches, pass after pass, reading one batch ahead when asked
    whether the current pass is exhausted.

    `next_pass()` returns the iterator of the next pass (a re-iterable dataset
    iterated again, a zero-argument factory called again); `passes` bounds how many
    are read (None: no bound; an empty pass ends the data). `completed` counts the
    passes exhausted so far; `empty` is True until a batch is drawn (after `skip`).
    """

    def __init__(self, next_pass: Callable[[], Iterator[Any]], passes=None):
        self._next_pass, self._passes = next_pass, passes
        self._iterator: Iterator[Any] | None = None
        self._ahead: list[Any] = []
        self._started = self._read = self.completed = 0
        self._before_ahead = None
        self._failed: Exception | None = None  # the look-ahead's, raised at its batch
        self.empty = True

    @classmethod
    def once(cls, iterator: Iterator[Any]) -> Passes:
        """A single pass over `iterator`."""
        return cls(lambda: iterator, passes=1)

    def __iter__(self) -> Passes:
        return self

    def _current(self) -> Iterator[Any] | None:
        if self._iterator is None:
            if self._passes is not None and self._started >= self._passes:
                return None
            self._iterator, self._read = self._next_pass(), 0
            self._started += 1
        return self._iterator

    def _pass_ended(self) -> None:
        self._iterator, self.completed = None, self.completed + 1
        if not self._read:  # an empty pass: every next one would be empty too
            self._passes = self._started

    def _read_one(self) -> list[Any]:
        while (iterator := self._current()) is not None:
            try:
                batch = next(iterator)
            except StopIteration:
                self._pass_ended()
                return []
            self._read += 1
            return [batch]
        return []

    def __next__(self) -> Any:
        while not self._ahead:
            if self._failed is not None:  # the dataset raised reading this batch
                failed, self._failed = self._failed, None
                raise failed
            if self._current() is None:
                raise StopIteration
            self._ahead = self._read_one()
        self.empty = False
        return self._ahead.pop()

    def exhausted(self) -> bool:
        """Whether the current pass has no batch left (reads one ahead). When the
        dataset raises reading ahead, the pass is not exhausted and the error is
        raised when that batch is fetched (the dataset's error, at its batch)."""
        if not self._ahead:
            if self._current() is None:
                return True
            if checkpointable(self._iterator):  # its position before the look-ahead
                self._before_ahead = self._iterator.get_state()
            try:
                self._ahead = self._read_one()
            except Exception as error:  # raised when that batch is fetched, as
                self._failed = error  # the dataset's: the current batch completes
                return False
        return not self._ahead

    def get_state(self) -> Any:
        """The position after the last batch handed out, for a single pass over a
        checkpointable iterator (Grain's); else None."""
        if self._passes != 1 or self._started != 1:
            return None
        if self._ahead:
            return self._before_ahead
        iterator = self._iterator
        return iterator.get_state() if checkpointable(iterator) else None

    def skip(self, n: int, start: int = 0, warn: bool = False) -> None:
        """Reads and discards `n` batches (those a resumed run already consumed,
        up to step `start`); with `warn`, says so first (`read_back`)."""
        if not read_back(self, n, start, "train_loop", stacklevel=5, say=warn):
            return
        self.exhausted()  # a pass that ended exactly here counts as completed
        self.empty = True

    def transform(self, each_pass: Callable[[Iterator[Any]], Iterator[Any]]) -> None:
        """Reads every pass, the rest of the current one included, through
        `each_pass` (e.g. `fuse`, grouping batches into calls within a pass)."""
        if self._iterator is not None:
            rest = self._iterator  # itself when nothing was read ahead (its state)
            if self._ahead:
                rest = itertools.chain(reversed(self._ahead), rest)
            self._iterator, self._ahead = each_pass(rest), []
        next_pass = self._next_pass
        self._next_pass = lambda: each_pass(next_pass())


def passes(dataset: Any, epochs: int | None, where: str) -> Passes | None:
    """The data as `Passes` when it is re-iterable (a zero-argument factory, or an
    iterable whose `iter()` is not itself), else None.

    Raises:
        TypeError: with `epochs`, for data that can be read only once.
    """
    if zero_argument_factory(dataset):
        return Passes(lambda: iterate(dataset(), "`dataset()` returned"), epochs)
    if isinstance(dataset, Iterable) and iter(dataset) is not dataset:
        return Passes(lambda: iter(dataset), epochs)
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
    if epochs is not None and (
        isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1
    ):
        raise ValueError(
            f"train_loop: `epochs` must be an int >= 1 (passes over `dataset`, or "
            f"epochs of `epoch_duration`), got {epochs!r}."
        )
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
