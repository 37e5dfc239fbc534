"""API.md §3 — The loop language (``ciclo.loop``)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import ciclo

EVERY = ciclo.every(1)


def _metrics(**values):
    """Logs with the given metrics (no chaining: §4 tests that separately)."""
    logs = ciclo.logs()
    for k, v in values.items():
        logs.add_metric(k, v)
    return logs


def _inc(state, batch):
    return state + 1


# ------------------------------------------------------------------- order


def test_schedules_in_dict_order_callbacks_in_list_order(recorder):
    def rec(name):
        return lambda state, batch, elapsed: recorder(name, elapsed.steps)

    ciclo.loop(
        None,
        range(4),
        {
            ciclo.every(2): [rec("a"), rec("b")],
            ciclo.always(): rec("c"),  # a single callback, not a list
            ciclo.every(3): [rec("d")],
        },
    )
    assert recorder.events == [
        ("a", 0), ("b", 0), ("c", 0), ("d", 0),
        ("c", 1),
        ("a", 2), ("b", 2), ("c", 2),
        ("c", 3), ("d", 3),
    ]  # fmt: skip


def test_on_start_once_before_first_tasks_on_end_once_after_last(recorder):
    ciclo.loop(
        0,
        range(3),
        {EVERY: [lambda state, batch: recorder("task", batch)]},
        on_start=[lambda state, batch: recorder("start", batch)],
        on_end=[lambda state, batch: recorder("end", batch)],
    )
    tags = recorder.tags()
    assert tags.count("start") == 1 and tags.count("end") == 1
    assert tags[0] == "start" and tags[-1] == "end"
    assert [v for t, v in recorder.events if t == "task"] == [0, 1, 2]


# ------------------------------------------------------------------- arity


def test_callback_receives_first_n_of_state_batch_elapsed_loop_state():
    got = {}

    def f0():
        got[0] = ()

    def f1(state):
        got[1] = (state,)

    def f2(state, batch):
        got[2] = (state, batch)

    def f3(state, batch, elapsed):
        got[3] = (state, batch, elapsed.steps)

    def f4(state, batch, elapsed, loop_state):
        got[4] = (state, batch, elapsed.steps, loop_state.state, loop_state.batch)

    ciclo.loop("S", ["B"], {EVERY: [f0, f1, f2, f3, f4]})
    assert got == {
        0: (),
        1: ("S",),
        2: ("S", "B"),
        3: ("S", "B", 0),
        4: ("S", "B", 0, "S", "B"),
    }


def test_bound_methods_and_callable_objects_count_their_parameters():
    got = []

    class Obj:
        def method(self, state, batch):
            got.append(("method", state, batch))

        def __call__(self, state, batch, elapsed):
            got.append(("call", state, batch, elapsed.steps))

    class OneArg:
        def __call__(self, state):
            got.append(("one", state))

    o = Obj()
    ciclo.loop(10, [7], {EVERY: [o.method, o, OneArg()]})
    assert got == [("method", 10, 7), ("call", 10, 7, 0), ("one", 10)]


# ------------------------------------------------------------------- returns


def test_return_none_keeps_state_and_logs_nothing():
    state, history, _ = ciclo.loop(5, range(3), {EVERY: [lambda state: None]})
    assert state == 5
    assert len(history) == 0


def test_return_logs_is_merged_and_state_kept():
    def cb(state, batch):
        return _metrics(b=batch)

    state, history, _ = ciclo.loop(5, range(3), {EVERY: [cb]})
    assert state == 5
    assert history.collect("b") == [0, 1, 2]


def test_return_state_replaces_state():
    state, history, _ = ciclo.loop(0, range(3), {EVERY: [_inc]})
    assert state == 3
    assert len(history) == 0


def test_return_two_tuple_logs_and_state():
    def both(state, batch):
        return _metrics(s=state), state + 1

    def only_state(state, batch):
        return None, state * 10

    def only_logs(state, batch):
        return _metrics(t=batch), None

    state, history, _ = ciclo.loop(0, range(2), {EVERY: [both, only_state, only_logs]})
    # step 0: 0 -> 1 -> 10 ; step 1: 10 -> 11 -> 110
    assert state == 110
    assert history.collect("s", "t") == ([0, 10], [0, 1])


def test_two_tuple_with_falsy_state_replaces_state():
    # (None, 0): 0 is a state, not "no state"
    state, _, _ = ciclo.loop(5, range(1), {EVERY: [lambda state: (None, 0)]})
    assert state == 0


def test_loop_callback_protocol_object():
    class CB:
        def __loop_callback__(self, loop_state):
            return _metrics(seen=loop_state.batch), loop_state.state + 2

    state, history, _ = ciclo.loop(0, range(3), {EVERY: [CB()]})
    assert state == 6
    assert history.collect("seen") == [0, 1, 2]


def test_loop_element_spreads_into_task_dict():
    bar = ciclo.keras_bar(total=3)
    spread = {**bar}
    assert len(spread) == 1
    ((sched, callbacks),) = spread.items()
    assert all(sched(ciclo.Elapsed.create(steps=i)) for i in range(5))
    callbacks = callbacks if isinstance(callbacks, list) else [callbacks]
    assert callbacks == [bar]

    state, _, elapsed = ciclo.loop(
        0, range(3), {EVERY: [_inc], **ciclo.keras_bar(total=3)}
    )
    assert state == 3 and elapsed.steps == 3


# ------------------------------------------------------------------- loop_state


def test_loop_state_fields():
    seen = []

    def logger(state, batch):
        return _metrics(x=batch)

    def other(state, batch):
        if batch == 1:
            return _metrics(y=100)

    def inspect(state, batch, elapsed, loop_state):
        seen.append(
            dict(
                state=loop_state.state,
                batch=loop_state.batch,
                steps=loop_state.elapsed.steps,
                samples=loop_state.elapsed.samples,
                hist=len(loop_state.history),
                x=loop_state.logs.entry_value("x"),
                acc_y=(
                    loop_state.accumulated_logs.entry_value("y")
                    if "y" in loop_state.accumulated_logs.get("metrics", {})
                    else None
                ),
                meta=loop_state.metadata,
                stop=loop_state.stop_iteration,
            )
        )

    data = [float(i) for i in range(3)]
    ciclo.loop("S", data, {EVERY: [logger, other, inspect]}, metadata={"k": 1})
    assert [s["state"] for s in seen] == ["S"] * 3
    assert [s["batch"] for s in seen] == [0.0, 1.0, 2.0]
    assert [s["steps"] for s in seen] == [0, 1, 2]
    assert [s["samples"] for s in seen] == [0, 1, 2]
    assert [s["hist"] for s in seen] == [0, 1, 2]  # committed after each batch
    assert [s["x"] for s in seen] == [0.0, 1.0, 2.0]  # this step's logs
    assert [s["acc_y"] for s in seen] == [None, 100, 100]  # latest value seen so far
    assert all(s["meta"] == {"k": 1} for s in seen)
    assert not any(s["stop"] for s in seen)


def test_loop_state_logs_start_empty_each_step():
    sizes = []

    def first(state, batch, elapsed, loop_state):
        sizes.append(
            sum(len(v) for v in loop_state.logs.values() if hasattr(v, "__len__"))
        )
        return _metrics(m=batch)

    ciclo.loop(None, range(3), {EVERY: [first]})
    assert sizes == [0, 0, 0]


def test_loop_state_accumulated_logs_keeps_latest_value_per_entry():
    seen = []

    def log(state, batch):
        if batch == 0:
            return _metrics(a=10)
        if batch == 1:
            return _metrics(b=20)
        if batch == 2:
            return _metrics(a=30)

    def look(state, batch, elapsed, loop_state):
        acc = loop_state.accumulated_logs
        seen.append(
            (acc.entry_value("a"), acc.entry_value("b") if batch >= 1 else None)
        )

    ciclo.loop(None, range(4), {EVERY: [log, look]})
    assert seen == [(10, None), (10, 20), (30, 20), (30, 20)]


def test_loop_state_elapsed_after_counts_this_batch():
    seen = []

    def look(state, batch, elapsed, loop_state):
        seen.append(
            (
                loop_state.elapsed.steps,
                loop_state.elapsed_after.steps,
                loop_state.elapsed.samples,
                loop_state.elapsed_after.samples,
            )
        )

    ciclo.loop(None, [np.zeros(3)] * 3, {EVERY: [look]})
    assert seen == [(0, 1, 0, 3), (1, 2, 3, 6), (2, 3, 6, 9)]


def test_stop_iteration_ends_loop_after_the_current_callback(recorder):
    def stopper(state, batch, elapsed, loop_state):
        recorder("stopper", batch)
        if batch == 2:
            loop_state.stop_iteration = True

    def after(state, batch):
        recorder("after", batch)

    ciclo.loop(None, range(10), {EVERY: [stopper, after]})
    assert [v for t, v in recorder.events if t == "stopper"] == [0, 1, 2]
    assert [v for t, v in recorder.events if t == "after"] == [0, 1]


def test_stop_after_batch_ends_loop_at_the_end_of_the_current_batch(recorder):
    def stopper(state, batch, elapsed, loop_state):
        recorder("stopper", batch)
        if batch == 2:
            loop_state.stop_after_batch()

    def after(state, batch):
        recorder("after", batch)

    _, _, elapsed = ciclo.loop(
        None, range(10), {EVERY: [stopper], ciclo.always(): [after]}
    )
    assert [v for t, v in recorder.events if t == "stopper"] == [0, 1, 2]
    assert [v for t, v in recorder.events if t == "after"] == [0, 1, 2]
    assert elapsed.steps == 3


# ------------------------------------------------------------------- history


def test_history_commit_after_each_logging_batch_with_elapsed_collection():
    def log_even(state, batch):
        if batch % 2 == 0:
            return _metrics(v=batch * 10)

    data = [np.full((2,), i) for i in range(6)]

    def log_even_arr(state, batch):
        return log_even(state, int(batch[0]))

    _, history, _ = ciclo.loop(None, data, {EVERY: [log_even_arr]})
    assert len(history) == 3  # one per step that logged
    steps, samples, t, d, v = history.collect("steps", "samples", "time", "date", "v")
    assert steps == [0, 2, 4]
    assert samples == [0, 4, 8]
    assert v == [0, 20, 40]
    assert all(x >= 0 for x in t)
    assert d == sorted(d) and d[0] > 1e9
    assert history.collect("elapsed.steps") == [0, 2, 4]


# ------------------------------------------------------------------- stop


def test_stop_int_and_returned_elapsed():
    state, _, elapsed = ciclo.loop(0, range(100), {EVERY: [_inc]}, stop=3)
    assert state == 3
    assert elapsed.steps == 3


def test_stop_period():
    data = [np.zeros(2)] * 10
    state, _, elapsed = ciclo.loop(0, data, {EVERY: [_inc]}, stop=ciclo.at(samples=6))
    assert state == 3
    assert elapsed.samples == 6


def test_exhausted_dataset_ends_the_loop():
    state, _, elapsed = ciclo.loop(0, iter(range(4)), {EVERY: [_inc]})
    assert state == 4 and elapsed.steps == 4


def test_initial_elapsed_continues():
    init = ciclo.Elapsed.create(steps=10, samples=10)
    steps = []
    ciclo.loop(
        None, range(3), {EVERY: [lambda s, b, e: steps.append(e.steps)]}, elapsed=init
    )
    assert steps == [10, 11, 12]


def test_history_argument_is_extended():
    h = ciclo.history()
    log = lambda state, batch: _metrics(m=batch)
    _, h1, _ = ciclo.loop(None, range(2), {EVERY: [log]}, history=h)
    _, h2, _ = ciclo.loop(None, range(2, 4), {EVERY: [log]}, history=h1)
    assert h2.collect("m") == [0, 1, 2, 3]


def test_batch_size_fn_is_used_for_samples():
    _, _, elapsed = ciclo.loop(
        None, [np.zeros(3)] * 2, {EVERY: [ciclo.noop]}, batch_size_fn=lambda shapes: 5
    )
    assert elapsed.samples == 10


# ------------------------------------------------------------------- Ctrl-C


def _interrupt_at(n):
    def cb(state, batch):
        if batch == n:
            raise KeyboardInterrupt

    return cb


def _inc_and_log(state, batch):
    return _metrics(b=batch), state + 1


def test_keyboard_interrupt_ends_loop_cleanly():
    state, history, elapsed = ciclo.loop(
        0, range(10), {EVERY: [_interrupt_at(3), _inc_and_log]}
    )
    assert state == 3
    assert history.collect("b") == [0, 1, 2]
    assert elapsed.steps == 3


def test_keyboard_interrupt_propagates_when_not_caught():
    with pytest.raises(KeyboardInterrupt):
        ciclo.loop(
            0,
            range(10),
            {EVERY: [_interrupt_at(3), _inc_and_log]},
            catch_keyboard_interrupt=False,
        )


# ------------------------------------------------------------------- bad input


class _NotASchedule:
    def __repr__(self):
        return "<NotAScheduleXYZ>"


class _NotCallable:
    def __repr__(self):
        return "<NotCallableXYZ>"


def test_task_key_that_is_not_a_schedule_is_named():
    with pytest.raises((TypeError, ValueError), match="NotAScheduleXYZ"):
        ciclo.loop(0, range(3), {_NotASchedule(): [_inc]})


def test_callback_that_is_not_callable_is_named():
    with pytest.raises((TypeError, ValueError), match="NotCallableXYZ"):
        ciclo.loop(0, range(3), {EVERY: [_inc, _NotCallable()]})


def test_callback_returning_a_three_tuple_is_named():
    def three_tuple_callback(state, batch):
        return None, state, "extra"

    with pytest.raises((TypeError, ValueError), match="three_tuple_callback|extra"):
        ciclo.loop(0, range(3), {EVERY: [three_tuple_callback]})


def test_monitored_metric_that_never_appears_is_named():
    def step(state, batch):
        logs = ciclo.logs()
        logs.add_loss("loss", jnp.asarray(1.0))
        return logs

    es = ciclo.early_stopping("never_logged_metric_q", patience=2)
    with pytest.raises(ValueError, match="never_logged_metric_q"):
        ciclo.loop(0, range(5), {EVERY: [step, es]})
