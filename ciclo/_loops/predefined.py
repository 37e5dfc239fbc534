"""`train_loop`, `test_loop`, `predict_loop`: a table of named schedules compiled to
an ordinary task dict, then one `ciclo.loop` call.

The whole per-batch order of `train_loop`, from `named.TRAIN`:

    on_train_begin                     (once, before the first batch's tasks)
    per batch:  on_train_batch_begin, on_train_step, the ordinary `tasks`,
                [epoch end: on_reset_step, the test loop, on_epoch_end],
                on_train_batch_end
    on_train_end                       (once, after the last batch)
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from ciclo._history import History
from ciclo._loop import loop
from ciclo._loops.epoch import EpochEnd, Peekable
from ciclo._loops.named import (
    NESTED,
    PREDICT,
    TASKS,
    TEST,
    TRAIN,
    Table,
    aliases_of,
    on_reset_step,
    on_test_step,
    resolve,
)
from ciclo._resume import position, prepare
from ciclo._schedules.base import Schedule
from ciclo._time import Elapsed, Period, as_period
from ciclo.callbacks._inner_loop import inner_loop


class _Named(Schedule):
    """The key of a named schedule in the compiled task dict (its repr is the name)."""

    def __init__(self, name: str, epoch: EpochEnd | None = None):
        self.name, self.epoch = name, epoch
        self.reads_loop_state = epoch is not None

    def __call__(self, elapsed_or_loop_state: Any) -> bool:
        return True if self.epoch is None else self.epoch(elapsed_or_loop_state)

    def __repr__(self) -> str:
        return repr(self.name)


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, list | tuple) else [value]


def _register(table: Table, state: Any, tasks: Any, callbacks: Any):
    """Callbacks per named schedule: the state's class methods, then `tasks`, then
    the `callbacks` objects' attributes (on the loop's own names only); and the
    ordinary `(schedule, callbacks)` pairs of `tasks`."""
    named: dict[str, list[Any]] = {name: [] for name in table.names}
    for name in table.names:
        for attribute in aliases_of(name):
            method = getattr(type(state), attribute, None)
            if callable(method) and all(method is not m for m in named[name]):
                named[name].append(method)
    if not isinstance(tasks, Mapping | None):
        raise TypeError(
            f"{table.loop}: `tasks` must be a dict {{schedule: callback_or_list}}, got "
            f"{type(tasks).__name__}. Example: {{ciclo.{table.step}: [step_fn]}}."
        )
    ordinary = []
    for key, value in (tasks or {}).items():
        if isinstance(key, str):
            named[resolve(table, key)].extend(_as_list(value))
        else:
            ordinary.append((key, value))
    for i, callback in enumerate(_as_list(callbacks)):
        found = [
            getattr(callback, a)
            for name in table.own
            for a in aliases_of(name)
            if getattr(callback, a, None) is not None
        ]
        if not found:
            hint = (
                f" Did you pass the factory without calling it? Use "
                f"{getattr(callback, '__name__', 'it')}(...)."
                if inspect.isfunction(callback) or inspect.isclass(callback)
                else ""
            )
            raise TypeError(
                f"{table.loop}: callbacks[{i}] ({callback!r:.60}) has no attribute "
                f"named like a named schedule of {table.loop} ({list(table.own)}), "
                f"so it cannot register itself.{hint} Otherwise put it in `tasks` "
                f"with a schedule, e.g. {{ciclo.every(1): [callback]}}."
            )
        for name in table.own:
            for attribute in aliases_of(name):
                method = getattr(callback, attribute, None)
                if method is not None:
                    named[name].append(method)
    return named, ordinary


def _compile(table: Table, named, ordinary, epoch=None, nested=()):
    """The table laid out as `ciclo.loop` arguments: (tasks, on_start, on_end)."""
    tasks: dict[Any, Any] = {}
    for name in table.batch:
        if name == TASKS:
            tasks.update((k, v) for k, v in ordinary if _as_list(v))
        elif named[name]:
            tasks[_Named(name)] = named[name]
    for name in table.epoch:
        callbacks = list(nested) if name == NESTED else named[name]
        if callbacks:
            tasks[_Named(name, epoch)] = callbacks
    for name in table.batch_end:
        if named[name]:
            tasks[_Named(name)] = named[name]
    on_start = [cb for name in table.start for cb in named[name]]
    on_end = [cb for name in table.end for cb in named[name]]
    return tasks, on_start, on_end


def _run(table: Table, state, dataset, named, ordinary, **loop_kwargs):
    if not named[table.step] and not ordinary:
        step = aliases_of(table.step)[-1]
        raise ValueError(
            f"{table.loop}: nothing runs on `{table.step}`, so the loop would do "
            f"nothing: give the state a `{step}` method or pass "
            f"tasks={{ciclo.{table.step}: [{step}]}}."
        )
    tasks, on_start, on_end = _compile(table, named, ordinary)
    return loop(state, dataset, tasks, on_start=on_start, on_end=on_end, **loop_kwargs)


def train_loop(
    state: Any,
    dataset: Iterable[Any],
    tasks: Mapping[Any, Any] | None = None,
    *,
    callbacks: list[Any] | None = None,
    test_dataset: Callable[[], Iterable[Any]] | None = None,
    epoch_duration: int | Period | None = None,
    test_duration: int | Period | None = None,
    test_name: str = "test",
    stop: int | Period | None = None,
    history: History | None = None,
    elapsed: Elapsed | None = None,
    catch_keyboard_interrupt: bool = True,
    metadata: Any = None,
    batch_size_fn: Callable[[list[tuple[int, ...]]], int] | None = None,
    inner_loop_kwargs: Mapping[str, Any] | None = None,
    resume: str | os.PathLike | None = None,
) -> tuple[Any, History, Elapsed]:
    """Trains with named schedules, evaluating on `test_dataset` at each epoch end.

    The per-batch order is in this module's docstring. Each named schedule runs the
    state's method of that name (or alias) first, then the explicit `tasks`, then
    the `callbacks` that have an attribute of that name (they do not run in the
    test loop). An epoch ends after the batch whose `elapsed_after` crosses a
    multiple of `epoch_duration` (in any field), reaches `stop`, or is the last of
    the data (learnt by reading one batch ahead, only when needed); without
    `epoch_duration` the run is one epoch. Stopping works as in `ciclo.loop`.

    Args:
        state: the initial state; its class's named methods register themselves.
        dataset: any iterable of training batches, or a factory
            `dataset(start_step)` returning one (see `ciclo.loop`).
        tasks: `{named_or_ordinary_schedule: callback_or_list}`.
        callbacks: objects registering their `on_train_*`, `on_epoch_end` and
            `on_reset_step` attributes (keras_bar, checkpoint, early_stopping, ...).
        test_dataset: a zero-argument callable returning a fresh test iterable.
        epoch_duration: int steps or a `Period` (steps, samples, time).
        test_duration: how long each test loop runs (default: until exhausted).
        test_name: suffix of the test entries (`"accuracy_test"`).
        stop: int steps or any `Period`.
        history, elapsed, catch_keyboard_interrupt, metadata, batch_size_fn: as in
            `ciclo.loop` (the test loop uses the same `metadata`/`batch_size_fn`).
        inner_loop_kwargs: for the test `ciclo.inner_loop`, e.g.
            `{"aggregation": "mean"}`.
        resume: a checkpoint directory: shorthand for adding
            `ciclo.checkpoint(resume, resume=True)` to `callbacks` (saves at each
            epoch end; starts from its latest complete checkpoint, if any, with the
            state, history, elapsed and data position restored).

    Returns:
        `(state, history, elapsed)`.

    Raises:
        ValueError: for an unknown named schedule, `test_dataset` with nothing on
            `on_test_step`, or a bad `epoch_duration`.
        TypeError: for a `test_dataset` that is not a zero-argument callable, a bad
            `stop`, or a callback that cannot register itself.

    Example:
        >>> import ciclo
        >>> class Counter(int):
        ...     def train_step(self, batch):
        ...         return Counter(self + batch)
        ...     def test_step(self, batch):
        ...         return ciclo.logs().add_metric("seen", int(self))
        >>> state, history, _ = ciclo.train_loop(
        ...     Counter(0), [1] * 6, test_dataset=lambda: [0], epoch_duration=3)
        >>> int(state), history.collect("steps", "seen_test")
        (6, ([2, 5], [3, 6]))
    """
    if resume is not None:  # the checkpoint imports orbax: only when asked for
        from ciclo.callbacks._checkpoint import checkpoint

        callbacks = [*_as_list(callbacks), checkpoint(resume, resume=True)]
    named, ordinary = _register(TRAIN, state, tasks, callbacks)
    state, history, elapsed, skip = prepare(
        [*(tasks or {}).values(), *_as_list(callbacks)], state, history, elapsed
    )
    dataset = position(dataset, elapsed, skip, "train_loop")
    if test_duration is not None:
        as_period(test_duration, "test_duration")
    data = Peekable(_iterate(dataset, "`dataset` is", "an iterable of batches"))
    start = elapsed if isinstance(elapsed, Elapsed) else Elapsed.create()
    stop_at = None if stop is None else as_period(stop, "stop")
    epoch = EpochEnd(epoch_duration, stop_at, start, data.exhausted)
    nested = []
    if test_dataset is not None:
        kwargs = dict(metadata=metadata, batch_size_fn=batch_size_fn)
        run_test = _evaluation(named, test_dataset, test_duration, kwargs)
        nested.append(inner_loop(test_name, run_test, **_kwargs(inner_loop_kwargs)))
    tasks, on_start, on_end = _compile(TRAIN, named, ordinary, epoch, nested)
    return loop(
        state,
        data,
        tasks,
        stop=stop,
        on_start=on_start,
        on_end=on_end,
        history=history,
        elapsed=elapsed,
        catch_keyboard_interrupt=catch_keyboard_interrupt,
        metadata=metadata,
        batch_size_fn=batch_size_fn,
    )


def _iterate(dataset: Any, what: str, expected: str) -> Iterator[Any]:
    try:
        return iter(dataset)
    except TypeError:
        raise TypeError(
            f"train_loop: {what} {dataset!r:.100} ({type(dataset).__name__}), which "
            f"is not iterable; expected {expected}."
        ) from None


def _kwargs(inner_loop_kwargs: Any) -> Mapping[str, Any]:
    if inner_loop_kwargs is not None and not isinstance(inner_loop_kwargs, Mapping):
        raise TypeError(
            f"train_loop: `inner_loop_kwargs` must be a dict such as "
            f"{{'aggregation': 'mean'}}, got {type(inner_loop_kwargs).__name__}."
        )
    return inner_loop_kwargs or {}


def _evaluation(named, test_dataset, test_duration, loop_kwargs):
    """`state -> test_loop(...)` over a fresh `test_dataset()`, without the reset
    steps (the epoch end has just run them)."""
    problem = None
    if not callable(test_dataset):
        problem = f"got {test_dataset!r:.100} ({type(test_dataset).__name__})"
    else:
        try:
            inspect.signature(test_dataset).bind()
        except TypeError as error:
            problem = (
                f"{test_dataset!r:.100} cannot be called without arguments ({error})"
            )
        except ValueError:  # no signature (some builtins): trust it
            pass
    if problem is not None:
        raise TypeError(
            f"train_loop: `test_dataset` must be a zero-argument callable returning "
            f"a fresh iterable each epoch, e.g. test_dataset=lambda: "
            f"make_test_batches(); {problem}."
        )
    if not named[on_test_step]:
        raise ValueError(
            "train_loop: `test_dataset` was given but nothing runs on "
            "`on_test_step`: give the state a `test_step` method or pass "
            "tasks={ciclo.on_test_step: [test_step]}."
        )
    test_named = {name: named[name] for name in TEST.own}
    test_named[on_reset_step] = []

    def run_test(state: Any) -> tuple[Any, History, Elapsed]:
        data = _iterate(
            test_dataset(),
            "`test_dataset()` returned",
            "a fresh iterable of test batches each epoch, e.g. lambda: iter(batches)",
        )
        return _run(
            TEST, state, data, test_named, [], stop=test_duration,
            catch_keyboard_interrupt=False, **loop_kwargs,
        )  # fmt: skip

    return run_test


def test_loop(
    state: Any,
    dataset: Iterable[Any],
    tasks: Mapping[Any, Any] | None = None,
    *,
    callbacks: list[Any] | None = None,
    stop: int | Period | None = None,
    history: History | None = None,
    elapsed: Elapsed | None = None,
    catch_keyboard_interrupt: bool = True,
    metadata: Any = None,
    batch_size_fn: Callable[[list[tuple[int, ...]]], int] | None = None,
) -> tuple[Any, History, Elapsed]:
    """Evaluates: the reset steps and `on_test_begin` first; per batch
    `on_test_batch_begin`, `on_test_step`, the ordinary `tasks`, `on_test_batch_end`;
    `on_test_end` after the last batch. Registration as in `train_loop`; the other
    arguments as in `ciclo.loop`.

    Raises:
        ValueError: if nothing runs on `on_test_step` and `tasks` has no ordinary
            schedule (the loop would silently log nothing).

    Example:
        >>> import ciclo
        >>> def test_step(state, batch):
        ...     return ciclo.logs().add_metric("double", 2 * batch)
        >>> _, history, _ = ciclo.test_loop(None, [1, 2], {ciclo.on_test_step: test_step})
        >>> history.collect("double")
        [2, 4]
    """
    named, ordinary = _register(TEST, state, tasks, callbacks)
    return _run(
        TEST, state, dataset, named, ordinary, stop=stop, history=history,
        elapsed=elapsed, catch_keyboard_interrupt=catch_keyboard_interrupt,
        metadata=metadata, batch_size_fn=batch_size_fn,
    )  # fmt: skip


def predict_loop(
    state: Any,
    dataset: Iterable[Any],
    tasks: Mapping[Any, Any] | None = None,
    *,
    callbacks: list[Any] | None = None,
    stop: int | Period | None = None,
    history: History | None = None,
    elapsed: Elapsed | None = None,
    catch_keyboard_interrupt: bool = True,
    metadata: Any = None,
    batch_size_fn: Callable[[list[tuple[int, ...]]], int] | None = None,
) -> tuple[Any, History, Elapsed]:
    """Runs inference: `on_predict_begin` first; per batch `on_predict_batch_begin`,
    `on_predict_step`, the ordinary `tasks`, `on_predict_batch_end`;
    `on_predict_end` after the last batch. Outputs logged with `logs.add_output`
    are in `history.collect("outputs.<name>")`. Arguments as in `test_loop`.

    Example:
        >>> import ciclo
        >>> def predict_step(state, batch):
        ...     return ciclo.logs().add_output("y", state * batch)
        >>> _, history, _ = ciclo.predict_loop(3, [1, 2], {"predict_step": predict_step})
        >>> history.collect("y")
        [3, 6]
    """
    named, ordinary = _register(PREDICT, state, tasks, callbacks)
    return _run(
        PREDICT, state, dataset, named, ordinary, stop=stop, history=history,
        elapsed=elapsed, catch_keyboard_interrupt=catch_keyboard_interrupt,
        metadata=metadata, batch_size_fn=batch_size_fn,
    )  # fmt: skip


test_loop.__test__ = False  # not a pytest test, even when imported into a test module
