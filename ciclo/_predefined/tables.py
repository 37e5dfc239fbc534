"""Per predefined loop, the table of where each named schedule runs, as data (the
names are those of `ciclo.on_*`, which are `str`s)."""

from __future__ import annotations

import dataclasses
import difflib

from ciclo._schedules.named import ALIASES

TASKS = "<tasks>"  # the ordinary schedules of `tasks`, in the order given
NESTED = "<test loop>"  # train_loop's test loop(s)
EPOCH_SUM = "<epoch sums>"  # train_loop(epoch_logs=...): accumulates the step's logs
EPOCH_LOGS = "<epoch logs>"  # train_loop(epoch_logs=...): logs the aggregates


BUILTIN = (TASKS, NESTED, EPOCH_SUM, EPOCH_LOGS)  # filled by the loop itself


@dataclasses.dataclass(frozen=True)
class Table:
    """Where each named schedule of one predefined loop runs.

    `start` runs once before the first batch's tasks, `end` after the last batch.
    `epoch_begin` runs, in order, first on the batches that begin an epoch. `batch` runs for every batch in order; `epoch` runs, in order, after the
    batch's `TASKS` on the batches that end an epoch; `batch_end` closes the batch.
    `nested` are the names handed on to the test loop (train_loop only), and
    `nested_hooks` those of them that `callbacks` objects register on too (the
    validation ones: `callbacks` objects register on the loop's own names only).
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
    nested_hooks: tuple[str, ...] = ()

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

    @property
    def hooks(self) -> tuple[str, ...]:
        """The named schedules `callbacks` objects register on, in that order."""
        return (*self.own, *self.nested_hooks)


TEST = Table(
    "test_loop",
    start=("on_reset_step", "on_test_begin"),
    epoch_begin=(),
    batch=("on_test_batch_begin", "on_test_step", TASKS),
    epoch=(),
    batch_end=("on_test_batch_end",),
    end=("on_test_end",),
    step="on_test_step",
)
# train_loop's evaluation at the epoch ends (its `test_dataset`): the validation
# hooks around the test ones, which run there too (as they always have, for the
# code written before the validation hooks); the step is `on_validation_step`,
# filled with the `on_test_step` callbacks when nothing is registered on it.
VALIDATION = Table(
    "train_loop's validation",
    start=("on_validation_begin", "on_test_begin"),
    epoch_begin=(),
    batch=("on_validation_batch_begin", "on_test_batch_begin", "on_validation_step",
           TASKS),
    epoch=(),
    batch_end=("on_test_batch_end", "on_validation_batch_end"),
    end=("on_test_end", "on_validation_end"),
    step="on_validation_step",
)  # fmt: skip
TRAIN = Table(
    "train_loop",
    start=("on_train_begin",),
    epoch_begin=("on_epoch_begin",),
    batch=("on_train_batch_begin", "on_train_step", TASKS, EPOCH_SUM),
    epoch=("on_reset_step", NESTED, EPOCH_LOGS, "on_epoch_end"),
    batch_end=("on_train_batch_end",),
    end=("on_train_end",),
    step="on_train_step",
    # the test names (resets run before the validation), then the validation ones
    nested=(*(n for n in TEST.own if n != "on_reset_step"), *VALIDATION.own),
    nested_hooks=tuple(n for n in VALIDATION.own if n.startswith("on_validation")),
)
PREDICT = Table(
    "predict_loop",
    start=("on_predict_begin",),
    epoch_begin=(),
    batch=("on_predict_batch_begin", "on_predict_step", TASKS),
    epoch=(),
    batch_end=("on_predict_batch_end",),
    end=("on_predict_end",),
    step="on_predict_step",
)
TABLES = (TRAIN, TEST, PREDICT)


def resolve(table: Table, name: str) -> str:
    """The canonical named schedule for `name` (a name or an alias) in `table`.

    Raises:
        ValueError: if `name` is not a named schedule of that loop; the message
            lists the valid ones and suggests the closest.

    Example:
        >>> from ciclo._predefined.tables import TRAIN, resolve
        >>> resolve(TRAIN, "train_step")
        'on_train_step'
    """
    canonical = ALIASES.get(name, name)
    if canonical in table.names:
        return canonical
    aliases = [a for a, target in ALIASES.items() if target in table.names]
    close = difflib.get_close_matches(name, [*table.names, *aliases], n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    owners = [t.loop for t in TABLES if canonical in t.names]
    where = f" ({name!r} belongs to {', '.join(owners)}.)" if owners else ""
    raise ValueError(
        f"Unknown named schedule {name!r} for {table.loop}.{hint}{where} Valid named "
        f"schedules: {list(table.names)}; aliases: {aliases}. Ordinary schedules "
        f"such as ciclo.every(10) are accepted too."
    )
