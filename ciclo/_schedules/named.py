"""Named schedules (`ciclo.on_train_step`, ...): places in a predefined loop's
order, usable as task keys and composable with ordinary schedules (`&`, `.every`).
Where each one runs is in `ciclo._loops.tables`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ciclo._schedules.base import And, Schedule, fresh


class NamedSchedule(str):
    """A named schedule (`ciclo.on_epoch_end`, ...): the string of its name, usable
    as a task key of the predefined loops, that also composes with a schedule.

    `named & schedule` (or `schedule & named`) runs its callbacks where the named
    schedule runs, on the batches where `schedule` also fires (checked only
    then); `named.every(n)` runs them on every n-th firing (for `on_epoch_end` /
    `on_epoch_begin`: every n-th epoch, counted from the first epoch of the run, a
    resumed run included). `|` and `~` have no meaning for a place in the loop's
    order and raise a TypeError.

    The ordinary `schedule` is evaluated on the count at that place: the places
    after the batch's step (`on_epoch_end`, `on_reset_step`, `on_*_batch_end`) see
    `loop_state.elapsed_after`, the count after the batch — the count that decides
    epoch ends — so `ciclo.on_epoch_end & ciclo.every(4)` with `epoch_duration=4`
    fires at every epoch end (4, 8, 12 steps done) and `ciclo.on_epoch_end &
    ciclo.after(1000)` from the epoch end at which 1000 steps are done; the places
    up to the step (`on_epoch_begin`, `on_*_batch_begin`, `on_*_step`) see
    `elapsed`, the count before the batch, as the ordinary task keys do, so
    `ciclo.on_train_step & ciclo.every(3)` fires on the batches `ciclo.every(3)`
    does and `ciclo.on_epoch_begin & ciclo.every(4)` at epochs beginning at steps
    0, 4, 8. A schedule that reads the loop state gets it as is. The callbacks
    still get `elapsed`, the count before the batch.

    Example:
        >>> import ciclo
        >>> def log_epoch(state, batch, elapsed):
        ...     return ciclo.logs().add_metric("at", elapsed.steps)
        >>> tasks = {ciclo.on_epoch_end.every(2): log_epoch}
        >>> _, history, _ = ciclo.train_loop(
        ...     None, range(4), tasks, epochs=4)
        >>> history.collect("steps", "at")  # 4 batches per epoch; epochs 2 and 4
        ([7, 15], [7, 15])
        >>> tasks = {ciclo.on_epoch_end & ciclo.every(8): log_epoch}  # same epochs
        >>> _, history, _ = ciclo.train_loop(None, range(4), tasks, epochs=4)
        >>> history.collect("at")
        [7, 15]
        >>> late = {ciclo.on_epoch_end & ciclo.after(10): log_epoch}
        >>> _, history, _ = ciclo.train_loop(None, range(4), late, epochs=4)
        >>> history.collect("at")
        [11, 15]
    """

    def every(self, n: int) -> When:
        """Fires on the n-th, 2n-th, ... time this named schedule fires."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(
                f"{self}.every(n): `n` must be an int >= 1, got {n!r}; e.g. "
                f"ciclo.on_epoch_end.every(2) for every second epoch."
            )
        return When(str(self), every=n)

    def __and__(self, other: Any) -> When:
        return When(str(self), schedule=_at_place(self, _schedule(self, other)))

    def __rand__(self, other: Any) -> When:
        return self & other

    def __or__(self, other: Any):
        raise TypeError(
            f"{self!s} | {other!r:.40}: a named schedule is a place in the loop's "
            f"order, so `|` has no meaning; give both keys in `tasks` instead, or use "
            f"`{self!s} & schedule` to run at that place only when schedule fires."
        )

    __ror__ = __or__

    def __invert__(self):
        raise TypeError(
            f"~{self!s}: a named schedule cannot be negated; use "
            f"`{self!s} & ~schedule` to skip it when `schedule` fires."
        )


def _schedule(named: str, other: Any) -> Any:
    if isinstance(other, str) or not callable(other):
        raise TypeError(
            f"{named} & {other!r:.60} ({type(other).__name__}): expected an ordinary "
            f"schedule (a callable elapsed -> bool such as ciclo.every(100)), since a "
            f"batch has one place per named schedule."
        )
    return other


class AtPlace(Schedule):
    """The ordinary operand of `named & schedule`, evaluated on the count at the
    named schedule's place: `loop_state.elapsed_after` after the step, else
    `loop_state.elapsed` (see `NamedSchedule`). It reads the loop state."""

    reads_loop_state = True

    def __init__(self, schedule: Any, after: bool):
        self.schedule, self.after = schedule, after
        self._passes_loop_state = bool(getattr(schedule, "reads_loop_state", False))

    def __call__(self, loop_state: Any) -> bool:
        if self._passes_loop_state:
            return self.schedule(loop_state)
        return self.schedule(
            loop_state.elapsed_after if self.after else loop_state.elapsed
        )

    def fresh(self) -> AtPlace:
        return AtPlace(fresh(self.schedule), self.after)

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, AtPlace):
            return NotImplemented
        return self.schedule is other.schedule and self.after == other.after

    def __hash__(self) -> int:
        return hash((id(self.schedule), self.after))

    def __repr__(self) -> str:
        return repr(self.schedule)


