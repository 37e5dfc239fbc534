"""Epoch boundaries of `train_loop`, decided from the elapsed counted AFTER a batch."""

from __future__ import annotations

import math
import time as _time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ciclo.time import Elapsed, Period, as_period, batch_size

__all__ = ["EpochClock", "lookahead"]


def _duration(value: Any, argument: str) -> Period | None:
    if value is None:
        return None
    period = as_period(value, argument)
    if period.date is not None:
        raise ValueError(
            f"`{argument}` cannot use `date` (a wall-clock instant is not a "
            f"duration); use steps, samples or time, e.g. ciclo.at(time=600)."
        )
    for name, amount in period.fields().items():
        if amount <= 0:
            raise ValueError(
                f"`{argument}` must be positive, got {name}={amount!r} in {period}."
            )
    return period


class EpochClock:
    """Says, once per batch, whether that batch ended an epoch.

    An epoch ends after the batch whose post-batch elapsed (`elapsed.update(batch
    size)`) crosses a multiple of `duration` in any of its fields, i.e. when
    `floor(value / duration)` grows. It also ends after the last batch of a dataset
    wrapped with `lookahead` (`exhausted`).

    It is given to the loop as an `on_start` callback (to see the loop state and
    the starting elapsed, so resumed runs keep their epoch boundaries) and its
    `at(name)` schedules gate the epoch-end callbacks.

    Args:
        duration: int steps or a `Period` (steps, samples and/or time), or None.
        argument: the argument name used in error messages.
        batch_size_fn: as in `ciclo.loop`, to count samples.

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
        argument: str = "epoch_duration",
        batch_size_fn: Callable[[list[tuple[int, ...]]], int] | None = None,
    ):
        self.duration = _duration(duration, argument)
        self.batch_size_fn = batch_size_fn
        self.exhausted = False
        self._loop_state: Any = None
        self._index: tuple[int, ...] = ()
        self._decided_for: Elapsed | None = None
        self._ended = False

    def __loop_callback__(self, loop_state: Any) -> None:
        self._loop_state = loop_state
        if self.duration is not None:
            start = loop_state.elapsed
            self._index = self._indices(start.steps, start.samples, float(start.time))

    def _indices(self, steps: int, samples: int | None, time: float | None):
        d = self.duration
        out = []
        if d.steps is not None:
            out.append(steps // d.steps)
        if d.samples is not None:
            out.append(samples // d.samples)
        if d.time is not None:
            out.append(math.floor(time / d.time))
        return tuple(out)

    def ended(self, elapsed: Elapsed) -> bool:
        """Whether the batch that starts at `elapsed` ends an epoch (cached per batch)."""
        if elapsed is self._decided_for:
            return self._ended
        ended = self.exhausted
        if self.duration is not None:
            d = self.duration
            samples = time = None
            if d.samples is not None:
                batch = self._loop_state.batch
                samples = elapsed.samples + batch_size(batch, self.batch_size_fn)
            if d.time is not None:
                time = _time.time() - elapsed.date_start
            index = self._indices(elapsed.steps + 1, samples, time)
            ended = ended or any(new > old for new, old in zip(index, self._index))
            self._index = index
        self._decided_for, self._ended = elapsed, ended
        return ended

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


def lookahead(dataset: Iterable[Any], clock: EpochClock) -> Iterator[Any]:
    """Yields `dataset`'s batches, drawing one ahead so the last one ends an epoch."""
    iterator = iter(dataset)
    try:
        current = next(iterator)
    except StopIteration:
        return
    for upcoming in iterator:
        yield current
        current = upcoming
    clock.exhausted = True
    yield current
