"""Epochs of `train_loop`: the data as passes, and the epoch-end schedule."""

from __future__ import annotations

import inspect
import itertools
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ciclo._logs import Logs
from ciclo._resume import checkpointable
from ciclo._schedules.base import Schedule
from ciclo._time import Elapsed, Period, as_period


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
            if self._current() is None:
                raise StopIteration
            self._ahead = self._read_one()
        self.empty = False
        return self._ahead.pop()

    def exhausted(self) -> bool:
        """Whether the current pass has no batch left (reads one ahead)."""
        if not self._ahead:
            if self._current() is None:
                return True
            if checkpointable(self._iterator):  # its position before the look-ahead
                self._before_ahead = self._iterator.get_state()
            self._ahead = self._read_one()
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

    def skip(self, n: int) -> None:
        """Reads and discards `n` batches (those a resumed run already consumed)."""
        end = object()
        for _ in range(n):
            if next(self, end) is end:
                return
        self.exhausted()  # a pass that ended exactly here counts as completed
        self.empty = True

    def transform(self, each_pass: Callable[[Iterator[Any]], Iterator[Any]]) -> None:
        """Reads every pass, the rest of the current one included, through
        `each_pass` (e.g. `fuse`, grouping batches into calls within a pass)."""
        if self._iterator is not None:
            rest = itertools.chain(reversed(self._ahead), self._iterator)
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
        return Passes(lambda: _iter(dataset(), "`dataset()` returned"), epochs)
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


def _iter(batches: Any, what: str) -> Iterator[Any]:
    try:
        return iter(batches)
    except TypeError:
        raise TypeError(
            f"train_loop: {what} {batches!r:.100} ({type(batches).__name__}), which "
            f"is not iterable; expected an iterable of batches."
        ) from None


class EpochEnd(Schedule):
    """Fires on the batches that end an epoch; reads the loop state.

    A batch ends an epoch when its `elapsed_after` crosses a multiple of `duration`
    (int steps or a `Period` of steps, samples, time) in any field, reaches `stop`,
    or is the last of its pass (asked of `exhausted` only when neither holds and
    no stop was requested, so no batch is read ahead for nothing). `start` is where
    the loop starts counting, so resumed runs keep their epoch boundaries; `count`
    is the number of epochs ended so far (`count_from` at the start). One decision
    per batch: every named schedule of the epoch end gets the same answer.

    Raises:
        ValueError: for a `duration` with a `date` or a field <= 0.
    """

    reads_loop_state = True

    def __init__(
        self,
        duration: int | Period | None,
        stop: Period | None,
        start: Elapsed,
        exhausted: Callable[[], bool] | None,
        count_from: int = 0,
    ):
        self.duration = (
            None if duration is None else as_period(duration, "epoch_duration")
        )
        fields = {} if self.duration is None else self.duration.fields()
        if "date" in fields or any(amount <= 0 for amount in fields.values()):
            raise ValueError(
                f"`epoch_duration` must be positive steps, samples or time (a `date` "
                f"is an instant, not a duration), e.g. ciclo.at(time=600); got "
                f"{duration!r}."
            )
        self.stop, self.exhausted = stop, exhausted
        self._fields = tuple(fields.items())  # read per batch: computed once
        self._index, self._for, self._ended = self._indices(start), None, False
        self.count = max(self._index, default=count_from)
        self.decided = False  # a decision was taken for an earlier batch

    def _indices(self, elapsed: Elapsed) -> tuple[int, ...]:
        return tuple(math.floor(getattr(elapsed, f) / n) for f, n in self._fields)

    def __call__(self, loop_state: Any) -> bool:
        after = loop_state.elapsed_after
        if after is not self._for:
            ended = self.stop is not None and self.stop.reached(after)
            index = self._indices(after)
            ended = ended or any(new > old for new, old in zip(index, self._index))
            requested = loop_state.stopping or loop_state.stop_iteration
            if not ended and not requested and self.exhausted is not None:
                ended = self.exhausted()
            self._index, self._for, self._ended = index, after, ended
            self.count += ended
            self.decided = True
        return self._ended

    def begins(self) -> bool:
        """Whether the current batch begins an epoch (asked before this batch's
        decision: the first batch, or the one after an epoch end)."""
        return not self.decided or self._ended

    def __repr__(self) -> str:
        return "epoch end"


class EpochMeans:
    """`train_loop(epoch_logs=True)`: adds up each train batch's losses and metrics
    (weighted by its batch size, on the device: no host sync), and at the epoch end
    logs their means as `{name}_epoch` in the same collection, then starts over."""

    COLLECTIONS = ("losses", "metrics")

    def __init__(self) -> None:
        self._sums: dict[tuple[str, str], Any] = {}
        self._sizes: dict[tuple[str, str], int] = {}

    def add(self, state: Any, batch: Any, elapsed: Elapsed, loop_state: Any) -> None:
        size = loop_state.elapsed_after.samples - elapsed.samples
        for collection in self.COLLECTIONS:
            for name, value in (loop_state.logs.get(collection) or {}).items():
                key = (collection, name)
                total = self._sums.get(key)
                weighted = value * size
                self._sums[key] = weighted if total is None else total + weighted
                self._sizes[key] = self._sizes.get(key, 0) + size

    def means(self) -> Logs:
        logs = Logs()
        for (collection, name), total in self._sums.items():
            size = max(self._sizes[(collection, name)], 1)
            logs.add_entry(collection, f"{name}_epoch", total / size)
        self._sums, self._sizes = {}, {}
        return logs
