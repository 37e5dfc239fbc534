"""`train_loop`: the table of named schedules `tables.TRAIN` compiled to an
ordinary task dict (`ciclo._predefined.assemble`), then one `ciclo.loop` call.

The whole per-batch order of `train_loop`, from `tables.TRAIN`:

    on_train_begin                     (once, before the first batch's tasks)
    per batch:  on_epoch_begin (on the batches that begin an epoch),
                on_train_batch_begin, on_train_step, the ordinary `tasks`,
                [epoch end: on_reset_step, the test loop, on_epoch_end],
                on_train_batch_end
    on_train_end                       (once, after the last batch)

The test loop (the validation, `tables.VALIDATION`): on_validation_begin,
on_test_begin; per test batch on_validation_batch_begin, on_test_batch_begin,
on_validation_step (else on_test_step), on_test_batch_end,
on_validation_batch_end; then on_test_end, on_validation_end.

The parts it assembles live with their kind: the epoch end is a schedule
(`_schedules.epoch`) reading the pass ends the input stage gives
(`ciclo._input.stage`, which `loop` then runs as it is), the test loops
`inner_loop` callbacks (`ciclo._predefined.validation`).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

from ciclo._history.history import History
from ciclo._input.fused import check_steps, declared_steps
from ciclo._input.passes import check_epochs
from ciclo._input.prefetch import check_prefetch
from ciclo._input.resume import nothing_left, prepare
from ciclo._input.stage import inputs
from ciclo._interrupts import scope as interrupt_scope
from ciclo._logs import Logs
from ciclo._loop.hooks import HookTable
from ciclo._loop.loop import EmptyDataWarning, run_loop
from ciclo._loop.runners import abandon
from ciclo._loop.state import LoopState
from ciclo._period import Period, as_period
from ciclo._predefined.assemble import compile_table, run_table
from ciclo._predefined.epoch_logs import EpochLogs
from ciclo._predefined.register import as_list, register
from ciclo._predefined.tables import EPOCH_LOGS, EPOCH_SUM, NESTED, TRAIN
from ciclo._predefined.validation import test_loops
from ciclo._schedules.epoch import EpochEnd, epochs_end
from ciclo._schedules.named import on_train_step
from ciclo._time import Elapsed, mark_counted
from ciclo._warn import warn

__all__ = ["train_loop"]


def train_loop(
    state: Any,
    dataset: Iterable[Any],
    tasks: Mapping[Any, Any] | None = None,
    *,
    callbacks: list[Any] | None = None,
    test_dataset: Callable[[], Iterable[Any]]
    | Mapping[str, Callable[[], Iterable[Any]]]
    | None = None,
    epoch_duration: int | Period | None = None,
    test_duration: int | Period | Mapping[str, int | Period] | None = None,
    test_name: str = "test",
    epochs: int | None = None,
    test_every: int | Callable[..., bool] | None = None,
    epoch_logs: bool | str | Callable[[list[Any]], Any] | Mapping[str, Any] = False,
    stop: int | Period | None = None,
    history: History | None = None,
    elapsed: Elapsed | None = None,
    catch_keyboard_interrupt: bool = True,
    metadata: Any = None,
    batch_size_fn: Callable[[list[tuple[int, ...]]], int] | None = None,
    inner_loop_kwargs: Mapping[str, Any] | None = None,
    resume: str | os.PathLike | Literal[False] | None = None,
    steps_per_call: int | None = None,
    prefetch: int | None = None,
) -> tuple[Any, History, Elapsed]:
    """Trains with named schedules, evaluating on `test_dataset` at each epoch end.

    The per-batch order is in this module's docstring. Each named schedule runs the
    state's method of that name (or alias) first, then the explicit `tasks`, then
    the `callbacks` that have an attribute of that name (they do not run in the
    test loop). An epoch ends after the batch whose `elapsed_after` crosses a
    multiple of `epoch_duration` (in any field), reaches `stop`, or is the last of
    the data (learnt by reading one batch ahead, only when needed); without
    `epoch_duration` an epoch is one pass over the data. Stopping works as in
    `ciclo.loop`. With `epochs`, the data is read again for each epoch (a
    re-iterable dataset iterated again, a zero-argument factory called again) and
    the loop ends after that many epochs (or at `stop`, if earlier).

    Args:
        state: the initial state; its class's named methods register themselves.
        dataset: any iterable of training batches, a zero-argument factory
            returning one (called once per epoch), or a factory
            `dataset(start_step)` (see `ciclo.loop`).
        tasks: `{named_or_ordinary_schedule: callback_or_list}`.
        callbacks: objects registering their `on_train_*`, `on_epoch_*`,
            `on_reset_step` and `on_validation_*` attributes (keras_bar,
            checkpoint, early_stopping, ...); their `on_test_*` attributes are
            left to `test_loop`, so one object can tell the validation here
            from a final test.
        test_dataset: a zero-argument callable returning a fresh test iterable,
            or a dict `name -> callable` (one test loop each, entries suffixed
            `_{name}`, run in the dict's order). Each fires the validation
            hooks (`on_validation_begin`, ...) and, inside them, the test hooks
            given in `tasks`; its step is `on_validation_step` (alias
            `validation_step`) if anything is registered there, else
            `on_test_step` (`test_step`).
        epoch_duration, test_duration: int steps or a `Period`; `test_duration`
            bounds each test loop (default: until the test data is exhausted); a
            dict `name -> duration` with a dict `test_dataset`. `epoch_duration`
            defaults to one pass over `dataset`.
        test_name: suffix of the test entries (`"accuracy_test"`).
        epochs: how many epochs to train (passes over `dataset`, or epochs of
            `epoch_duration`); needs a re-iterable `dataset` or a zero-argument
            factory unless `epoch_duration` is given.
        test_every: run the test loop(s) every n-th epoch (an int), or at the
            epoch ends where this schedule fires (e.g. `ciclo.after(1000)`).
            The reset steps still run at every epoch end.
        epoch_logs: at each epoch end, also log the epoch's aggregates of the
            train batches' entries as `{name}_epoch`, e.g. `loss_epoch`; before
            `on_epoch_end`, so a checkpoint or early stopping can monitor them.
            True: the means of the losses and metrics (weighted by batch size);
            or an aggregation spec as `ciclo.inner_loop`'s (a mode such as
            `"max"`, a function of the list of values, or a dict entry or
            collection -> mode), accumulated on the device where the mode
            allows (no per-step sync). A step can declare an entry's mode when
            logging it: `logs.add_metric("acc", acc, aggregation="max")`.
        inner_loop_kwargs: for the test `ciclo.inner_loop`, e.g. its aggregation.
        stop, history, elapsed, catch_keyboard_interrupt, metadata, batch_size_fn:
            as in `ciclo.loop` (the test loop shares `metadata`/`batch_size_fn`).
        resume: a checkpoint directory: shorthand for adding
            `ciclo.checkpoint(resume, resume=True)` to `callbacks` (saves at each
            epoch end; starts from its latest complete checkpoint, if any, with the
            state, history, elapsed and data position restored; newer ones that
            do not read back whole are skipped with a warning, and none reading
            back is an error; the directory is locked against a second run,
            and released on every way out). On SIGTERM it saves the step
            reached before the process ends (status 143; see `ciclo.loop`).
            A run restored with nothing left to train (the same finished run
            again, e.g. a notebook cell re-run) returns the restored state,
            history and elapsed, with a warning naming the directory and step.
            None or False: no checkpoint; start fresh.
        steps_per_call: run this many train steps per compiled call (see
            `ciclo.fuse`); default: what the train step declares, else 1.
        prefetch: the batches (fused calls) read and placed on the device with
            the state's strategy ahead of the train step, for a managed or Flax
            state (see `ciclo.loop`; 0: off; None: automatic). Read ahead within
            each pass, so epoch ends and data positions are as without it.

    Raises:
        ValueError: for an unknown named schedule, `test_dataset` with nothing on
            `on_test_step`, a bad `epoch_duration`, `epochs` or `test_every`.
        TypeError: for a `test_dataset` that is not a zero-argument callable, a bad
            `stop`, a callback that cannot register itself, or `epochs` with
            a dataset that can be read only once (a generator).

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

        Three passes over a list, testing every second epoch:

        >>> state, history, _ = ciclo.train_loop(
        ...     Counter(0), [1, 1], test_dataset=lambda: [0], epochs=3, test_every=2)
        >>> int(state), history.collect("steps", "seen_test")
        (6, ([3], [4.0]))
    """
    if resume is not None and resume is not False:  # orbax only when asked for
        from ciclo._checkpoint.checkpoint import resuming

        callbacks = resuming(as_list(callbacks), resume)
    check_prefetch(prefetch, "train_loop")
    named, ordinary = register(TRAIN, state, tasks, callbacks)
    groups = [*(tasks or {}).values(), *as_list(callbacks)]
    table = HookTable()  # the loop's: its hooks read once, resume and start run once
    with interrupt_scope():  # resuming, the read back included, ends as the loop
        started = False
        try:
            state, history, elapsed, start_at = prepare(
                table, groups, state, history, elapsed
            )
            if test_duration is not None and not isinstance(test_duration, Mapping):
                as_period(test_duration, "test_duration")
            check_epochs(epochs)
            start = elapsed if isinstance(elapsed, Elapsed) else Elapsed.create()
            stop_at = None if stop is None else as_period(stop, "stop")
            if epochs is not None and epoch_duration is not None:
                stop_at = epochs_end(
                    stop_at, as_period(epoch_duration, "epoch_duration"), epochs
                )
            if steps_per_call is None:
                train_callbacks = [*named[on_train_step], *(v for _, v in ordinary)]
                steps_per_call = declared_steps(train_callbacks, state) or 1
            check_steps(steps_per_call, "train_loop")
            _warn_off_boundary(epoch_duration, steps_per_call, start, stop_at)
            data = inputs(
                dataset, state=state, elapsed=elapsed, start_at=start_at,
                stop=stop_at, steps_per_call=steps_per_call, prefetch=prefetch,
                batch_size_fn=batch_size_fn, reread=True, epochs=epochs,
                epoch_duration=epoch_duration,
            )  # fmt: skip
            finite = epochs is None or epoch_duration is None  # data ends epochs
            epoch = EpochEnd(
                epoch_duration, stop_at, start, passes=finite,
                count_from=data.completed,
            )  # fmt: skip
            builtin: dict[str, list[Any]] = {}
            if test_dataset is not None:
                builtin[NESTED] = test_loops(
                    run_table, named, test_dataset, test_duration, test_name,
                    test_every, inner_loop_kwargs,
                    dict(metadata=metadata, batch_size_fn=batch_size_fn),
                )  # fmt: skip
            elif test_every is not None:
                raise ValueError(
                    "train_loop: `test_every` was given without `test_dataset`; "
                    "pass test_dataset=lambda: make_test_batches() too, or drop "
                    "`test_every`."
                )
            if epoch_logs is not False and epoch_logs is not None:
                aggregates = EpochLogs(epoch_logs)  # validates the spec
                builtin[EPOCH_SUM], builtin[EPOCH_LOGS] = (
                    [aggregates.add],
                    [aggregates.logs],
                )
            tasks, on_start, on_end = compile_table(
                TRAIN, named, ordinary, epoch, builtin
            )
            started = True  # from here on `loop` ends its own way
            with warnings.catch_warnings():  # said below, the train_loop way
                warnings.simplefilter("ignore", EmptyDataWarning)
                result = run_loop(
                    table, state, data, tasks, stop=stop_at, on_start=on_start,
                    on_end=on_end, history=history, elapsed=elapsed,
                    metadata=metadata,
                    catch_keyboard_interrupt=catch_keyboard_interrupt,
                    batch_size_fn=batch_size_fn,
                )  # fmt: skip
        except BaseException as error:
            if started:
                raise
            reached = elapsed if isinstance(elapsed, Elapsed) else Elapsed.create()
            history = history if isinstance(history, History) else History()
            abandon(table, groups, LoopState(state, None, reached, reached, history,
                                      Logs(), metadata), error)  # fmt: skip
            if isinstance(error, KeyboardInterrupt) and catch_keyboard_interrupt:
                return state, history, mark_counted(reached, "the loop returned")
            raise
    if start_at.source is not None and result[2].steps == start.steps:
        if data.empty or (stop_at is not None and stop_at.reached(start)):
            nothing_left("train_loop", start_at, start)  # (not a cut-short run)
    elif data.empty and not (stop_at is not None and stop_at.reached(start)):
        warn(
            f"train_loop: `dataset` yielded no batch (starting at step "
            f"{start.steps}), so nothing was trained. Check that it is not an "
            f"exhausted iterator or generator, or an empty list."
        )
    return result


def _warn_off_boundary(
    epoch_duration: Any, k: int, start: Elapsed, stop: Period | None
) -> None:
    """Epochs end at fused calls' boundaries (they are checked once per call): an
    `epoch_duration` in steps that is not a multiple of `k` is said up front,
    with the steps its first epochs end after."""
    if k == 1 or epoch_duration is None:
        return
    period = as_period(epoch_duration, "epoch_duration")
    n = period.steps
    if n is None or any(
        getattr(period, f) is not None for f in ("samples", "time", "date")
    ):
        return
    n = int(n)
    if n <= 0 or n % k == 0:
        return
    limit = None if stop is None or stop.steps is None else int(stop.steps)
    ends, at = [], int(start.steps)  # calls end at `start + j * k`
    while len(ends) < 3 and (limit is None or at < limit):
        multiple = (at // n + 1) * n  # the next epoch end in steps
        at += -(-(multiple - at) // k) * k  # the first call reaching it
        ends.append(at if limit is None else min(at, limit))
    warn(
        f"train_loop: epoch_duration={n} is not a multiple of steps_per_call={k}: "
        f"epochs end at call boundaries, after steps {', '.join(map(str, ends))}"
        f"{'' if limit is not None and ends[-1] == limit else ', ...'} (the "
        f"first call reaching each multiple of {n}), and so do the test loop and "
        f"`on_epoch_end`. Pick an epoch_duration that is a multiple of {k} (e.g. "
        f"{max(k, n - n % k)} or {n - n % k + k})."
    )
