"""Named schedules (`ciclo.on_train_step`, ...) and, per predefined loop, the table
of where each one runs. Everything about names lives here, as data.
"""

from __future__ import annotations

import dataclasses
import difflib

on_train_begin = "on_train_begin"
on_train_end = "on_train_end"
on_train_batch_begin = "on_train_batch_begin"
on_train_step = "on_train_step"
on_train_batch_end = "on_train_batch_end"
on_epoch_end = "on_epoch_end"
on_reset_step = "on_reset_step"
on_test_begin = "on_test_begin"
on_test_end = "on_test_end"
on_test_batch_begin = "on_test_batch_begin"
on_test_step = "on_test_step"
on_test_batch_end = "on_test_batch_end"
on_predict_begin = "on_predict_begin"
on_predict_end = "on_predict_end"
on_predict_batch_begin = "on_predict_batch_begin"
on_predict_step = "on_predict_step"
on_predict_batch_end = "on_predict_batch_end"

# Short names accepted wherever a named schedule is, and looked up on states and
# callbacks for self-registration (`def train_step(self, batch)` on a state class).
ALIASES = {
    "train_step": on_train_step,
    "test_step": on_test_step,
    "predict_step": on_predict_step,
    "reset_step": on_reset_step,
}

TASKS = "<tasks>"  # the ordinary schedules of `tasks`, in the order given
NESTED = "<test loop>"  # train_loop's test loop


@dataclasses.dataclass(frozen=True)
class Table:
    """Where each named schedule of one predefined loop runs.

    `start` runs once before the first batch's tasks, `end` after the last batch.
    `batch` runs for every batch in order; `epoch` runs, in order, after the
    batch's `TASKS` on the batches that end an epoch; `batch_end` closes the batch.
    `nested` are the names handed on to the test loop (train_loop only).
    """

    loop: str
    start: tuple[str, ...]
    batch: tuple[str, ...]
    epoch: tuple[str, ...]
    batch_end: tuple[str, ...]
    end: tuple[str, ...]
    step: str
    nested: tuple[str, ...] = ()

    @property
    def own(self) -> tuple[str, ...]:
        """The named schedules this loop runs itself, in the order they run."""
        names = (*self.start, *self.batch, *self.epoch, *self.batch_end, *self.end)
        return tuple(n for n in names if n not in (TASKS, NESTED))

    @property
    def names(self) -> tuple[str, ...]:
        """Every named schedule accepted in its `tasks` (its own, then nested)."""
        return (*self.own, *(n for n in self.nested if n not in self.own))


TEST = Table(
    "test_loop",
    start=(on_reset_step, on_test_begin),
    batch=(on_test_batch_begin, on_test_step, TASKS),
    epoch=(),
    batch_end=(on_test_batch_end,),
    end=(on_test_end,),
    step=on_test_step,
)
TRAIN = Table(
    "train_loop",
    start=(on_train_begin,),
    batch=(on_train_batch_begin, on_train_step, TASKS),
    epoch=(on_reset_step, NESTED, on_epoch_end),
    batch_end=(on_train_batch_end,),
    end=(on_train_end,),
    step=on_train_step,
    nested=tuple(n for n in TEST.own if n != on_reset_step),  # resets run before it
)
PREDICT = Table(
    "predict_loop",
    start=(on_predict_begin,),
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
