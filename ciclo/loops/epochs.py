"""Epoch ends and the stop of `train_loop`: one decision per batch, from the elapsed
counted AFTER the batch, so an epoch always ends with the batch that ends the loop.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ciclo.time import Elapsed, Period, as_period, batch_size

__all__ = ["Batches", "EpochClock"]


def _duration(value: Any) -> Period | None:
    if value is None:
        return None
    period = as_period(value, "epoch_duration")
    if period.date is not None:
        raise ValueError(
            "`epoch_duration` cannot use `date` (a wall-clock instant is not a "
            "duration); use steps, samples or time, e.g. ciclo.at(time=600)."
        )
    for name, amount in period.fields().items():
        if amount <= 0:
            raise ValueError(
                f"`epoch_duration` must be positive, got {name}={amount!r} in {period}."
            )
    return period


class Batches:
    """The training data as `train_loop` feeds it: read one batch ahead only on demand.

    `more()` draws the next batch early (and keeps it for the loop) to learn whether
    the current one is the last. Nothing is drawn when `reached()` says the stop was
    already reached at the start, so no batch is ever taken from a shared iterator
    and dropped.
    """

    def __init__(self, dataset: Iterable[Any], reached: Callable[[], bool]):
        self._dataset = dataset
        self._reached = reached
        self._iterator: Iterator[Any] | None = None
        self._ahead: list[Any] = []

    def __iter__(self) -> Batches:
        if self._iterator is None:
            self._iterator = iter(()) if self._reached() else iter(self._dataset)
        return self

    def __next__(self) -> Any:
        if self._ahead:
            return self._ahead.pop()
        return next(self._iterator)

    def more(self) -> bool:
        """Whether a batch follows the current one (drawing it now if needed)."""
        if not self._ahead:
            try:
                self._ahead.append(next(self._iterator))
            except StopIteration:
                return False
        return True


class EpochClock:
    """Decides, once per batch, whether the batch ends an epoch and the loop.

    With `elapsed.update(batch_size)` read once per batch (at the first epoch-end
    check, else at the end of the batch):

    - the loop stops after the batch when that elapsed reaches `stop` (`final`);
    - the batch ends an epoch when it is final, when `floor(value / duration)`
      grows in any field of `duration`, or when the data is exhausted — the last
      check reads one batch ahead (`Batches.more`), and only when the batch did not
      already end an epoch and no callback asked to stop (`requested()`).

    It is given to the loop as an `on_start` callback (to see the loop state and the
    starting elapsed, so resumed runs keep their epoch boundaries); its `at(name)`
    schedules gate the epoch-end callbacks.

    Args:
        duration: the epoch length: int steps or a `Period` (steps, samples and/or
            time), or None (the run is one epoch).
        stop: where the loop ends (int steps or any `Period`), or None.
        batch_size_fn: as in `ciclo.loop`, to count samples.

    Raises:
        ValueError: for an `epoch_duration` with a `date` or a field <= 0.
        TypeError: for an `epoch_duration` or `stop` that is not an int or Period.

    Example:
        >>> import ciclo
        >>> from ciclo.loops.epochs import EpochClock
        >>> clock = EpochClock(3)
        >>> _ = ciclo.loop(None, range(7), {clock.at("end"): lambda: print("end")},
        ...                on_start=clock)
        end
        end
    """

    def __init__(
        self,
        duration: int | Period | None,
        stop: int | Period | None = None,
        batch_size_fn: Callable[[list[tuple[int, ...]]], int] | None = None,
    ):
        self.duration = _duration(duration)
        self.stop = None if stop is None else as_period(stop, "stop")
        self.batch_size_fn = batch_size_fn
        self.batches: Batches | None = None
        self.requested: Callable[[], bool] = lambda: False
        # what a batch's reading needs: samples (a batch size), time (the clock)
        fields = [p for p in (self.duration, self.stop) if p is not None]
        self._samples = any(p.samples is not None for p in fields)
        self._timed = any(p.time is not None or p.date is not None for p in fields)
        self._loop_state: Any = None
        self._index: tuple[int, ...] = ()
        self._for: Elapsed | None = None  # the batch read (its elapsed before)
        self._counts: tuple[int, int | None, float | None] = (0, None, None)
        self._final = False
        self._ended: bool | None = None

    def wrap(self, dataset: Iterable[Any], elapsed: Elapsed | None) -> Batches:
        """`dataset` as `Batches`, empty when `stop` is reached at the start.

        `elapsed` is the loop's `elapsed` argument (None: start from zero).
        """

        def reached() -> bool:
            if self.stop is None:
                return False
            start = Elapsed.create() if elapsed is None else elapsed.resume()
            return start >= self.stop

        self.batches = Batches(dataset, reached)
        return self.batches

    def __loop_callback__(self, loop_state: Any) -> None:
        self._loop_state = loop_state
        if self.duration is not None:
            start = loop_state.elapsed
            self._index = self._indices(start.steps, start.samples, float(start.time))

    def _indices(self, steps: int, samples: int | None, seconds: float | None):
        d = self.duration
        out = []
        if d.steps is not None:
            out.append(steps // d.steps)
        if d.samples is not None:
            out.append(samples // d.samples)
        if d.time is not None:
            out.append(math.floor(seconds / d.time))
        return tuple(out)

    def _read(self, elapsed: Elapsed) -> None:
        """Reads the elapsed after the batch that starts at `elapsed`, once per batch.

        Only what `duration` and `stop` use: steps, samples (the batch size), and
        the clock for time and date.
        """
        if elapsed is self._for:
            return
        self._for, self._ended = elapsed, None
        steps, samples, seconds, date = elapsed.steps + 1, None, None, None
        if self._samples:
            size = batch_size(self._loop_state.batch, self.batch_size_fn)
            samples = elapsed.samples + size
        if self._timed:
            now = elapsed.update_time()
            seconds, date = float(now.time), float(now.date)
        self._counts = (steps, samples, seconds)
        stop = self.stop
        self._final = stop is not None and (
            (stop.steps is not None and steps >= stop.steps)
            or (stop.samples is not None and samples >= stop.samples)
            or (stop.time is not None and seconds >= stop.time)
            or (stop.date is not None and date >= stop.date)
        )

    def final(self, elapsed: Elapsed) -> bool:
        """Whether the loop must stop after this batch because `stop` is reached."""
        if self.stop is None:
            return False
        self._read(elapsed)
        return self._final

    def ended(self, elapsed: Elapsed) -> bool:
        """Whether the batch that starts at `elapsed` ends an epoch (cached per batch)."""
        self._read(elapsed)
        if self._ended is None:
            ended = self._final
            if self.duration is not None:
                index = self._indices(*self._counts)
                ended = ended or any(new > old for new, old in zip(index, self._index))
                self._index = index
            if not ended and self.batches is not None and not self.requested():
                ended = not self.batches.more()
            self._ended = ended
        return self._ended

    def at(self, name: str) -> _EpochEnd:
        """A schedule firing on the batches that end an epoch (`name` for errors)."""
        return _EpochEnd(self, name)


class _EpochEnd:
    """Plain callable (not a `Schedule`) so the loop does not copy the shared clock."""

    __slots__ = ("clock", "name")

    def __init__(self, clock: EpochClock, name: str):
        self.clock, self.name = clock, name

    def __call__(self, elapsed: Elapsed) -> bool:
        return self.clock.ended(elapsed)

    def __repr__(self) -> str:
        return self.name
