"""`train_loop`, `test_loop`, `predict_loop`: `ciclo.loop` with named schedules."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ciclo.callbacks.inner_loop import inner_loop
from ciclo.history import History
from ciclo.loops import builder
from ciclo.loops.epochs import EpochClock, lookahead
from ciclo.loops.named import PREDICT, TEST, TRAIN, LoopKind, on_test_step
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
    multiple of `epoch_duration` (in any of its fields). Without `epoch_duration`
    the epoch is the whole run: it ends when `stop` is reached, or, with no `stop`,
    after the dataset's last batch (then ciclo draws one batch ahead to know).

    Args:
        state: the initial state; its class's `train_step`, `test_step`,
            `reset_step`, `on_*` methods register themselves.
        dataset: any iterable of training batches.
        tasks: `{named_or_ordinary_schedule: callback_or_list}`.
        callbacks: objects registering their `on_*` attributes (keras_bar,
            checkpoint, early_stopping, ...).
        test_dataset: a zero-argument callable returning a fresh test iterable.
        epoch_duration: int steps or a `Period` (steps, samples, time).
        test_duration: how long each test loop runs (default: until exhausted).
        test_name: suffix of the test entries (`"accuracy_test"`).
        stop: end once `elapsed >= stop`.
        history, elapsed, catch_keyboard_interrupt, metadata, batch_size_fn: as in
            `ciclo.loop` (the test loop uses the same `metadata`/`batch_size_fn`).
        inner_loop_kwargs: for the test `ciclo.inner_loop`, e.g.
            `{"aggregation": "mean"}` (default `"last"`).

    Returns:
        `(state, history, elapsed)`.

    Raises:
        ValueError: for an unknown named schedule, or a `test_dataset` without any
            test step.
        TypeError: for a non-callable `test_dataset` or a callback that cannot
            register itself.

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
    clock = EpochClock(
        stop if epoch_duration is None else epoch_duration,
        "stop" if epoch_duration is None else "epoch_duration",
        batch_size_fn,
    )
    nested = []
    if test_dataset is not None:
        nested.append(
            _test_callback(
                registered,
                test_dataset,
                test_duration,
                test_name,
                metadata,
                batch_size_fn,
                inner_loop_kwargs,
            )
        )
    if stop is None:
        dataset = lookahead(dataset, clock)
    return builder.run(
        TRAIN,
        registered,
        state,
        dataset,
        epoch=clock,
        nested=nested,
        stop=stop,
        history=history,
        elapsed=elapsed,
        catch_keyboard_interrupt=catch_keyboard_interrupt,
        metadata=metadata,
        batch_size_fn=batch_size_fn,
    )


def _test_callback(
    registered: builder.Registered,
    test_dataset: Any,
    test_duration: Any,
    test_name: str,
    metadata: Any,
    batch_size_fn: Any,
    inner_loop_kwargs: Mapping[str, Any] | None,
) -> Any:
    """The epoch-end callback running the test loop through `inner_loop`."""
    if not callable(test_dataset):
        raise TypeError(
            f"train_loop: `test_dataset` must be a zero-argument callable returning "
            f"a fresh iterable each epoch, e.g. test_dataset=lambda: "
            f"make_test_batches(); got {type(test_dataset).__name__}."
        )
    if not registered.has(on_test_step):
        raise ValueError(
            "train_loop: `test_dataset` was given but nothing runs on "
            "`on_test_step`: give the state a `test_step` method, pass "
            "tasks={ciclo.on_test_step: [test_step]}, or a callback with "
            "`on_test_step`."
        )
    if test_duration is not None:
        as_period(test_duration, "test_duration")
    if inner_loop_kwargs is not None and not isinstance(inner_loop_kwargs, Mapping):
        raise TypeError(
            f"train_loop: `inner_loop_kwargs` must be a dict such as "
            f"{{'aggregation': 'mean'}}, got {type(inner_loop_kwargs).__name__}."
        )
    test_registered = registered.nested(TEST)

    def run_test(state: Any) -> tuple[Any, History, Elapsed]:
        return builder.run(
            TEST,
            test_registered,
            state,
            test_dataset(),
            stop=test_duration,
            catch_keyboard_interrupt=False,  # Ctrl-C must end the training loop
            metadata=metadata,
            batch_size_fn=batch_size_fn,
        )

    return inner_loop(test_name, run_test, **(inner_loop_kwargs or {}))


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
    `on_test_end` after the last batch. Registration as in `train_loop`.

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
    `on_predict_batch_end`; `on_predict_end` after the last batch.

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
