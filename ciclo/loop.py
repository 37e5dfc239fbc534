"""`loop`: the interpreter of the loop language (the only driver in ciclo)."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ciclo.history import History
from ciclo.logs import Logs
from ciclo.schedules.base import fresh
from ciclo.time import Elapsed, Period, as_period, batch_size

__all__ = ["LoopState", "loop"]

_MAX_ARGS = 4  # (state, batch, elapsed, loop_state)


@dataclasses.dataclass
class LoopState:
    """What a callback can see and change while the loop runs.

    Attributes:
        state: the current state (updated after every callback that returns one).
        batch: the current batch.
        elapsed: the `Elapsed` before the current batch.
        history: the `History` being built.
        logs: this step's logs so far.
        accumulated_logs: every entry seen so far in this loop, latest value.
        metadata: the `metadata` given to `loop`.
        stop_iteration: set it to True to end the loop after the current callback.
        in_step: True while a batch's tasks run (the state may already include the
            batch, so it counts `elapsed.update(batch_size)`); False in `on_start`
            and `on_end`. Used by `checkpoint` to record what the state consumed.
        batch_size_fn: the loop's `batch_size_fn` (None: first axis of the leaves).
    """

    state: Any
    batch: Any
    elapsed: Elapsed
    history: History
    logs: Logs
    accumulated_logs: Logs
    metadata: Any
    stop_iteration: bool = False
    in_step: bool = False
    batch_size_fn: Callable[[list[tuple[int, ...]]], int] | None = None


Runner = Callable[[LoopState], None]


def _describe(obj: Any) -> str:
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    return name if name else repr(obj)


def _arity(callback: Callable[..., Any], where: str) -> int:
    """How many of (state, batch, elapsed, loop_state) `callback` takes."""
    try:
        parameters = inspect.signature(callback).parameters.values()
    except (TypeError, ValueError):
        return 2
    count = required = 0
    for p in parameters:
        if p.kind == p.VAR_POSITIONAL:
            return _MAX_ARGS
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            count += 1
            required += p.default is p.empty
        elif p.kind == p.KEYWORD_ONLY and p.default is p.empty:
            required = _MAX_ARGS + 1
    if required > _MAX_ARGS:
        raise TypeError(
            f"{where} ({_describe(callback)}) requires more arguments than a callback "
            f"gets: it is called with the first N of (state, batch, elapsed, "
            f"loop_state); give its other parameters defaults or bind them with "
            f"functools.partial."
        )
    return min(count, _MAX_ARGS)


def _bad_logs(callback: Any, logs: Any, error: Exception) -> TypeError:
    return TypeError(
        f"Callback {_describe(callback)} returned logs that are not a dict of "
        f"collections to entries ({error}); got {logs!r:.200}. Build them with "
        f"ciclo.logs() and logs.add_loss/add_metric(...), or return (None, state) "
        f"when the first element is a state."
    )


def _apply(output: Any, loop_state: LoopState, callback: Any) -> None:
    """Applies a callback's return value (see the four conventions) to `loop_state`."""
    if output is None:
        return
    if type(output) is tuple:
        if len(output) != 2:
            raise TypeError(
                f"Callback {_describe(callback)} returned a tuple of length "
                f"{len(output)} ({', '.join(type(o).__name__ for o in output)}); "
                f"expected None, a Logs, a state, or a 2-tuple (logs_or_None, "
                f"state_or_None). To return a tuple state, return (None, state)."
            )
        logs, state = output
        if logs is not None and not isinstance(logs, Mapping):
            raise TypeError(
                f"Callback {_describe(callback)} returned a 2-tuple whose first "
                f"element is a {type(logs).__name__}; expected (logs_or_None, "
                f"state_or_None). To return a tuple state, return (None, state)."
            )
    elif isinstance(output, Logs):
        logs, state = output, None
    else:
        logs, state = None, output
    if logs:
        try:
            loop_state.logs.merge(logs)
        except TypeError as error:
            raise _bad_logs(callback, logs, error) from None
        loop_state.accumulated_logs.merge(logs)
    if state is not None:
        loop_state.state = state


