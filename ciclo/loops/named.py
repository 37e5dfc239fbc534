"""Named schedules: the strings `ciclo.on_train_step`, ... and, per loop kind, where
each one runs. Everything about names lives here, as data; `builder.py` reads it.
"""

from __future__ import annotations

import dataclasses
import difflib

__all__ = [
    "ALIASES",
    "KINDS",
    "PREDICT",
    "TEST",
    "TRAIN",
    "LoopKind",
    "on_epoch_end",
    "on_predict_batch_begin",
    "on_predict_batch_end",
    "on_predict_begin",
    "on_predict_end",
    "on_predict_step",
    "on_reset_step",
    "on_test_batch_begin",
    "on_test_batch_end",
    "on_test_begin",
    "on_test_end",
    "on_test_step",
    "on_train_batch_begin",
    "on_train_batch_end",
    "on_train_begin",
    "on_train_end",
    "on_train_step",
    "resolve",
]

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

# Short names accepted anywhere a named schedule is (and looked up on states and
# callbacks for self-registration): `def train_step(self, batch)` on a state class.
ALIASES: dict[str, str] = {
    "train_step": on_train_step,
    "test_step": on_test_step,
    "predict_step": on_predict_step,
    "reset_step": on_reset_step,
}


@dataclasses.dataclass(frozen=True)
class LoopKind:
    """Where each named schedule of one loop kind runs.

    Per batch: `batch_begin`, `step`, the ordinary schedules of `tasks` (in the
    order given), the epoch-end names (train only), `batch_end`. `begin` runs with
    the first batch before its tasks, `end` after the last batch; `start_resets`
    runs the reset steps at the very start (test loops). `nested` names loop kinds
    whose schedules this loop also accepts and hands on (train -> the test loop).
    """

    loop: str
    begin: str
    batch_begin: str
    step: str
    batch_end: str
    end: str
    epoch_end: tuple[str, ...] = ()
    start_resets: bool = False
    nested: tuple[LoopKind, ...] = ()

    @property
    def own(self) -> tuple[str, ...]:
        """The named schedules this kind runs itself, in the order they run."""
        resets = (on_reset_step,) if self.start_resets else ()
        return (
            *resets,
            self.begin,
            self.batch_begin,
            self.step,
            *self.epoch_end,
            self.batch_end,
            self.end,
        )

    @property
    def names(self) -> tuple[str, ...]:
        """Every named schedule accepted by this kind (its own, then nested ones)."""
        out = list(self.own)
        for kind in self.nested:
            out += [n for n in kind.names if n not in out]
        return tuple(out)


TEST = LoopKind(
    "test_loop",
    begin=on_test_begin,
    batch_begin=on_test_batch_begin,
    step=on_test_step,
    batch_end=on_test_batch_end,
    end=on_test_end,
    start_resets=True,
)
PREDICT = LoopKind(
    "predict_loop",
    begin=on_predict_begin,
    batch_begin=on_predict_batch_begin,
    step=on_predict_step,
    batch_end=on_predict_batch_end,
    end=on_predict_end,
)
TRAIN = LoopKind(
    "train_loop",
    begin=on_train_begin,
    batch_begin=on_train_batch_begin,
    step=on_train_step,
    batch_end=on_train_batch_end,
    end=on_train_end,
    epoch_end=(on_reset_step, on_epoch_end),
    nested=(TEST,),
)
KINDS = {kind.loop: kind for kind in (TRAIN, TEST, PREDICT)}


def aliases_of(name: str) -> tuple[str, ...]:
    """The attribute names looked up for self-registration: the name, then aliases."""
    return (name, *(a for a, target in ALIASES.items() if target == name))


def resolve(kind: LoopKind, name: str) -> str:
    """The canonical named schedule for `name` (an alias or a name) in `kind`.

    Raises:
        ValueError: if `name` is not a named schedule of `kind`; the message lists
            the valid ones (and suggests the closest).

    Example:
        >>> from ciclo.loops.named import TRAIN, resolve
        >>> resolve(TRAIN, "train_step")
        'on_train_step'
    """
    canonical = ALIASES.get(name, name)
    valid = kind.names
    if canonical in valid:
        return canonical
    accepted = [*valid, *(a for a, target in ALIASES.items() if target in valid)]
    close = difflib.get_close_matches(name, accepted, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    elsewhere = [k.loop for k in KINDS.values() if canonical in k.names]
    where = f" ({name!r} belongs to {', '.join(elsewhere)}.)" if elsewhere else ""
    raise ValueError(
        f"Unknown named schedule {name!r} for {kind.loop}.{hint}{where} Valid named "
        f"schedules: {list(valid)}; aliases: "
        f"{[a for a in accepted if a in ALIASES]}. Ordinary schedules such as "
        f"ciclo.every(10) are accepted too."
    )
