"""`loop`: the interpreter of the loop language, the only driver in ciclo.

It validates its arguments, lets resuming callbacks replace the state, history and
elapsed, takes its data through the input stage (`ciclo._input.stage.inputs`:
positions, fused calls, read-ahead; a predefined loop hands it its stage
assembled), then runs the batches (`ciclo._loop.run.Run`, the per-batch
timeline), `on_end` and the `__loop_end__` hooks, and ends cleanly on Ctrl-C or
with a note on a callback's error. How callbacks are called is in
`ciclo._loop.runners`; the live record they get, in `ciclo._loop.state`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ciclo._history.history import History
from ciclo._input.batch import Steps
from ciclo._input.fused import check_steps, declared_steps
from ciclo._input.prefetch import check_prefetch
from ciclo._input.resume import Start, nothing_left, prepare
from ciclo._input.stage import Inputs, inputs
from ciclo._interrupts import scope as interrupt_scope
from ciclo._logs import Logs
from ciclo._loop.hooks import HookTable
from ciclo._loop.run import Run
from ciclo._loop.runners import (
    abandon,
    finish,
    make_plan,
    reads_batch_after_pass_end,
    runners,
)
from ciclo._loop.state import LoopState, read_from
from ciclo._loop.state import interrupted as set_interrupted
from ciclo._period import Period, as_period
from ciclo._short import short
from ciclo._time import Elapsed, mark_counted
from ciclo._warn import warn

__all__ = ["EmptyDataWarning", "loop"]


class EmptyDataWarning(UserWarning):
    """A loop's dataset yielded no batch (the predefined loops say it their way)."""


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
            holds at least 256 KiB (a fused call: per step), else off. Callbacks
            still get the dataset's batches; only consumed batches are counted
            (`elapsed`, checkpoints' data position); a dataset's exception is
            raised at its batch; a checkpointable iterator (Grain's) is put back
            after the last consumed batch when the loop ends; reading never goes
            past a `stop` in steps.

    Returns:
        `(state, history, elapsed)`, `elapsed` counting every consumed batch.

    Preemption: while a loop runs in the main thread, SIGTERM (or, under
    `jax.distributed`, jax's preemption sync point, agreed by every process) ends
    it after the step in flight; objects with `__loop_preempt__(loop_state)` (a
    `ciclo.checkpoint`) save that step, the end hooks wait for it, and the process
    then ends as SIGTERM ends it (status 143). See `ciclo._interrupts`.

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
    return run_loop(
        HookTable(), state, dataset, tasks, stop=stop, on_start=on_start,
        on_end=on_end, history=history, elapsed=elapsed,
        catch_keyboard_interrupt=catch_keyboard_interrupt,
        batch_size_fn=batch_size_fn, metadata=metadata,
        steps_per_call=steps_per_call, prefetch=prefetch,
    )  # fmt: skip


def run_loop(
    table: HookTable,
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
    """`loop`, its callbacks' hooks read into `table`: a predefined loop passes
    the table it already ran the resume and start hooks of (`table.prepared`;
    its data then starts where they put it), so they run once per loop."""
    plan = make_plan(tasks, table)
    check_prefetch(prefetch, "ciclo.loop")
    start = runners(on_start, "on_start", table)
    end = runners(on_end, "on_end", table)
    groups = [*tasks.values(), on_start, on_end]
    end_hooks = table.end_hooks(groups)
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
    if not isinstance(dataset, Inputs):  # else a predefined loop's, assembled
        if steps_per_call is None:
            steps_per_call = declared_steps(groups[:-2]) or 1
        check_steps(steps_per_call, "ciclo.loop")
    with interrupt_scope() as scope:
        try:  # resuming (restore, data read back) ends as the loop would
            start_at = Start()  # prepared: the data starts where it was put
            if not table.prepared:
                state, history, elapsed, start_at = prepare(
                    table, groups, state, history, elapsed
                )
            data = dataset
            if not isinstance(data, Inputs):
                data = inputs(
                    dataset, state=state, elapsed=elapsed, start_at=start_at,
                    stop=stop_period, steps_per_call=steps_per_call,
                    prefetch=prefetch, batch_size_fn=batch_size_fn,
                )  # fmt: skip
        except BaseException as error:
            reached = Elapsed.create() if elapsed is None else elapsed
            abandon(table, groups, LoopState(state, None, reached, reached, history,
                                      Logs(), metadata), error)  # fmt: skip
            if isinstance(error, KeyboardInterrupt) and catch_keyboard_interrupt:
                return state, history, mark_counted(reached, "the loop returned")
            raise
        return _run(
            scope, state, history, elapsed, data, plan, start, end, end_hooks,
            stop_period, metadata, catch_keyboard_interrupt, groups, start_at, table,
        )  # fmt: skip


def _run(
    scope, state, history, elapsed, data, plan, start, end, end_hooks,
    stop_period, metadata, catch_keyboard_interrupt, groups, start_at, table,
) -> tuple[Any, History, Elapsed]:  # fmt: skip
    """The batches, `on_end` and the end hooks (`loop` after its arguments)."""
    initial = Elapsed.create() if elapsed is None else elapsed.resume()
    # first of the end hooks: `elapsed` then counts the consumed batches, and a
    # checkpointable iterator is put back after them
    end_hooks.insert(0, lambda ls: data.close(int(ls.elapsed.steps - initial.steps)))
    ls = LoopState(state, None, initial, initial, history, Logs(), metadata)
    ls._table = table
    # while it runs, the history knows the step's uncommitted logs (`collect`)
    outer, history._live = history._live, ls
    end_hooks.append(lambda ls: setattr(history, "_live", outer))
    read_from(ls, data)
    # a batch is copied before the next is read to learn its pass end only when
    # a callback may read it after that (a loader may refill its buffer)
    data.keep_batches = reads_batch_after_pass_end(plan, end)
    # the input stage's count of a batch's samples (global across processes)
    run = Run(ls, plan, start, stop_period, data.batch_size_fn)
    if scope is not None and scope.claim(run):  # stops after a step on SIGTERM
        run.watch = scope.stop_requested
    interrupted = False
    try:
        run.batches(data)
    except KeyboardInterrupt as error:
        set_interrupted(ls, True)
        if not catch_keyboard_interrupt:
            ls.error = error
            _unfinished(run, error)
            finish(end_hooks, ls)
            raise
        interrupted = True
        run.interrupted()
    except Exception as error:
        where = getattr(run.running, "where", None)
        if run.finishing is not None:  # a deferred action, after the step's commit
            where = getattr(run.finishing, "where", None)
            at = f"after step {ls.elapsed.steps}" + (f" by {where}" if where else "")
        elif run.in_batch:
            at = f"at step {ls.elapsed.steps}" + (f" by {where}" if where else "")
        elif hasattr(error, "ciclo_stage"):  # the input stage's own (fused stack)
            at = (
                f"by the input stage, {error.ciclo_stage} from step {run.current.steps}"
            )
        else:  # the dataset (or read-ahead) raised fetching the next batch
            at = f"by the dataset, fetching the batch of step {run.current.steps}"
        kept = f"the history holds the {len(history)} rows committed before it"
        if run.in_batch:
            kept += " (that step's logs are not committed)"
        error.add_note(f"ciclo.loop: raised {at}; {kept}.")
        if (
            run.in_batch
            and type(ls.batch) is Steps
            and isinstance(error, TypeError)
            and "Steps" in str(error)  # a callback that took it for its batch
        ):
            error.add_note(
                f"With steps_per_call, each callback gets a ciclo.Steps ({ls.batch.n} "
                f"batches stacked on a new leading axis: `.batch`, `.n`). A managed "
                f"step (managed.train_step, a Flax state's) runs them in one compiled "
                f"call; another callback must take a ciclo.Steps itself. Wrap the step "
                f"with managed.train_step, or run without steps_per_call."
            )
        if run.in_batch and run.finishing is None:  # writers see the failing row
            run.finish_observers()
        ls.error = error
        _unfinished(run, error)
        finish(end_hooks, ls)
        raise
    except BaseException as error:
        ls.error = error
        finish(end_hooks, ls)
        raise
    ls.elapsed = ls.elapsed_after = run.current
    ls.logs = Logs()
    try:
        for callback in end:
            callback(ls)
        if ls.logs:
            history.commit(run.current, ls.logs)
        run.after_commit()  # e.g. a checkpoint in `on_end`
        if run.preempted:  # the checkpoints save the step reached (SIGTERM)
            finish(table.preempt_hooks(groups), ls)
    except BaseException as error:
        ls.error = error
        raise
    finally:
        if scope is not None and scope.watcher is run:
            scope.watcher = None
        try:
            finish(end_hooks, ls)
        except KeyboardInterrupt:  # Ctrl-C while the saves were finished
            if not catch_keyboard_interrupt or getattr(ls, "error", None):
                raise
    stopped = interrupted or ls.stop_iteration or ls.stopping
    if start_at.source is not None and run.current.steps == initial.steps:
        if not stopped:  # restored at the end of a finished run: said once
            nothing_left("ciclo.loop", start_at, initial)
    elif (  # a fresh loop over no data
        initial.steps == 0
        and run.current.steps == 0
        and not stopped
        and not (stop_period is not None and stop_period.reached(initial))
    ):
        warn(
            EmptyDataWarning(
                "ciclo.loop: `dataset` yielded no batch, so no task ran on a batch. "
                "Expected at least one: check that it is not an exhausted iterator "
                "or generator, or an empty list."
            )
        )
    return ls.state, history, mark_counted(run.current, "the loop returned")


def _unfinished(run: Run, error: BaseException) -> None:
    """The actions deferred to the failed batch's commit, run as at their call
    (a checkpoint's save of that step); their own failure is a note on `error`."""
    try:
        run.unfinished()
    except Exception as failed:
        where = getattr(run.finishing, "where", "a deferred action")
        error.add_note(
            f"ciclo.loop: then {where} failed: {type(failed).__name__}: {failed}"
        )
