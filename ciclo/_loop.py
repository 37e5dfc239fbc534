"""`loop`: the interpreter of the loop language, the only driver in ciclo.

It owns the per-batch timeline: for each batch it computes `elapsed` (before the
batch) and `elapsed_after` (counting it) once, runs the firing schedules' callbacks,
commits the step's logs, and decides whether to stop.

Fused execution has one hook here: a batch that is a `ciclo.Steps` (`n` batches
stacked, built by `ciclo.fuse` when `steps_per_call > 1`) counts as `n` steps and
its `samples`; when the step that ran it left per-step logs in `Steps.rows`, the
history gets `n` rows (`History.commit_steps`) instead of one. Everything else —
schedules, callbacks, stopping — sees the call as one batch, so schedules fire at
call boundaries.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
import numpy as np

from ciclo._callback import arity, describe, split_output, uncalled
from ciclo._fused import check_steps, declared_steps, fuse
from ciclo._history import History
from ciclo._logs import Logs
from ciclo._prefetch import Prefetch, check_prefetch, placer
from ciclo._resume import position, prepare
from ciclo._schedules.base import fresh
from ciclo._time import Elapsed, Period, Steps, as_period, batch_size, short

__all__ = ["EmptyDataWarning", "LoopState", "loop"]


class EmptyDataWarning(UserWarning):
    """A loop's dataset yielded no batch (the predefined loops say it their way)."""


class LoopState:
    """The loop's live record, passed to callbacks as their fourth argument.

    Read it during the call; the loop reuses it from batch to batch.

    Attributes:
        state: the current state (updated after every callback that returns one).
        batch: the current batch.
        elapsed: the `Elapsed` before the current batch.
        elapsed_after: the `Elapsed` counting the current batch (what the state
            has consumed once the batch's train step ran).
        history: the `History` being built.
        logs: this step's logs so far.
        accumulated_logs: every entry logged so far in this loop (this step's
            included), latest value per entry; a new `Logs` at each read.
        metadata: the `metadata` given to `loop`.
        stop_iteration: set it to True to end the loop right after the current
            callback (the batch's remaining callbacks do not run).
        error: while the end hooks (`__loop_end__`) run, the exception the loop
            is ending with; None on a normal end or a caught Ctrl-C.

    Example:
        >>> import ciclo
        >>> def stop_at_two(state, batch, elapsed, loop_state):
        ...     if loop_state.elapsed_after.steps == 2:
        ...         loop_state.stop_after_batch()  # the batch's other callbacks run
        >>> _, _, elapsed = ciclo.loop(None, range(10), {ciclo.every(1): stop_at_two})
        >>> elapsed.steps
        2
    """

    __slots__ = (
        "_borrowed",
        "_committed",
        "_data",
        "batch",
        "elapsed",
        "elapsed_after",
        "error",
        "history",
        "logs",
        "metadata",
        "state",
        "stop_iteration",
        "stopping",
    )

    def __init__(self, state, batch, elapsed, elapsed_after, history, logs, metadata):
        self.state, self.batch = state, batch
        self.elapsed, self.elapsed_after = elapsed, elapsed_after
        self.history, self.logs, self.metadata = history, logs, metadata
        self._committed = Logs()
        self._borrowed = None  # a callback's Logs taken as the batch's logs
        self._data = None  # the iterator the batches come from
        self.stop_iteration = False
        self.stopping = False  # stop_after_batch() was called
        self.error: BaseException | None = None  # what the loop is ending with

    @property
    def accumulated_logs(self) -> Logs:
        return Logs(self._committed).merge(self.logs)

    def data_state(self) -> Any:
        """The position of the data after the current batch, when the batches come
        from a checkpointable iterator (`get_state()`/`set_state()`, as Grain's):
        its `get_state()`; else None. `ciclo.checkpoint` saves it, and a resumed
        run hands it to the new iterator's `set_state` instead of skipping."""
        get_state = getattr(self._data, "get_state", None)
        return None if get_state is None else get_state()

    def stop_after_batch(self) -> None:
        """Ends the loop at the end of the current batch: the batch's remaining
        callbacks still run and its logs are committed. Called from `on_start`, it
        ends the loop before the first batch."""
        self.stopping = True

    def __repr__(self) -> str:
        return (
            f"LoopState(elapsed.steps={self.elapsed.steps}, "
            f"stop_iteration={self.stop_iteration}, stopping={self.stopping})"
        )


