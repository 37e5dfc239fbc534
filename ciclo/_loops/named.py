"""Named schedules (`ciclo.on_train_step`, ...) and, per predefined loop, the table
of where each one runs. Everything about names lives here, as data.
"""

from __future__ import annotations

import dataclasses
import difflib
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
        on_predict_batch_begin,
        on_predict_step,
    }
)

# Short names accepted wherever a named schedule is, and looked up on states and
# callbacks for self-registration (`def train_step(self, batch)` on a state class).
ALIASES = {
    "train_step": on_train_step,
    "test_step": on_test_step,
    "predict_step": on_predict_step,
    "reset_step": on_reset_step,
}

TASKS = "<tasks>"  # the ordinary schedules of `tasks`, in the order given
NESTED = "<test loop>"  # train_loop's test loop(s)
EPOCH_SUM = "<epoch sums>"  # train_loop(epoch_logs=True): adds up the step's logs
EPOCH_LOGS = "<epoch logs>"  # train_loop(epoch_logs=True): logs the epoch's means


BUILTIN = (TASKS, NESTED, EPOCH_SUM, EPOCH_LOGS)  # filled by the loop itself


@dataclasses.dataclass(frozen=True)
class Table:
    """Where each named schedule of one predefined loop runs.

    `start` runs once before the first batch's tasks, `end` after the last batch.
    `epoch_begin` runs, in order, first on the batches that begin an epoch. `batch` runs for every batch in order; `epoch` runs, in order, after the
    batch's `TASKS` on the batches that end an epoch; `batch_end` closes the batch.
    `nested` are the names handed on to the test loop (train_loop only).
    """

    loop: str
    start: tuple[str, ...]
    epoch_begin: tuple[str, ...]
    batch: tuple[str, ...]
    epoch: tuple[str, ...]
    batch_end: tuple[str, ...]
    end: tuple[str, ...]
    step: str
    nested: tuple[str, ...] = ()

    @property
    def own(self) -> tuple[str, ...]:
        """The named schedules this loop runs itself, in the order they run."""
        names = (
            *self.start, *self.epoch_begin, *self.batch, *self.epoch,
            *self.batch_end, *self.end,
        )  # fmt: skip
        return tuple(n for n in names if n not in BUILTIN)

    @property
    def names(self) -> tuple[str, ...]:
        """Every named schedule accepted in its `tasks` (its own, then nested)."""
        return (*self.own, *(n for n in self.nested if n not in self.own))


TEST = Table(
    "test_loop",
    start=(on_reset_step, on_test_begin),
    epoch_begin=(),
    batch=(on_test_batch_begin, on_test_step, TASKS),
    epoch=(),
    batch_end=(on_test_batch_end,),
    end=(on_test_end,),
    step=on_test_step,
)
TRAIN = Table(
    "train_loop",
    start=(on_train_begin,),
    epoch_begin=(on_epoch_begin,),
    batch=(on_train_batch_begin, on_train_step, TASKS, EPOCH_SUM),
    epoch=(on_reset_step, NESTED, EPOCH_LOGS, on_epoch_end),
    batch_end=(on_train_batch_end,),
    end=(on_train_end,),
    step=on_train_step,
    nested=tuple(n for n in TEST.own if n != on_reset_step),  # resets run before it
)
PREDICT = Table(
    "predict_loop",
    start=(on_predict_begin,),
    epoch_begin=(),
    batch=(on_predict_batch_begin, on_predict_step, TASKS),
    epoch=(),
    batch_end=(on_predict_batch_end,),
    end=(on_predict_end,),
    step=on_predict_step,
)
TABLES = (TRAIN, TEST, PREDICT)


def aliases_of(name: str) -> tuple[str, ...]:
    """The attribute names looked up for self-registration: the name, then aliases."""
    return (name, *(a for a, target in ALIASES.items() if target == name))


def resolve(table: Table, name: str) -> str:
    """The canonical named schedule for `name` (a name or an alias) in `table`.

    Raises:
        ValueError: if `name` is not a named schedule of that loop; the message
            lists the valid ones and suggests the closest.

    Example:
        >>> from ciclo._loops.named import TRAIN, resolve
        >>> resolve(TRAIN, "train_step")
        'on_train_step'
    """
    canonical = ALIASES.get(name, name)
    if canonical in table.names:
        return canonical
    aliases = [a for a, target in ALIASES.items() if target in table.names]
    close = difflib.get_close_matches(name, [*table.names, *aliases], n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    owners = [t.loop for t in TABLES if canonical in t.own]
    where = f" ({name!r} belongs to {', '.join(owners)}.)" if owners else ""
    raise ValueError(
        f"Unknown named schedule {name!r} for {table.loop}.{hint}{where} Valid named "
        f"schedules: {list(table.names)}; aliases: {aliases}. Ordinary schedules "
        f"such as ciclo.every(10) are accepted too."
    )
