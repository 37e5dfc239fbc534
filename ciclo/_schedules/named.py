"""Named schedules (`ciclo.on_train_step`, ...): places in a predefined loop's
order, usable as task keys and composable with ordinary schedules (`&`, `.every`).
Where each one runs is in `ciclo._predefined.tables`.
"""

from __future__ import annotations

from abc import ABCMeta
from typing import TYPE_CHECKING, Any

from ciclo._schedules.base import Schedule, fresh
from ciclo._short import short

if TYPE_CHECKING:
    from ciclo._loop.state import LoopState
    from ciclo._time import Elapsed


class _Composable:
    """The operators of a named schedule, one place (`name`) and the condition
    checked there (`condition`: None = every time the place is reached). Every
    operator returns a `When`, so named schedules are closed under `&`, `|`, `~`
    and `.every`."""

    __named_schedule__ = True
    name: str
    condition: Any

    def every(self, n: int) -> When:
        """Fires on the n-th, 2n-th, ... time this named schedule fires."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(
                f"{self!r}.every(n): `n` must be an int >= 1, got {short(n)}; e.g. "
                f"ciclo.on_epoch_end.every(2) for every second epoch."
            )
        return When(self.name, Nth(self.condition, n))

    def __and__(self, other: Any) -> When:
        return When(self.name, _both(self.condition, _operand(self, other, "&")))

    def __rand__(self, other: Any) -> When:
        return self & other

    def __or__(self, other: Any) -> When:
        operand = _operand(self, other, "|")
        if self.condition is None or (
            isinstance(operand, Condition) and operand.always()
        ):
            return When(self.name, None)  # the place itself: already every time
        return When(self.name, Either(_condition(self.condition), operand))

    def __ror__(self, other: Any) -> When:
        return self | other

    def __invert__(self) -> When:
        return When(self.name, Negated(_condition(self.condition)))


class NamedSchedule(_Composable, str, metaclass=ABCMeta):
    """A named schedule (`ciclo.on_epoch_end`, ...): the string of its name, usable
    as a task key of the predefined loops, that also composes with a schedule.

    A composition (`ciclo.on_epoch_end & ciclo.every(2)`, ...) is a
    `NamedSchedule` too (`isinstance` holds: a registered virtual subclass) but
    not a string: it is a task key of its own, compared by identity, so two
    equal-looking compositions are two keys.

    `named & schedule` (or `schedule & named`) runs its callbacks where the named
    schedule runs, on the batches where `schedule` also fires (checked only
    then); `named.every(n)` runs them on every n-th firing (for `on_epoch_end` /
    `on_epoch_begin`: every n-th epoch, counted from the first epoch of the run, a
    resumed run included). The operators compose the condition checked at that
    place and always give a named schedule again (closed: `(ciclo.on_epoch_end &
    ciclo.every(2)).every(2)`, `~(ciclo.on_epoch_end & ciclo.every(4))` — the epoch
    ends where `every(4)` does not fire —, `ciclo.on_epoch_end.every(2) |
    ciclo.after(100)`); `.every(n)` counts the firings of what it is applied to.
    `~ciclo.on_epoch_end` alone never fires; `|` of two different places is a
    TypeError (give both keys in `tasks`).

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

    @property
    def name(self) -> str:
        return str(self)

    condition = None


def _operand(named: _Composable, other: Any, op: str) -> Any:
    """The condition `other` adds at `named`'s place: an ordinary schedule (seen
    at that place, `AtPlace`), or the condition of a named schedule of the same
    place."""
    if getattr(other, "__named_schedule__", False) or isinstance(other, str):
        other_name = getattr(other, "name", str(other))
        if ALIASES.get(other_name, other_name) != ALIASES.get(named.name, named.name):
            raise TypeError(
                f"{named!r} {op} {other!r}: two different places of the loop's order "
                f"cannot be combined into one key; give both keys in `tasks` "
                f"(e.g. {{{named.name}: [f], {other_name}: [f]}})."
            )
        return _condition(getattr(other, "condition", None))
    if not callable(other):
        raise TypeError(
            f"{named!r} {op} {other!r:.60} ({type(other).__name__}): expected an "
            f"ordinary schedule (a callable elapsed -> bool such as ciclo.every(100)) "
            f"or a named schedule of the same place."
        )
    return _at_place(named.name, other)


class Condition:
    """A node of the condition a `When` checks at its place, evaluated by `Place`
    with the loop state at that place (`holds`); `fresh()` a loop-private copy."""

    def holds(self, place: Place, x: Any) -> bool:
        raise NotImplementedError

    def fresh(self) -> Condition:
        return self

    def always(self) -> bool:
        return False