Runner = Callable[[LoopState], None]


_NUMERIC = (int, float, complex, np.generic, np.ndarray, jax.Array)


def _check_state(new: Any, old: Any, callback: Any) -> None:
    """The first state a callback returns must be a state: a callback that returns
    a bare number or array for a structured state (e.g. an `eval_step` returning
    its accuracy) would silently replace the state with it."""
    if old is None or type(new) is type(old):
        return
    if isinstance(old, _NUMERIC) and not isinstance(new, str | bytes):
        return  # a number state may become an array (or anything but text)
    if isinstance(new, type(old)) or isinstance(old, type(new)):
        return
    if isinstance(new, Mapping) and isinstance(old, Mapping):
        return
    what = (
        f"an array of shape {tuple(new.shape)}"
        if hasattr(new, "shape") and hasattr(new, "dtype")
        else f"a {type(new).__name__}"
    )
    if isinstance(new, (*_NUMERIC, str)):
        raise TypeError(
            f"Callback {describe(callback)} returned {what} where the state (a "
            f"{type(old).__name__}) was expected, so it would replace the state. "
            f"To log a value return logs, e.g. ciclo.logs().add_metric('accuracy', "
            f"value), or (logs, state); return None or (logs, None) to keep the "
            f"state."
        )
    warnings.warn(
        f"Callback {describe(callback)} returned {what} as the new state, which "
        f"was a {type(old).__name__}; the loop continues with it. If it is not a "
        f"state, return logs or (logs, None) instead.",
        stacklevel=5,
    )


class _Apply:
    """Applies a callback's output to the loop state; checks the first state it
    returns against the state it got (once per callback, never per step)."""

    __slots__ = ("callback", "checked", "where")

    def __init__(self, callback: Any, where: str):
        self.callback, self.where, self.checked = callback, where, False

    def __call__(self, output: Any, ls: LoopState) -> None:
        if output is None:
            return
        callback = self.callback
        if type(output) is Logs:  # the common outputs first, as split_output reads
            logs, state = output, None
        else:
            logs, state = split_output(output, callback)
        if logs:
            target = ls.logs
            if not target and type(logs) is Logs:
                # the batch's first logs are taken as they are, copied only if
                # another callback's logs are merged in (the callback's object
                # is never changed)
                ls.logs = ls._borrowed = logs
                logs = None
            elif target is ls._borrowed:
                target = ls.logs = Logs(target)
        if logs:
            try:
                target.merge(logs)
            except TypeError as error:
                raise TypeError(
                    f"Callback {describe(callback)} returned logs that are not a "
                    f"dict of collections to entries ({error}). Build them with "
                    f"ciclo.logs().add_loss/add_metric(...), or return (None, "
                    f"state) when the first element is a state."
                ) from None
        if state is not None:
            if not self.checked:
                self.checked = True
                _check_state(state, ls.state, callback)
            ls.state = state


def runner(callback: Any, where: str) -> Runner:
    """Turns a callback into `run(loop_state)`, deciding once how to call it."""
    name = uncalled(callback)
    if name is not None:
        kind = "class" if isinstance(callback, type) else "factory"
        raise TypeError(
            f"{where} is the {kind} {name}, not a callback: build one first; did "
            f"you mean {name}(...)?"
        )
    apply = _Apply(callback, where)
    loop_callback = getattr(callback, "__loop_callback__", None)
    if loop_callback is not None:
        run = lambda ls: apply(loop_callback(ls), ls)
        run.where = f"{where} ({describe(callback)})"
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
    run.where = f"{where} ({describe(callback)})"
    return run


def _as_list(callbacks: Any) -> list[Any]:
    if callbacks is None:
        return []
    return list(callbacks) if isinstance(callbacks, list | tuple) else [callbacks]


def _runners(callbacks: Any, where: str) -> list[Runner]:
    return [runner(cb, f"{where}[{i}]") for i, cb in enumerate(_as_list(callbacks))]


