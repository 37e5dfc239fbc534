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

import os
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from ciclo._callback import arity
from ciclo._fused import _check, declared_steps, fuse
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
    on_train_step,
)
from ciclo._loops.register import as_list, register
from ciclo._resume import position, prepare
from ciclo._schedules.base import Schedule
from ciclo._time import Elapsed, Period, as_period, short
from ciclo.callbacks._inner_loop import TEST_AGGREGATION, inner_loop


class _Named(Schedule):
    """The key of a named schedule in the compiled task dict (its repr is the name)."""

    def __init__(self, name: str, epoch: EpochEnd | None = None):
        self.name, self.epoch = name, epoch
        self.reads_loop_state = epoch is not None

    def __call__(self, elapsed_or_loop_state: Any) -> bool:
        return True if self.epoch is None else self.epoch(elapsed_or_loop_state)

    def __repr__(self) -> str:
        return repr(self.name)


def _compile(table: Table, named, ordinary, epoch=None, nested=()):
    """The table laid out as `ciclo.loop` arguments: (tasks, on_start, on_end)."""
    tasks: dict[Any, Any] = {}
    for name in table.batch:
        if name == TASKS:
            tasks.update((k, v) for k, v in ordinary if as_list(v))
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
    per_batch = (n for n in (*table.batch, *table.batch_end) if n != TASKS)
    if not ordinary and not any(named[n] for n in per_batch):
        step = aliases_of(table.step)[-1]
        raise ValueError(
            f"{table.loop}: nothing runs on `{table.step}` (nor on any other "
            f"per-batch schedule), so the loop would do nothing: give the state a "
            f"`{step}` method or pass "
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
    steps_per_call: int | None = None,
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
        epoch_duration, test_duration: int steps or a `Period`; `test_duration`
            bounds each test loop (default: until the test data is exhausted).
        test_name: suffix of the test entries (`"accuracy_test"`).
        inner_loop_kwargs: for the test `ciclo.inner_loop`, e.g. its aggregation.
        stop, history, elapsed, catch_keyboard_interrupt, metadata, batch_size_fn:
            as in `ciclo.loop` (the test loop shares `metadata`/`batch_size_fn`).
        resume: a checkpoint directory: shorthand for adding
            `ciclo.checkpoint(resume, resume=True)` to `callbacks` (saves at each
            epoch end; starts from its latest complete checkpoint, if any, with the
            state, history, elapsed and data position restored).

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
        (6, ([2, 5], [3.0, 6.0]))
    """
    if resume is not None:  # the checkpoint imports orbax: only when asked for
        callbacks = _resuming(as_list(callbacks), resume)
    named, ordinary = register(TRAIN, state, tasks, callbacks)
    state, history, elapsed, skip = prepare(
        [*(tasks or {}).values(), *as_list(callbacks)], state, history, elapsed
    )
    dataset = position(dataset, elapsed, skip, "train_loop")
    if test_duration is not None:
        as_period(test_duration, "test_duration")
    start = elapsed if isinstance(elapsed, Elapsed) else Elapsed.create()
    stop_at = None if stop is None else as_period(stop, "stop")
    data = _iterate(dataset, "`dataset` is")
    if steps_per_call is None:
        train_callbacks = [*named[on_train_step], *(v for _, v in ordinary)]
        steps_per_call = declared_steps(train_callbacks, state) or 1
    if _check(steps_per_call, "train_loop") > 1:
        limit = None
        if stop_at is not None and stop_at.steps is not None:
            limit = max(stop_at.steps - start.steps, 0)
        data = fuse(data, steps_per_call, batch_size_fn, limit)
    data = Peekable(data)
    epoch = EpochEnd(epoch_duration, stop_at, start, data.exhausted)
    nested = []
    if test_dataset is not None:
        kwargs = dict(metadata=metadata, batch_size_fn=batch_size_fn)
        run_test = _evaluation(named, test_dataset, test_duration, kwargs)
        if not isinstance(inner_loop_kwargs, Mapping | None):
            raise TypeError(
                f"train_loop: `inner_loop_kwargs` must be a dict such as "
                f"{{'aggregation': 'mean'}}, got {type(inner_loop_kwargs).__name__}."
            )
        kwargs = dict(inner_loop_kwargs or {})
        aggregation = kwargs.get("aggregation", {})
        if isinstance(aggregation, Mapping):  # covers what the user's dict does not
            kwargs["aggregation"] = {**TEST_AGGREGATION, **aggregation}
        nested.append(inner_loop(test_name, run_test, **kwargs))
    tasks, on_start, on_end = _compile(TRAIN, named, ordinary, epoch, nested)
    result = loop(
        state, data, tasks, stop=stop, on_start=on_start, on_end=on_end,
        history=history, elapsed=elapsed, metadata=metadata,
        catch_keyboard_interrupt=catch_keyboard_interrupt, batch_size_fn=batch_size_fn,
        steps_per_call=1,  # grouped above, before the epoch's look-ahead
    )  # fmt: skip
    if data.empty and not (stop_at is not None and stop_at.reached(start)):
        warnings.warn(
            f"train_loop: `dataset` yielded no batch (starting at step "
            f"{start.steps}), so nothing was trained. Check that it is not an "
            f"exhausted iterator or generator, or an empty list.",
            stacklevel=2,
        )
    return result


def _resuming(callbacks: list[Any], directory: Any) -> list[Any]:
    """`callbacks` with a checkpoint of `directory` that resumes: the one already
    there (one writer per directory), else a new one."""
    from ciclo.callbacks._checkpoint import checkpoint
    from ciclo.callbacks._orbax import path

    for callback in callbacks:
        if isinstance(callback, checkpoint) and callback.directory == path(directory):
            callback.resume = callback._resume_pending = True
            return callbacks
    return [*callbacks, checkpoint(directory, resume=True)]


def _iterate(dataset: Any, what: str) -> Iterator[Any]:
    try:
        return iter(dataset)
    except TypeError:
        raise TypeError(
            f"train_loop: {what} {short(dataset)} ({type(dataset).__name__}), which "
            f"is not iterable; expected an iterable of batches."
        ) from None


def _evaluation(named, test_dataset, test_duration, loop_kwargs):
    """`state -> test_loop(...)` over a fresh `test_dataset()`, without the reset
    steps (the epoch end has just run them)."""
    if not callable(test_dataset):
        raise TypeError(
            f"train_loop: `test_dataset` must be a zero-argument callable returning a "
            f"fresh iterable each epoch, e.g. lambda: make_test_batches(); got "
            f"{short(test_dataset)} ({type(test_dataset).__name__})."
        )
    arity(test_dataset, "train_loop: `test_dataset`", most=0)
    if not named[on_test_step]:
        raise ValueError(
            "train_loop: `test_dataset` was given but nothing runs on `on_test_step`: "
            "give the state a `test_step` method or pass "
            "tasks={ciclo.on_test_step: [test_step]}."
        )
    test_named = {name: named[name] for name in TEST.own}
    test_named[on_reset_step] = []

    def run_test(state: Any) -> tuple[Any, History, Elapsed]:
        data = _iterate(test_dataset(), "`test_dataset()` returned")
        output = _run(
            TEST, state, data, test_named, [], stop=test_duration,
            catch_keyboard_interrupt=False, **loop_kwargs,
        )  # fmt: skip
        if output[2].steps == 0:
            warnings.warn(
                f"train_loop: `test_dataset()` yielded no batch, so this epoch has "
                f"no test metrics (monitors of them fail at this step). "
                f"`test_dataset` must return a FRESH iterable each epoch: "
                f"`lambda: make_batches()`, not `lambda: g` with one generator `g` "
                f"(exhausted after the first epoch). Got {short(test_dataset, 80)}.",
                stacklevel=2,
            )
        return output

    return run_test


def test_loop(
    state: Any,
    dataset: Iterable[Any],
    tasks: Mapping[Any, Any] | None = None,
    *,
    callbacks: list[Any] | None = None,
    **loop_kwargs: Any,
) -> tuple[Any, History, Elapsed]:
    """Evaluates: the reset steps and `on_test_begin` first; per batch
    `on_test_batch_begin`, `on_test_step`, the ordinary `tasks`, `on_test_batch_end`;
    `on_test_end` after the last batch. Registration as in `train_loop`;
    `loop_kwargs` (`stop`, `history`, `elapsed`, `catch_keyboard_interrupt`,
    `metadata`, `batch_size_fn`) as in `ciclo.loop`.

    Raises:
        ValueError: if nothing would run per batch: no `on_test_step` (or other
            per-batch) callback and no ordinary schedule in `tasks`.

    Example:
        >>> import ciclo
        >>> def test_step(state, batch):
        ...     return ciclo.logs().add_metric("double", 2 * batch)
        >>> _, history, _ = ciclo.test_loop(None, [1, 2], {ciclo.on_test_step: test_step})
        >>> history.collect("double")
        [2, 4]
    """
    named, ordinary = register(TEST, state, tasks, callbacks)
    return _run(TEST, state, dataset, named, ordinary, **loop_kwargs)


def predict_loop(
    state: Any,
    dataset: Iterable[Any],
    tasks: Mapping[Any, Any] | None = None,
    *,
    callbacks: list[Any] | None = None,
    **loop_kwargs: Any,
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
    named, ordinary = register(PREDICT, state, tasks, callbacks)
    return _run(PREDICT, state, dataset, named, ordinary, **loop_kwargs)


test_loop.__test__ = False  # not a pytest test, even when imported into a test module
