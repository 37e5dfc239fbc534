"""`train_loop`, `test_loop`, `predict_loop`: `ciclo.loop` with named schedules."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ciclo.history import History
from ciclo.loops import builder
from ciclo.loops.epochs import EpochClock
from ciclo.loops.named import PREDICT, TEST, TRAIN, LoopKind
from ciclo.loops.nested import evaluation_callback
from ciclo.time import Elapsed, Period, as_period

__all__ = ["predict_loop", "test_loop", "train_loop"]

BatchSizeFn = Callable[[list[tuple[int, ...]]], int]


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
    batch_size_fn: BatchSizeFn | None = None,
    inner_loop_kwargs: Mapping[str, Any] | None = None,
) -> tuple[Any, History, Elapsed]:
    """Trains with named schedules, evaluating on `test_dataset` at each epoch end.

    Per batch: `on_train_batch_begin`, `on_train_step`, the ordinary schedules of
    `tasks` (in the order given), then — if the batch ended an epoch — the reset
    steps, the test loop and `on_epoch_end`, then `on_train_batch_end`.
    `on_train_begin` runs with the first batch before its tasks, `on_train_end`
    after the last. Each named schedule runs the state's method of that name (or
    alias) first, then the explicit `tasks`, then the `callbacks` that have an
    attribute of that name.

    An epoch ends after the batch that brings the elapsed counted after it to a
    multiple of `epoch_duration` (in any of its fields), and after the batch that
    ends the loop by reaching `stop` or exhausting the data, so a partial final
    epoch is evaluated too (to learn that a batch is the last, ciclo reads one
    batch ahead, only when the batch neither ended an epoch nor reached `stop`).
    Without `epoch_duration` the whole run is one epoch. A callback that sets
    `loop_state.stop_iteration` ends the loop at the end of the batch (the batch's
    other callbacks still run), without ending an epoch.

    Args:
        state: the initial state; its class's `train_step`, `test_step`,
            `reset_step`, `on_*` methods register themselves.
        dataset: any iterable of training batches.
        tasks: `{named_or_ordinary_schedule: callback_or_list}`.
        callbacks: objects registering their `on_train_*`, `on_epoch_end` and
            `on_reset_step` attributes (keras_bar, checkpoint, early_stopping,
            ...); they do not run in the test loop.
        test_dataset: a zero-argument callable returning a fresh test iterable.
        epoch_duration: int steps or a `Period` (steps, samples, time).
        test_duration: how long each test loop runs (default: until exhausted).
        test_name: suffix of the test entries (`"accuracy_test"`).
        stop: int steps or any `Period`; the loop ends after the batch whose
            elapsed counted after it reaches `stop` (none runs if the starting
            elapsed already has).
        history, elapsed, catch_keyboard_interrupt, metadata, batch_size_fn: as in
            `ciclo.loop` (the test loop uses the same `metadata`/`batch_size_fn`).
        inner_loop_kwargs: for the test `ciclo.inner_loop`, e.g.
            `{"aggregation": "mean"}` (default `"last"`).

    Returns:
        `(state, history, elapsed)`.

    Raises:
        ValueError: for an unknown named schedule, a `test_dataset` without any
            test step, or an `epoch_duration` with a `date` or a field <= 0.
        TypeError: for a `test_dataset` that is not a zero-argument callable (or
            returns something that is not iterable), a bad `stop` /
            `epoch_duration`, or a callback that cannot register itself.

    Example:
        >>> import ciclo
        >>> class Counter(int):
        ...     def train_step(self, batch):
        ...         return Counter(self + batch)
        ...     def test_step(self, batch):
        ...         logs = ciclo.logs()
        ...         logs.add_metric("seen", int(self))
        ...         return logs
        >>> state, history, _ = ciclo.train_loop(
        ...     Counter(0), [1] * 6, test_dataset=lambda: [0], epoch_duration=3)
        >>> int(state), history.collect("steps", "seen_test")
        (6, ([2, 5], [3, 6]))
    """
    registered = builder.collect(TRAIN, state, tasks, callbacks)
    clock = EpochClock(epoch_duration, stop, batch_size_fn)
    if test_duration is not None:
        as_period(test_duration, "test_duration")
    nested = []
    if test_dataset is not None:
        nested.append(
            evaluation_callback(
                registered,
                test_dataset,
                test_duration,
                test_name,
                metadata,
                batch_size_fn,
                inner_loop_kwargs,
            )
        )
    # The clock decides the stop (with the same reading that ends the last epoch),
    # so the loop itself gets no `stop`.
    return builder.run(
        TRAIN,
        registered,
        state,
        clock.wrap(dataset, elapsed),
        epoch=clock,
        nested=nested,
        history=history,
        elapsed=elapsed,
        catch_keyboard_interrupt=catch_keyboard_interrupt,
        metadata=metadata,
        batch_size_fn=batch_size_fn,
    )


def _simple_loop(kind: LoopKind, state, dataset, tasks, callbacks, **loop_kwargs):
    registered = builder.collect(kind, state, tasks, callbacks)
    return builder.run(kind, registered, state, dataset, **loop_kwargs)


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
    batch_size_fn: BatchSizeFn | None = None,
) -> tuple[Any, History, Elapsed]:
    """Evaluates: the reset steps and `on_test_begin` first, then per batch
    `on_test_batch_begin`, `on_test_step`, ordinary schedules, `on_test_batch_end`;
    `on_test_end` after the last batch. Registration, and a stop asked for by a
    callback (at the end of the batch), as in `train_loop`.

    Args:
        state: the state; its `test_step` / `reset_step` / `on_test_*` methods
            register themselves.
        dataset: any iterable of batches.
        tasks: `{named_or_ordinary_schedule: callback_or_list}`.
        callbacks: objects registering their `on_test_*` attributes.
        stop, history, elapsed, catch_keyboard_interrupt, metadata, batch_size_fn:
            as in `ciclo.loop`.

    Returns:
        `(state, history, elapsed)`.

    Example:
        >>> import ciclo
        >>> def test_step(state, batch):
        ...     logs = ciclo.logs()
        ...     logs.add_metric("double", 2 * batch)
        ...     return logs
        >>> _, history, _ = ciclo.test_loop(None, [1, 2], {ciclo.on_test_step: test_step})
        >>> history.collect("double")
        [2, 4]
    """
    return _simple_loop(
        TEST,
        state,
        dataset,
        tasks,
        callbacks,
        stop=stop,
        history=history,
        elapsed=elapsed,
        catch_keyboard_interrupt=catch_keyboard_interrupt,
        metadata=metadata,
        batch_size_fn=batch_size_fn,
    )


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
    batch_size_fn: BatchSizeFn | None = None,
) -> tuple[Any, History, Elapsed]:
    """Runs inference: `on_predict_begin` first, then per batch
    `on_predict_batch_begin`, `on_predict_step`, ordinary schedules,
    `on_predict_batch_end`; `on_predict_end` after the last batch. Registration,
    and a stop asked for by a callback (at the end of the batch), as in
    `train_loop`.

    Args:
        state: the state; its `predict_step` / `on_predict_*` methods register
            themselves.
        dataset: any iterable of batches.
        tasks: `{named_or_ordinary_schedule: callback_or_list}`.
        callbacks: objects registering their `on_predict_*` attributes.
        stop, history, elapsed, catch_keyboard_interrupt, metadata, batch_size_fn:
            as in `ciclo.loop`.

    Returns:
        `(state, history, elapsed)`; outputs logged with `logs.add_output` are in
        `history.collect("outputs.<name>")`.

    Example:
        >>> import ciclo
        >>> def predict_step(state, batch):
        ...     logs = ciclo.logs()
        ...     logs.add_output("y", state * batch)
        ...     return logs
        >>> _, history, _ = ciclo.predict_loop(3, [1, 2], {"predict_step": predict_step})
        >>> history.collect("y")
        [3, 6]
    """
    return _simple_loop(
        PREDICT,
        state,
        dataset,
        tasks,
        callbacks,
        stop=stop,
        history=history,
        elapsed=elapsed,
        catch_keyboard_interrupt=catch_keyboard_interrupt,
        metadata=metadata,
        batch_size_fn=batch_size_fn,
    )


test_loop.__test__ = False  # not a pytest test, even when imported into a test module