def _end_hooks(groups: Iterable[Any]) -> list[Callable[[LoopState], Any]]:
    """The `__loop_end__` hooks of every callback object (or bound method's owner)."""
    seen, hooks = set(), []
    for group in groups:
        for cb in _as_list(group):
            owner = cb if hasattr(cb, "__loop_end__") else getattr(cb, "__self__", None)
            hook = getattr(owner, "__loop_end__", None)
            if hook is not None and id(owner) not in seen:
                seen.add(id(owner))
                hooks.append(hook)
    return hooks


def _plan(tasks: Mapping[Any, Any]) -> list[tuple[Callable[..., bool], bool, list]]:
    """Validates `tasks`: (loop-private schedule, reads the loop state, runners)."""
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
                " (wrap it: ciclo.every(...))" if isinstance(key, int | Period) else ""
            )
            raise TypeError(
                f"Task key {short(key)} ({type(key).__name__}) is not a schedule; "
                f"expected "
                f"a callable elapsed -> bool such as ciclo.every(10){hint}."
            )
        after = bool(getattr(key, "reads_loop_state", False))
        plan.append(
            (fresh(key), after, _runners(callbacks, f"Callback tasks[{key!r}]"))
        )
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
    steps_per_call: int | None = None,
    prefetch: int | None = None,
) -> tuple[Any, History, Elapsed]:
    """Runs `tasks` over `dataset`: for each batch, every firing schedule's callbacks.

    Schedules are checked in dict order with the `elapsed` before the batch (a
    schedule with a true `reads_loop_state` attribute gets the `LoopState`, e.g. to
    read `elapsed_after`); a firing schedule runs its callbacks in list order. Each callback is called with
    the first N of `(state, batch, elapsed, loop_state)` (N = its positional
    parameters) and returns `None`, a `Logs`, a state, or `(logs_or_None,
    state_or_None)`. The step's logs are committed to `history` after the batch.
    The loop ends when the dataset is exhausted, after the batch whose
    `elapsed_after` reaches `stop`, right after a callback sets
    `loop_state.stop_iteration = True`, or at the end of a batch in which a callback
    called `loop_state.stop_after_batch()`. Objects with `__loop_end__(loop_state)`
    among the callbacks (or owning a bound method among them) have it run once when
    the loop ends, whatever the reason; objects with `__loop_resume__(state,
    history, elapsed)` (such as `ciclo.checkpoint(directory, resume=True)`) may
    replace those three before the loop starts, and a plain iterable dataset is
    then advanced past the batches already consumed.

    Args:
        state: the initial state (any pytree or object).
        dataset: any iterable of batches, or a factory `dataset(start_step)`
            returning one (called with the step the loop starts at: 0, the
            `elapsed` given, or the one a resuming checkpoint restored).
        tasks: `{schedule: callback_or_list}`.
        stop: end once `elapsed >= stop` (int steps or a `Period`).
        on_start: callback(s) run once before the first batch's tasks.
        on_end: callback(s) run once after the last batch.
        history: a `History` to append to (a new one by default).
        elapsed: where to start counting (e.g. a restored checkpoint's `Elapsed`).
        catch_keyboard_interrupt: on Ctrl-C end cleanly and return what was
            reached. The batch in progress counts (and its logs are in the history
            once) when its tasks all ran or a callback already returned a new
            state; otherwise it leaves no row and is not counted, so resuming
            from the returned `elapsed` redoes it. Never a duplicate or a gap.
        batch_size_fn: given a batch's leaf shapes, returns its size.
        metadata: anything; exposed as `loop_state.metadata`.
        steps_per_call: fused execution: group `steps_per_call` consecutive
            batches into one `ciclo.Steps` (see `ciclo.fuse`), which a managed
            step runs in one compiled call and the loop counts as that many
            steps. Default: what a callback declares (a managed step made with
            `steps_per_call=`), else 1. Schedules are checked once per call;
            a `stop` in steps is exact (the last call is shortened).
        prefetch: with a state that carries a strategy (a managed or Flax
            state), how many upcoming batches (fused calls) are read and placed
            on the device with the strategy while the current step runs; 0
            turns it off; None (default): one on an accelerator when a batch
            holds at least 256 KiB (a fused call always), else off. Callbacks
            still get the dataset's batches; only consumed batches are counted
            (`elapsed`, checkpoints' data position); a dataset's exception is
            raised at its batch; a checkpointable iterator (Grain's) is put back
            after the last consumed batch when the loop ends; reading never goes
            past a `stop` in steps.

    Returns:
        `(state, history, elapsed)`, `elapsed` counting every consumed batch.

    An exception raised by a callback propagates after the `__loop_end__` hooks
    ran, with a note naming the callback and the step; `history` then holds every
    row committed before that step (pass your own `history=` to keep it).

    Raises:
        TypeError: for a task key that is not a schedule, a callback that is not
            callable, a callback returning a value of the wrong shape, or a bare
            number/array returned where the state is a structured object.

    Example:
        >>> import ciclo
        >>> def count(state, batch):
        ...     return ciclo.logs().add_metric("total", state + batch), state + batch
        >>> state, history, elapsed = ciclo.loop(0, range(5), {ciclo.every(1): count})
        >>> state, elapsed.steps, history.collect("total")
        (10, 5, [0, 1, 3, 6, 10])
    """
    plan = _plan(tasks)
    check_prefetch(prefetch, "ciclo.loop")
    start = _runners(on_start, "on_start")
    end = _runners(on_end, "on_end")
    end_hooks = _end_hooks([*tasks.values(), on_start, on_end])
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
            f"ciclo.restore), got {short(elapsed)} ({type(elapsed).__name__}). To "
            f"start counting at step n use ciclo.Elapsed.create(steps=n)."
        )
    state, history, elapsed, start_at = prepare(
        [*tasks.values(), on_start, on_end], state, history, elapsed
    )
    dataset = position(dataset, elapsed, start_at, "ciclo.loop")
    try:
        iterator = iter(dataset)
    except TypeError:
        raise TypeError(
            f"`dataset` must be an iterable of batches (a list, generator, numpy "
            f"array, tf.data/Grain/PyTorch loader, ...) or a factory "
            f"`dataset(start_step)` returning one; got {short(dataset)} "
            f"({type(dataset).__name__})."
        ) from None
    initial = Elapsed.create() if elapsed is None else elapsed.resume()
    if steps_per_call is None:
        steps_per_call = declared_steps([*tasks.values()]) or 1
    if check_steps(steps_per_call, "ciclo.loop") > 1:
        limit = None
        if stop_period is not None and stop_period.steps is not None:
            limit = max(stop_period.steps - initial.steps, 0)
        iterator = fuse(iterator, steps_per_call, batch_size_fn, limit)
    place = placer(state, prefetch)
    if place is not None:
        left = None
        if stop_period is not None and stop_period.steps is not None:
            left = [max(stop_period.steps - initial.steps, 0)]
        iterator = reader = Prefetch(iterator, place, prefetch, left)
        # first of the end hooks: `elapsed` then counts the consumed batches
        end_hooks.insert(
            0, lambda ls: reader.close(int(ls.elapsed.steps - initial.steps))
        )
    ls = LoopState(state, None, initial, initial, history, Logs(), metadata)
    ls._data = iterator
    run = _Run(ls, plan, start, stop_period, batch_size_fn)
    interrupted = False
    try:
        run.batches(iterator)
    except KeyboardInterrupt as error:
        if not catch_keyboard_interrupt:
            ls.error = error
            _finish(end_hooks, ls)
            raise
        interrupted = True
        run.interrupted()
    except Exception as error:
        where = getattr(run.running, "where", None)
        error.add_note(
            f"ciclo.loop: raised at step {ls.elapsed.steps}"
            + (f" by {where}" if where and run.in_batch else "")
            + f"; the history holds the {len(history)} rows committed before it "
            f"(that step's logs are not committed)."
        )
        ls.error = error
        _finish(end_hooks, ls)
        raise
    except BaseException as error:
        ls.error = error
        _finish(end_hooks, ls)
        raise
    ls.elapsed = ls.elapsed_after = run.current
    ls.logs = Logs()
    try:
        for callback in end:
            callback(ls)
        if ls.logs:
            history.commit(run.current, ls.logs)
    except BaseException as error:
        ls.error = error
        raise
    finally:
        _finish(end_hooks, ls)
    if (  # a fresh loop over no data (resuming past the end is not a mistake)
        initial.steps == 0
        and run.current.steps == 0
        and not (interrupted or ls.stop_iteration or ls.stopping)
        and not (stop_period is not None and stop_period.reached(initial))
    ):
        warnings.warn(
            EmptyDataWarning(
                "ciclo.loop: `dataset` yielded no batch, so no task ran on a batch. "
                "Expected at least one: check that it is not an exhausted iterator "
                "or generator, or an empty list."
            ),
            stacklevel=2,
        )
    return ls.state, history, run.current