def _at_place(name: str, schedule: Any) -> AtPlace:
    return AtPlace(schedule, after=ALIASES.get(name, name) not in BEFORE_THE_STEP)


@dataclasses.dataclass(frozen=True)
class When:
    """A task key: `name`'s place in the loop, gated by `schedule` and/or `every`."""

    name: str
    schedule: Any = None
    every: int | None = None

    def __and__(self, other: Any) -> When:
        other = _schedule(self.name, other)
        if isinstance(self.schedule, AtPlace):
            other = And(self.schedule.schedule, other)
        elif self.schedule is not None:  # built directly (e.g. train_loop's own)
            other = And(self.schedule, other)
        return dataclasses.replace(self, schedule=_at_place(self.name, other))

    __rand__ = __and__


on_train_begin = NamedSchedule("on_train_begin")
on_train_end = NamedSchedule("on_train_end")
on_train_batch_begin = NamedSchedule("on_train_batch_begin")
on_train_step = NamedSchedule("on_train_step")
on_train_batch_end = NamedSchedule("on_train_batch_end")
on_epoch_begin = NamedSchedule("on_epoch_begin")
on_epoch_end = NamedSchedule("on_epoch_end")
on_reset_step = NamedSchedule("on_reset_step")
on_test_begin = NamedSchedule("on_test_begin")
on_test_end = NamedSchedule("on_test_end")
on_test_batch_begin = NamedSchedule("on_test_batch_begin")
on_test_step = NamedSchedule("on_test_step")
on_test_batch_end = NamedSchedule("on_test_batch_end")
on_validation_begin = NamedSchedule("on_validation_begin")
on_validation_end = NamedSchedule("on_validation_end")
on_validation_batch_begin = NamedSchedule("on_validation_batch_begin")
on_validation_step = NamedSchedule("on_validation_step")
on_validation_batch_end = NamedSchedule("on_validation_batch_end")
on_predict_begin = NamedSchedule("on_predict_begin")
on_predict_end = NamedSchedule("on_predict_end")
on_predict_batch_begin = NamedSchedule("on_predict_batch_begin")
on_predict_step = NamedSchedule("on_predict_step")
on_predict_batch_end = NamedSchedule("on_predict_batch_end")

# The places that run up to the batch's step: a schedule composed with them sees the
# count before the batch; the others see the count after it (`NamedSchedule`).
BEFORE_THE_STEP = frozenset(
    {
        on_epoch_begin,
        on_train_batch_begin,
        on_train_step,
        on_test_batch_begin,
        on_test_step,
        on_validation_batch_begin,
        on_validation_step,
        on_predict_batch_begin,
        on_predict_step,
    }
)

# Short names accepted wherever a named schedule is, and looked up on states and
# callbacks for self-registration (`def train_step(self, batch)` on a state class).
ALIASES = {
    "train_step": on_train_step,
    "test_step": on_test_step,
    "validation_step": on_validation_step,
    "predict_step": on_predict_step,
    "reset_step": on_reset_step,
}


def aliases_of(name: str) -> tuple[str, ...]:
    """The attribute names looked up for self-registration: the name, then aliases."""
    return (name, *(a for a, target in ALIASES.items() if target == name))


class Place(Schedule):
    """A named schedule's place as an ordinary schedule, the key of a predefined
    loop's compiled task dict (its repr is the name): every batch, or at an epoch
    end (`epoch`, an `EpochEnd`) or begin (`begin`), gated by a `When`."""

    def __init__(self, name: str, epoch=None, when=None, begin=False):
        self.name, self.epoch, self.when, self.begin = name, epoch, when, begin
        self.gate = None if when is None else fresh(when.schedule)
        self.gate_reads = bool(getattr(self.gate, "reads_loop_state", False))
        self.reads_loop_state = epoch is not None or self.gate_reads
        self.count = 0  # firings, for `every` off the epoch ends

    def __call__(self, elapsed_or_loop_state: Any) -> bool:
        x = elapsed_or_loop_state
        fires = self.epoch is None or (
            self.epoch.begins() if self.begin else self.epoch(x)
        )
        if not fires:
            return False
        if self.when is None:
            return True
        if self.when.every is not None:
            if self.epoch is not None:  # the epoch's number, a resumed run's too
                number = self.epoch.count + self.begin
            else:
                number = self.count = self.count + 1
            if number % self.when.every:
                return False
        if self.gate is None:
            return True
        if self.reads_loop_state and not self.gate_reads:
            x = x.elapsed
        return bool(self.gate(x))

    def __repr__(self) -> str:
        return repr(self.name) if self.when is None else repr(self.when)
