"""The epoch-end schedule of `train_loop`, over `elapsed_after`."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

from ciclo._schedules.base import Schedule
from ciclo._time import Elapsed, Period, as_period


class Peekable:
    """An iterable that can tell, reading one batch ahead, whether it is exhausted."""

    def __init__(self, iterator: Iterator[Any]):
        self._iterator = iterator
        self._ahead: list[Any] = []

    def __iter__(self) -> Peekable:
        return self

    def __next__(self) -> Any:
        if self._ahead:
            return self._ahead.pop()
        return next(self._iterator)

    def exhausted(self) -> bool:
        """Whether no batch follows the last one returned (drawing it now if needed)."""
        if not self._ahead:
            try:
                self._ahead.append(next(self))
            except StopIteration:
                return True
        return False


class EpochEnd(Schedule):
    """Fires on the batches that end an epoch; reads the loop state.

    A batch ends an epoch when its `elapsed_after` crosses a multiple of `duration`
    in any of its fields, reaches `stop`, or is the last one (asked of `exhausted`
    only when neither holds and no stop was requested, so no batch is read ahead
    for nothing). One decision per batch: every named schedule of the epoch end
    gets the same answer.

    Args:
        duration: int steps or a `Period` (steps, samples, time), or None.
        stop: the loop's `stop`, or None.
        start: the `Elapsed` the loop starts from (epoch boundaries survive resumes).
        exhausted: called to learn whether the data is exhausted.
        name: shown in error messages (`repr`).

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
        name: str = "epoch end",
    ):
        self.duration = _duration(duration)
        self.stop, self.exhausted, self.name = stop, exhausted, name
        self._index = self._indices(start)
        self._for: Elapsed | None = None
        self._ended = False

    def _indices(self, elapsed: Elapsed) -> tuple[int, ...]:
        if self.duration is None:
            return ()
        return tuple(
            math.floor(getattr(elapsed, field) / amount)
            for field, amount in self.duration.fields().items()
        )

    def __call__(self, loop_state: Any) -> bool:
        after = loop_state.elapsed_after
        if after is self._for:
            return self._ended
        ended = self.stop is not None and self.stop.reached(after)
        index = self._indices(after)
        ended = ended or any(new > old for new, old in zip(index, self._index))
        self._index = index
        requested = loop_state.stopping or loop_state.stop_iteration
        if not ended and not requested and self.exhausted is not None:
            ended = self.exhausted()
        self._for, self._ended = after, ended
        return ended

    def __repr__(self) -> str:
        return self.name


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