def _finish(hooks: list[Callable[[LoopState], Any]], ls: LoopState) -> None:
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


class _Run:
    """The per-batch hot path of one `loop` call, and what Ctrl-C must undo."""

    def __init__(self, ls, plan, start, stop, batch_size_fn):
        self.ls, self.plan, self.start = ls, plan, start
        self.stop, self.batch_size_fn = stop, batch_size_fn
        self.current = ls.elapsed  # counts every batch whose tasks completed
        self.started = False
        self.in_batch = False
        self.done = False  # the batch's tasks all ran
        self.rows = None  # len(history) just before the batch's commit began
        self.state = None  # the state when the batch started
        self.running = None  # the runner running (named in error notes)

    def _on_start(self) -> None:
        self.started = True
        for callback in self.start:
            callback(self.ls)

    def batches(self, iterator: Any) -> None:
        ls, plan, stop, history = self.ls, self.plan, self.stop, self.ls.history
        size_fn = self.batch_size_fn
        current = self.current
        new_logs = Logs.__new__  # an empty Logs, without a Python __init__ call
        if stop is not None and stop.reached(current):
            iterator = iter(())
        for batch in iterator:
            ls.batch, ls.elapsed, ls.logs = batch, current, new_logs(Logs)
            if not self.started:  # with the first batch, before its tasks
                self._on_start()
                if ls.stop_iteration or ls.stopping:
                    return
            if type(batch) is Steps:  # fused: counts as batch.n steps
                batch.rows = None
                after = current.update(batch.samples, steps=batch.n)
            else:
                after = current.update(batch_size(batch, size_fn))
            ls.elapsed_after = after
            self.state, self.rows, self.done = ls.state, None, False
            self.in_batch = True
            for schedule, reads_loop_state, runners in plan:
                if schedule(ls if reads_loop_state else current):
                    for run in runners:
                        self.running = run
                        run(ls)
                        if ls.stop_iteration:
                            break
                    if ls.stop_iteration:
                        break
            self.done = True
            logs = ls.logs
            if type(batch) is Steps and batch.rows is not None:
                self.rows = len(history)
                history.commit_steps(current, batch, logs)
                ls._committed.merge(logs)
            elif logs:
                self.rows = len(history)
                history.commit(current, logs)  # publishes the row in one store
                ls._committed.merge(logs)
            current = self.current = after
            self.in_batch = False
            if (
                ls.stop_iteration
                or ls.stopping
                or (stop is not None and stop.reached(after))
            ):
                break
            current = self.current = after.update_time()
        if not self.started:  # no batch at all: on_start still runs once
            ls.batch = None
            self._on_start()

    def interrupted(self) -> None:
        """After Ctrl-C inside a batch: the batch counts when its tasks all ran or
        it changed the state (its step reached the state); then its logs are in
        the history exactly once. A batch that does not count leaves no row (it
        is redone when the run resumes from the returned `elapsed`)."""
        if not self.in_batch:
            return
        ls = self.ls
        counted = self.done or ls.state is not self.state
        published = self.rows is not None and len(ls.history) > self.rows
        if counted and ls.logs and not published:
            ls.history.commit(self.current, ls.logs)
            ls._committed.merge(ls.logs)  # `accumulated_logs` in the end hooks
        if counted:
            self.current = ls.elapsed_after