def _runner(callback: Any, where: str) -> Runner:
    """Turns a callback into `run(loop_state)`, deciding how to call it once."""
    loop_callback = getattr(callback, "__loop_callback__", None)
    if loop_callback is not None:

        def run(ls: LoopState) -> None:
            _apply(loop_callback(ls), ls, callback)

        return run
    if not callable(callback):
        raise TypeError(
            f"{where} is {callback!r} ({type(callback).__name__}), which is not "
            f"callable; expected a function f(state, batch, elapsed, loop_state) -> "
            f"(logs, state) or an object with __loop_callback__."
        )
    n = _arity(callback, where)
    if n == 0:
        return lambda ls: _apply(callback(), ls, callback)
    if n == 1:
        return lambda ls: _apply(callback(ls.state), ls, callback)
    if n == 2:
        return lambda ls: _apply(callback(ls.state, ls.batch), ls, callback)
    if n == 3:
        return lambda ls: _apply(callback(ls.state, ls.batch, ls.elapsed), ls, callback)
    return lambda ls: _apply(callback(ls.state, ls.batch, ls.elapsed, ls), ls, callback)


def _runners(callbacks: Any, where: str) -> list[Runner]:
    if callbacks is None:
        return []
    if not isinstance(callbacks, list | tuple):
        callbacks = [callbacks]
    return [_runner(cb, f"{where}[{i}]") for i, cb in enumerate(callbacks)]


def _finalizers(
    tasks: Mapping[Any, Any], *more: Any
) -> list[Callable[[LoopState], Any]]:
    """`__loop_end__` hooks of every callback object, each object once."""
    seen, hooks = set(), []
    groups = [*tasks.values(), *more]
    for group in groups:
        for cb in group if isinstance(group, list | tuple) else [group]:
            hook = getattr(cb, "__loop_end__", None)
            if hook is not None and id(cb) not in seen:
                seen.add(id(cb))
                hooks.append(hook)
    return hooks


def _plan(
    tasks: Mapping[Any, Any],
) -> list[tuple[Callable[[Elapsed], bool], list[Runner]]]:
    """Validates `tasks` and builds (loop-private schedule, runners) pairs."""
    if not isinstance(tasks, Mapping):
        raise TypeError(
            f"`tasks` must be a dict {{schedule: callback_or_list}}, got "
            f"{type(tasks).__name__}. Example: {{ciclo.every(1): [train_step]}}."
        )
    plan = []
    for key, callbacks in tasks.items():
        if isinstance(key, str):
            raise TypeError(
                f"Task key {key!r} is a string: named schedules such as "
                f"'on_train_step' only work in ciclo.train_loop/test_loop/"
                f"predict_loop. In ciclo.loop use a schedule, e.g. ciclo.every(1)."
            )
        if not callable(key):
            hint = (
                " (wrap it: ciclo.every(...) or ciclo.after(...))"
                if isinstance(key, int | Period)
                else ""
            )
            raise TypeError(
                f"Task key {key!r} ({type(key).__name__}) is not a schedule; expected "
                f"a callable elapsed -> bool such as ciclo.every(10){hint}."
            )
        plan.append((fresh(key), _runners(callbacks, f"Callback tasks[{key!r}]")))
    return plan


