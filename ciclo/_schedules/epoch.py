"""The epoch-end schedule of `train_loop`, over `loop_state.elapsed_after`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ciclo._period import Period, as_period
from ciclo._schedules.base import Schedule
from ciclo._short import short
from ciclo._time import Elapsed

if TYPE_CHECKING:
    from ciclo._loop.state import LoopState


class EpochEnd(Schedule):
    """Fires on the batches that end an epoch; reads the loop state.

    A batch ends an epoch when its `elapsed_after` crosses a multiple of `duration`
    (int steps or a `Period` of steps, samples, time) in any field, reaches `stop`,
    or, with `passes`, is the last of its pass (`Inputs.last_of_pass`: the input stage
    says it, reading the next batch of the pass when it does not know yet; asked
    only when neither holds and no stop was requested, so no batch is read ahead
    for nothing; the schedule never touches the data). `start` is where
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
        passes: bool,
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
                f"{short(duration)}."
            )
        self.stop, self.passes = stop, passes
        # deciding may read the next batch of the pass (`Run`, `Inputs.keep_batches`)
        self.asks_pass_end = passes
        self._fields = tuple(fields.items())  # read per batch: computed once
        # only the pass end and a `stop` in steps decide (`train_loop` over its
        # passes, no duration): the per-batch decision takes its short path
        stop_fields = {} if stop is None else stop.fields()
        self._pass_only = (
            passes and not self._fields and stop_fields.keys() <= {"steps"}
        )
        self._stop_steps = stop_fields.get("steps")  # None: no stop in steps
        self._index, self._for, self._ended = (
            self._indices(
                {"steps": start.steps, "samples": start.samples, "time": start.time}
            ),
            None,
            False,
        )
        self.count = max(self._index, default=count_from)

    @property
    def decided(self) -> bool:
        """Whether a decision was taken for an earlier batch."""
        return self._for is not None

    def _indices(self, at: Mapping[str, float]) -> tuple[int, ...]:
        """How many `duration`s each field of `at` (field -> amount) holds."""
        return tuple(math.floor(at[f] / n) for f, n in self._fields)

    def __call__(self, loop_state: LoopState) -> bool:
        # `elapsed_after`'s fields (steps, samples, date, date_start): one
        # object per batch, set by the loop's `Run` (the `Elapsed` itself is
        # built only when read)
        counts = loop_state._after_counts
        if counts is self._for:  # decided for this batch already
            return self._ended
        self._for = counts
        if self._pass_only:  # no duration, at most a stop in steps
            stop_steps = self._stop_steps
            ended = stop_steps is not None and counts[0] >= stop_steps
        else:
            ended = self.stop is not None and self.stop._reached_at(counts)
            if self._fields:  # an `epoch_duration`: its counts moved on?
                steps, samples, date, start = counts
                at = {"steps": steps, "samples": samples, "time": date - start}
                index = self._indices(at)
                ended = ended or any(new > old for new, old in zip(index, self._index))
                self._index = index
        if (
            self.passes
            and not ended
            and not (loop_state.stopping or loop_state.stop_iteration)
        ):  # no stop requested: the pass end decides
            item = loop_state.placed  # its pass end, when the stage knows it
            if item is not None:
                ended = item.last_of_pass
                if ended is None:  # the input stage reads on to learn it
                    ended = loop_state._data.last_of_pass(item)
                    # callbacks then get the batch as the stage kept it (its
                    # own copy, so that reading on did not change it)
                    loop_state.batch = item.batch
        self._ended = ended
        if ended:
            self.count += 1
        return ended

    def begins(self) -> bool:
        """Whether the current batch begins an epoch (asked before this batch's
        decision: the first batch, or the one after an epoch end)."""
        return not self.decided or self._ended

    def __repr__(self) -> str:
        return "epoch end"


def epochs_end(stop: Period | None, duration: Period, epochs: int) -> Period:
    """`stop`, or the end of epoch `epochs` of `duration`, whichever comes first."""
    fields = {f: n * epochs for f, n in duration.fields().items()}
    for f, n in ({} if stop is None else stop.fields()).items():
        fields[f] = min(n, fields.get(f, n))
    return Period.create(**fields)
