"""The epoch-end schedule of `train_loop`, and the one-batch look-ahead it uses."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

from ciclo._schedules.base import Schedule
from ciclo._time import Elapsed, Period, as_period


class Peekable:
    """An iterator that can tell, reading one batch ahead, whether it is exhausted."""

    def __init__(self, iterator: Iterator[Any]):
        self._iterator, self._ahead = iterator, []
        self.empty = True  # no batch came out yet

    def __iter__(self) -> Peekable:
        return self

    def __next__(self) -> Any:
        batch = self._ahead.pop() if self._ahead else next(self._iterator)
        self.empty = False
        return batch

    def exhausted(self) -> bool:
        if not self._ahead:
            try:
                self._ahead.append(next(self._iterator))
            except StopIteration:
                return True
        return False


class EpochEnd(Schedule):
    """Fires on the batches that end an epoch; reads the loop state.

    A batch ends an epoch when its `elapsed_after` crosses a multiple of `duration`
    (int steps or a `Period` of steps, samples, time) in any field, reaches `stop`,
    or is the last one (asked of `exhausted` only when neither holds and no stop
    was requested, so no batch is read ahead for nothing). `start` is where the loop
    starts counting, so resumed runs keep their epoch boundaries. One decision per
    batch: every named schedule of the epoch end gets the same answer.

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
        self._index, self._for, self._ended = self._indices(start), None, False

    def _indices(self, elapsed: Elapsed) -> tuple[int, ...]:
        fields = {} if self.duration is None else self.duration.fields()
        return tuple(math.floor(getattr(elapsed, f) / n) for f, n in fields.items())

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
        return self._ended

    def __repr__(self) -> str:
        return "epoch end"