class Reached(Condition):
    """The place itself: true every time it is reached."""

    def holds(self, place: Place, x: Any) -> bool:
        return True

    def always(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "reached"


def _condition(condition: Any) -> Any:
    return Reached() if condition is None else condition


def _both(a: Any, b: Any) -> Any:
    return b if a is None else Both(a, b)


class Nth(Condition):
    """True on the n-th, 2n-th, ... time `inner` holds. Directly on an epoch place
    it counts epochs (a resumed run's included), else the firings it saw."""

    def __init__(self, inner: Any, n: int):
        self.inner, self.n, self.count = inner, n, 0

    def holds(self, place: Place, x: Any) -> bool:
        if self.inner is None and place.epoch is not None:
            number = place.epoch.count + place.begin
        else:
            if self.inner is not None and not self.inner.holds(place, x):
                return False
            self.count = number = self.count + 1
        return number % self.n == 0

    def fresh(self) -> Nth:
        return Nth(None if self.inner is None else self.inner.fresh(), self.n)

    def __repr__(self) -> str:
        return f"{_condition(self.inner)!r}.every({self.n})"


class Both(Condition):
    """`a` and then, only when it holds, `b` (a gate is checked only when the
    condition before it holds)."""

    def __init__(self, a: Any, b: Any):
        self.a, self.b = a, b

    def holds(self, place: Place, x: Any) -> bool:
        return self.a.holds(place, x) and self.b.holds(place, x)

    def fresh(self) -> Both:
        return Both(self.a.fresh(), self.b.fresh())

    def __repr__(self) -> str:
        return f"({self.a!r} & {self.b!r})"


class Either(Condition):
    """`a` or `b`, both always evaluated so that counting ones stay in step."""

    def __init__(self, a: Any, b: Any):
        self.a, self.b = a, b

    def holds(self, place: Place, x: Any) -> bool:
        a, b = self.a.holds(place, x), self.b.holds(place, x)
        return a or b

    def fresh(self) -> Either:
        return Either(self.a.fresh(), self.b.fresh())

    def __repr__(self) -> str:
        return f"({self.a!r} | {self.b!r})"


class Negated(Condition):
    """Holds when `a` does not."""

    def __init__(self, a: Any):
        self.a = a

    def holds(self, place: Place, x: Any) -> bool:
        return not self.a.holds(place, x)

    def fresh(self) -> Negated:
        return Negated(self.a.fresh())

    def __repr__(self) -> str:
        return f"~{self.a!r}"


class AtPlace(Condition):
    """An ordinary schedule composed with a named one, evaluated on the count at
    the named schedule's place: `loop_state.elapsed_after` after the step, else
    `loop_state.elapsed` (see `NamedSchedule`). A schedule that reads the loop
    state gets it as is."""

    def __init__(self, schedule: Any, after: bool):
        self.schedule, self.after = schedule, after
        self._passes_loop_state = bool(getattr(schedule, "reads_loop_state", False))

    def holds(self, place: Place, x: Any) -> bool:
        if self._passes_loop_state:
            return bool(self.schedule(x))
        return bool(self.schedule(x.elapsed_after if self.after else x.elapsed))

    def fresh(self) -> AtPlace:
        return AtPlace(fresh(self.schedule), self.after)

    def __repr__(self) -> str:
        return repr(self.schedule)


def _at_place(name: str, schedule: Any) -> AtPlace:
    return AtPlace(schedule, after=ALIASES.get(name, name) not in BEFORE_THE_STEP)


class When(_Composable):
    """A task key: `name`'s place in the loop, gated by `condition` (a named
    schedule composed with `&`, `|`, `~` or `.every`). Compared by identity: two
    compositions are two task keys."""

    def __init__(self, name: str, condition: Any = None):
        self.name, self.condition = str(name), condition

    def __repr__(self) -> str:
        if self.condition is None:
            return f"ciclo.{self.name}"
        return f"ciclo.{self.name}[{self.condition!r}]"


# Named schedules are closed under their operators (API.md §5): a composition is a
# `NamedSchedule` for `isinstance`, while staying no `str` (the loops tell a bare
# place, a string key, from a gated `When` key by that).
NamedSchedule.register(When)


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
        condition = None if when is None else when.condition
        self.condition = None if condition is None else condition.fresh()
        self.reads_loop_state = epoch is not None or self.condition is not None
        self.every_batch = not self.reads_loop_state  # no epoch, no condition
        # deciding the epoch end may read the next batch of the pass (`Run`)
        self.asks_pass_end = epoch is not None and not begin
        # an epoch end alone: the loop calls the `EpochEnd` itself (a frame less
        # per batch; it gives every place the same answer)
        if epoch is not None and not begin and self.condition is None:
            self._direct = epoch

    def __call__(self, elapsed_or_loop_state: Elapsed | LoopState) -> bool:
        x = elapsed_or_loop_state
        fires = self.epoch is None or (
            self.epoch.begins() if self.begin else self.epoch(x)
        )
        if not fires:
            return False
        return self.condition is None or self.condition.holds(self, x)

    def __repr__(self) -> str:
        return repr(self.name) if self.when is None else repr(self.when)