def loop(
    state: Any,
    dataset: Iterable[Any],
    tasks: Mapping[Any, Any],
    *,
    stop: int | Period | None = None,
    on_start: Any = None,
    on_end: Any = None,
    history: History | None = None,
    elapsed: Elapsed | None = None,
    catch_keyboard_interrupt: bool = True,
    batch_size_fn: Callable[[list[tuple[int, ...]]], int] | None = None,
    metadata: Any = None,
) -> tuple[Any, History, Elapsed]:
    """Runs `tasks` over `dataset`: for each batch, every firing schedule's callbacks.

    Schedules are checked in dict order; a firing schedule runs its callbacks in
    list order. Each callback is called with the first N of `(state, batch,
    elapsed, loop_state)` (N = its positional parameters) and returns `None`, a
    `Logs`, a state, or `(logs_or_None, state_or_None)`. The step's logs are
    committed to `history` after the batch.

    Args:
        state: the initial state (any pytree or object).
        dataset: any iterable of batches.
        tasks: `{schedule: callback_or_list}`.
        stop: end once `elapsed >= stop` (int steps or a `Period`).
        on_start: callback(s) run once before the first batch's tasks.
        on_end: callback(s) run once after the last batch.
        history: a `History` to append to (a new one by default).
        elapsed: where to start counting (e.g. a restored checkpoint's `Elapsed`).
        catch_keyboard_interrupt: on Ctrl-C end cleanly and return what was reached.
        batch_size_fn: given a batch's leaf shapes, returns its size.
        metadata: anything; exposed as `loop_state.metadata`.

    Returns:
        `(state, history, elapsed)`, `elapsed` counting every consumed batch.

    Raises:
        TypeError: for a task key that is not a schedule, a callback that is not
            callable, or a callback returning a value of the wrong shape.

    Example:
        >>> import ciclo
        >>> def count(state, batch):
        ...     logs = ciclo.logs()
        ...     logs.add_metric("total", state + batch)
        ...     return logs, state + batch
        >>> state, history, elapsed = ciclo.loop(0, range(5), {ciclo.every(1): count})
        >>> state, elapsed.steps, history.collect("total")
        (10, 5, [0, 1, 3, 6, 10])
    """
    plan = _plan(tasks)
    start = _runners(on_start, "on_start")
    end = _runners(on_end, "on_end")
    finalizers = _finalizers(tasks, on_start, on_end)
    stop_period = None if stop is None else as_period(stop, "stop")
    if history is None:
        history = History()
    elif not isinstance(history, History):
        raise TypeError(
            f"`history` must be a ciclo.History (e.g. from a previous loop or "
            f"ciclo.history()), got {type(history).__name__}."
        )
    if elapsed is not None and not isinstance(elapsed, Elapsed):
        raise TypeError(
            f"`elapsed` must be a ciclo.Elapsed (e.g. returned by a previous loop or "
            f"ciclo.restore), got {elapsed!r} ({type(elapsed).__name__}). To start "
            f"counting at step n use ciclo.Elapsed.create(steps=n)."
        )
    initial = Elapsed.create() if elapsed is None else elapsed.resume()
    ls = LoopState(state, None, initial, history, Logs(), Logs(), metadata)
    ls.batch_size_fn = batch_size_fn
    progress = _Progress(initial)
    try:
        _run(ls, progress, iter(dataset), plan, start, stop_period)
        if not progress.started:  # no batch at all: on_start still runs once
            _start(ls, progress, start)
    except KeyboardInterrupt:
        if not catch_keyboard_interrupt:
            _finalize(finalizers, ls)
            raise
        _interrupted(ls, progress)
    except BaseException:
        _finalize(finalizers, ls)
        raise
    current = progress.elapsed
    ls.elapsed, ls.logs, ls.in_step = current, Logs(), False
    try:
        for run in end:
            run(ls)
        if ls.logs:
            history.commit(current, ls.logs)
    finally:
        _finalize(finalizers, ls)
    return ls.state, history, current


@dataclasses.dataclass
class _Progress:
    elapsed: Elapsed  # counts every batch whose step completed
    started: bool = False  # on_start ran
    in_step: bool = False  # a batch's tasks are running
    committed: bool = False  # this step's logs are in history
    step_start_state: Any = None


def _finalize(hooks: list[Callable[[LoopState], Any]], ls: LoopState) -> None:
    for hook in hooks:
        hook(ls)


def _start(ls: LoopState, progress: _Progress, start: list[Runner]) -> None:
    progress.started = True
    for run in start:
        run(ls)


def _interrupted(ls: LoopState, progress: _Progress) -> None:
    """After Ctrl-C inside a step: keep its logs; count the batch if it reached the state."""
    if not progress.in_step:
        return
    if ls.logs and not progress.committed:
        ls.history.commit(progress.elapsed, ls.logs)
    if ls.state is not progress.step_start_state:
        size = batch_size(ls.batch, ls.batch_size_fn)
        progress.elapsed = progress.elapsed.update(size)


def _run(ls, progress, iterator, plan, start, stop_period) -> None:
    """The per-batch hot path."""
    history, batch_size_fn = ls.history, ls.batch_size_fn
    current = progress.elapsed
    while stop_period is None or not current >= stop_period:
        try:
            batch = next(iterator)
        except StopIteration:
            return
        ls.batch, ls.elapsed, ls.logs = batch, current, Logs()
        if not progress.started:
            _start(ls, progress, start)
            if ls.stop_iteration:  # stopped before the first batch's tasks
                return
        progress.step_start_state, progress.committed = ls.state, False
        progress.in_step = ls.in_step = True
        for schedule, runners in plan:
            if ls.stop_iteration:
                break
            if schedule(current):
                for run in runners:
                    run(ls)
                    if ls.stop_iteration:
                        break
        if ls.logs:
            history.commit(current, ls.logs)
            progress.committed = True
        current = progress.elapsed = current.update(batch_size(batch, batch_size_fn))
        progress.in_step = ls.in_step = False
        if ls.stop_iteration:
            return
