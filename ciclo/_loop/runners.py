"""How `loop` calls callbacks: each turned once into a runner, the task dict
validated into a plan, and the end hooks (of the loop's `HookTable`) run.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
import numpy as np

from ciclo._loop.callback import arity, describe, uncalled
from ciclo._loop.hooks import EndHook, HookTable
from ciclo._loop.state import Apply, LoopState
from ciclo._period import Period
from ciclo._schedules.base import Schedule, fresh
from ciclo._shapes import ShapeWatch, compiles_per_shape
from ciclo._short import short

__all__ = [
    "Runner",
    "ScheduleBlame",
    "finish",
    "fired",
    "make_plan",
    "reads_batch_after_pass_end",
    "runner",
    "runners",
]

Runner = Callable[[LoopState], None]

_JITTED = type(jax.jit(print))  # what `jax.jit` returns (not compiled here)


def runner(
    callback: Any, where: str, table: HookTable, watch: ShapeWatch | None = None
) -> Runner:
    """Turns a callback into `run(loop_state)`, deciding once how to call it (its
    hooks read from `table`); a compiled step's batches are shown to `watch` first
    (`ciclo._shapes`)."""
    name = uncalled(callback)
    if name is not None:
        kind = "class" if isinstance(callback, type) else "factory"
        raise TypeError(
            f"{where} is the {kind} {name}, not a callback: build one first; did "
            f"you mean {name}(...)?"
        )
    shown_as = describe(callback)
    if watch is not None and not compiles_per_shape(callback):
        watch = None  # only a compiled step's batch shapes are watched
    # a jitted function's outputs are new objects at every call: its Logs is the
    # loop's own (`Apply.fresh`)
    apply = Apply(callback, where, fresh=type(callback) is _JITTED)
    loop_callback = table.of(callback).call
    if loop_callback is not None:
        # an output of None (an observer's: writers, bars) has nothing to apply
        # a managed step's own runner (`ManagedStep._loop_runner`); None: the
        # general one below
        own = getattr(type(callback), "_loop_runner", None)
        run = None if own is None else own(callback, apply, watch, shown_as)
        if run is not None:
            pass
        elif watch is None and getattr(loop_callback, "observes_only", False) is True:
            # a call that always returns None (`callback.observer`: writers, bars)
            # is the runner itself (a partial: it can be named, adds no frame)
            run = functools.partial(loop_callback)
            run.observes = True  # `Run.finish_observers` may call it on a cut batch
        elif watch is None:
            run = lambda ls: (out := loop_callback(ls)) is None or apply(out, ls)
        else:  # a compiled step's batch shapes are watched first (one call less)

            def run(ls: LoopState) -> None:
                batch, shapes = ls._shapes  # read by `Run` for this batch
                if shapes is not watch.last or batch is not ls.batch:  # else seen
                    watch(ls.batch, shown_as, shapes if batch is ls.batch else None)
                out = loop_callback(ls)
                if out is not None:
                    apply(out, ls)

        run.where = f"{where} ({shown_as})"
        run.reads_batch = _reads_batch(callback)
        return run
    if not callable(callback):
        raise TypeError(
            f"{where} is {short(callback)} ({type(callback).__name__}), which is not "
            f"callable; expected a function f(state, batch, elapsed, loop_state) -> "
            f"(logs, state) or an object with __loop_callback__."
            + (
                f" Did you mean {where}() (call it to build the callback)?"
                if isinstance(callback, property | type)
                else ""
            )
        )
    n = arity(callback, where)
    if n == 0:
        run = lambda ls: apply(callback(), ls)
    elif n == 1:
        run = lambda ls: apply(callback(ls.state), ls)
    elif n == 2:
        run = lambda ls: apply(callback(ls.state, ls.batch), ls)
    elif n == 3:
        run = lambda ls: apply(callback(ls.state, ls.batch, ls.elapsed), ls)
    else:
        run = lambda ls: apply(callback(ls.state, ls.batch, ls.elapsed, ls), ls)
    if watch is not None:  # its batch shapes watched first
        called = run

        def run(ls: LoopState) -> None:
            batch, shapes = ls._shapes  # read by `Run` for this batch
            if shapes is not watch.last or batch is not ls.batch:  # else seen
                watch(ls.batch, shown_as, shapes if batch is ls.batch else None)
            called(ls)

    run.where = f"{where} ({shown_as})"
    run.reads_batch = n >= 2  # declares `batch` (or more)
    return run


def _reads_batch(callback: Any) -> bool:
    """Whether an object's hooks (they get the loop state) may read its batch:
    yes unless its class says `reads_batch = False` (ciclo's observers) and
    none of its hooks was overridden outside ciclo (a user's subclass of a bar
    may read it)."""
    if getattr(callback, "reads_batch", True) is not False:
        return True
    for hook in ("__loop_callback__", "__loop_end__", "__call__"):
        method = getattr(type(callback), hook, None)
        module = getattr(method, "__module__", None) or ""
        if method is not None and not module.startswith("ciclo."):
            return True
    return False


def reads_batch_after_pass_end(
    plan: list[tuple[Any, bool, list[Runner]]], end: list[Runner]
) -> bool:
    """Whether a callback may read a batch after the loop learned whether it ends
    its pass (the first epoch-end schedule of `plan`, which may read the next
    batch, refilling a loader's buffer): a runner of that schedule or a later
    one, or of `on_end`. False when no schedule asks (nothing is read ahead)."""
    for i, (schedule, _, _) in enumerate(plan):
        if getattr(schedule, "asks_pass_end", False) is True:
            later = [run for _, _, runs in plan[i:] for run in runs]
            return any(getattr(run, "reads_batch", True) for run in [*later, *end])
    return False


def _as_list(callbacks: Any) -> list[Any]:
    if callbacks is None:
        return []
    return list(callbacks) if isinstance(callbacks, list | tuple) else [callbacks]


def runners(
    callbacks: Any, where: str, table: HookTable, watch: ShapeWatch | None = None
) -> list[Runner]:
    return [
        runner(cb, f"{where}[{i}]", table, watch)
        for i, cb in enumerate(_as_list(callbacks))
    ]


def make_plan(
    tasks: Mapping[Any, Any], table: HookTable
) -> list[tuple[Callable[..., bool], bool, list]]:
    """Validates `tasks`: (loop-private schedule, reads the loop state, runners);
    the schedule is None when it is due at every batch (`every_batch`)."""
    if not isinstance(tasks, Mapping):
        raise TypeError(
            f"`tasks` must be a dict {{schedule: callback_or_list}}, got "
            f"{type(tasks).__name__}. Example: {{ciclo.every(1): [train_step]}}."
        )
    plan = []
    watch = ShapeWatch()  # one per loop: it warns once
    for key, callbacks in tasks.items():
        if isinstance(key, str):
            raise TypeError(
                f"Task key {key!r} is a string: named schedules such as "
                f"'on_train_step' only work in ciclo.train_loop/test_loop/"
                f"predict_loop. In ciclo.loop use a schedule, e.g. ciclo.every(1)."
            )
        if not callable(key):
            hint = (
                " (wrap it: ciclo.every(...))" if isinstance(key, int | Period) else ""
            )
            raise TypeError(
                f"Task key {short(key)} ({type(key).__name__}) is not a schedule; "
                f"expected "
                f"a callable elapsed -> bool such as ciclo.every(10){hint}."
            )
        after = bool(getattr(key, "reads_loop_state", False))
        where = f"Callback tasks[{key!r}]"
        schedule = fresh(key)
        if isinstance(schedule, Schedule):
            if schedule.every_batch is True:
                schedule = None  # due at every batch: not called
            elif schedule._direct is not None:  # an equivalent, cheaper to call
                schedule = schedule._direct
        plan.append((schedule, after, runners(callbacks, where, table, watch)))
    return plan


class ScheduleBlame:
    """Names a schedule that raised or returned a non-bool (in the loop's note)."""

    def __init__(self, schedule: Any):
        name = repr(schedule) if isinstance(schedule, Schedule) else describe(schedule)
        self.where = f"the schedule {name}"


def fired(value: Any, schedule: Any) -> bool:
    """A schedule's result that is not `True`/`False`, as a bool: a numpy bool,
    an int or a 0-d boolean array; anything else (an array of several values or
    of numbers, None, ...) is a TypeError naming the schedule."""
    if isinstance(value, np.bool_ | int) and not isinstance(value, np.ndarray):
        return bool(value)
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape == () and dtype is not None and np.dtype(dtype) == np.bool_:
        return bool(value)
    what = (
        f"an array of shape {tuple(shape)} and dtype {dtype}"
        if shape is not None and dtype is not None
        else f"{short(value)} ({type(value).__name__})"
    )
    raise TypeError(
        f"The{ScheduleBlame(schedule).where[3:]} returned {what}, not a bool: "
        f"a schedule is a callable elapsed -> bool (e.g. ciclo.every(10)); reduce "
        f"an array on the host (bool(x.all())) or use a schedule of ciclo's."
    )


def finish(hooks: Iterable[EndHook], ls: LoopState) -> None:
    """Runs every end hook, even after one raised (a writer still closes after a
    guard raised); the first error is raised once all ran."""
    error = None
    for hook in hooks:
        try:
            hook(ls)
        except BaseException as e:
            if error is None:
                error = e
    if error is not None:
        raise error


def abandon(
    table: HookTable, groups: Iterable[Any], ls: LoopState, error: BaseException
) -> None:
    """Runs the end hooks of a loop ending before its first batch (an error or an
    interrupt while resuming, e.g. while the data is read back): checkpoints
    release their directory's lock, writers close. `error` goes on; a hook's own
    error does not replace it."""
    ls.error = error
    with contextlib.suppress(Exception):  # the loop's own error is the one raised
        finish(table.end_hooks(groups), ls)
