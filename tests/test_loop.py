import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ciclo

ALWAYS = lambda elapsed: True


def _add(state, batch):
    logs = ciclo.logs()
    logs.add_metric("value", state + batch)
    return logs, state + batch


def test_schedules_in_dict_order_callbacks_in_list_order():
    calls = []

    def rec(name):
        def cb(state, batch, elapsed):
            calls.append((elapsed.steps, name))

        return cb

    ciclo.loop(
        None,
        range(4),
        {
            ciclo.every(2): [rec("a"), rec("b")],
            ALWAYS: rec("c"),
            ciclo.every(3): [rec("d")],
        },
    )
    assert calls == [
        (0, "a"), (0, "b"), (0, "c"), (0, "d"),
        (1, "c"),
        (2, "a"), (2, "b"), (2, "c"),
        (3, "c"), (3, "d"),
    ]  # fmt: skip


def test_arity_injection_for_functions_methods_objects_and_jit():
    seen = {}

    def zero():
        seen["zero"] = True

    def one(state):
        seen["one"] = state

    class Obj:
        def method(self, state, batch, elapsed):
            seen["method"] = (state, batch, elapsed.steps)

        def __call__(self, state, batch, elapsed, loop_state):
            seen["call"] = loop_state.metadata

    def with_default(state, batch, elapsed=None, loop_state=None, extra=None):
        seen["default"] = loop_state is not None

    def varargs(*args):
        seen["varargs"] = len(args)

    jitted = jax.jit(lambda state, batch: (None, state + batch))
    partial = functools.partial(
        lambda k, state, batch: seen.update(partial=(k, batch)), 7
    )
    obj = Obj()
    state, _, _ = ciclo.loop(
        jnp.int32(1),
        [2],
        {ALWAYS: [zero, one, obj.method, obj, with_default, varargs, partial, jitted]},
        metadata="meta",
    )
    assert seen["zero"] and seen["one"] == 1 and seen["method"][1:] == (2, 0)
    assert seen["call"] == "meta" and seen["default"] and seen["varargs"] == 4
    assert seen["partial"] == (7, 2)
    assert int(state) == 3


def test_return_conventions():
    def none(state, batch):
        return None

    def only_logs(state, batch):
        logs = ciclo.logs()
        logs.add_metric("m", 1)
        return logs

    def only_state(state, batch):
        return {"count": state["count"] + 1}

    def pair_none_state(state, batch):
        return None, {"count": state["count"] * 10}

    def pair_logs_none(state, batch):
        return ciclo.logs({"losses": {"l": 2}}), None

    state, history, _ = ciclo.loop(
        {"count": 0},
        [0],
        {ALWAYS: [none, only_logs, only_state, pair_none_state, pair_logs_none]},
    )
    assert state == {"count": 10}
    assert history[0].metrics.m == 1 and history[0].losses.l == 2


def test_tuple_state_is_returned_as_none_state_pair():
    state, _, _ = ciclo.loop((1, 2), [0], {ALWAYS: lambda s, b: (None, (s[1], s[0]))})
    assert state == (2, 1)


def test_bad_return_values_name_the_callback():
    def three(state, batch):
        return ciclo.logs(), state, 1

    with pytest.raises(TypeError, match="three returned a tuple of length 3"):
        ciclo.loop(0, [0], {ALWAYS: three})

    def pair(state, batch):
        return 5, state

    with pytest.raises(
        TypeError, match="pair returned a 2-tuple whose first element is a int"
    ):
        ciclo.loop(0, [0], {ALWAYS: pair})


def test_bad_tasks_are_rejected_before_anything_runs():
    ran = []
    good = lambda s, b: ran.append(1)
    with pytest.raises(
        TypeError, match="Task key 10 \\(int\\) is not a schedule.*every"
    ):
        ciclo.loop(0, [0], {ALWAYS: good, 10: good})
    with pytest.raises(TypeError, match="Task key 'on_train_step' is a string"):
        ciclo.loop(0, [0], {"on_train_step": good})
    with pytest.raises(
        TypeError, match=r"tasks\[.*\]\[1\] is 42 \(int\), which is not callable"
    ):
        ciclo.loop(0, [0], {ALWAYS: [good, 42]})
    with pytest.raises(TypeError, match="on_end\\[0\\] is 'x'"):
        ciclo.loop(0, [0], {ALWAYS: good}, on_end="x")
    with pytest.raises(TypeError, match="`stop` must be an int"):
        ciclo.loop(0, [0], {ALWAYS: good}, stop=2.5)
    with pytest.raises(TypeError, match="`tasks` must be a dict"):
        ciclo.loop(0, [0], [good])
    assert ran == []


def test_loop_callback_objects_and_loop_state():
    class Counter:
        def __loop_callback__(self, loop_state):
            logs = ciclo.logs()
            logs.add_metric("seen", len(loop_state.accumulated_logs.get("metrics", {})))
            assert loop_state.logs.metrics.value == loop_state.state
            return logs, loop_state.state

    _, history, _ = ciclo.loop(0, range(3), {ALWAYS: [_add, Counter()]})
    assert history.collect("seen") == [1, 2, 2]


def test_loop_elements_spread_with_double_star():
    calls = []

    class Element(ciclo.callbacks.LoopElement):
        def __call__(self, state, batch, elapsed):
            calls.append(elapsed.steps)

    tasks = {**Element(), ciclo.every(2): [lambda: calls.append("even")]}
    assert len(tasks) == 2
    ciclo.loop(None, range(3), tasks)
    assert calls == [0, "even", 1, 2, "even"]


def test_on_start_on_end_and_history_commit():
    events = []
    state, history, elapsed = ciclo.loop(
        0,
        range(1, 4),
        {ALWAYS: _add},
        on_start=lambda state, batch, elapsed: events.append(
            ("start", batch, elapsed.steps)
        ),
        on_end=[
            lambda state, batch, elapsed: events.append(("end", state, elapsed.steps))
        ],
    )
    assert events == [("start", 1, 0), ("end", 6, 3)]
    assert history.collect("steps", "value") == ([0, 1, 2], [1, 3, 6])
    samples, time = history.collect("samples", "time")
    assert samples == [0, 1, 2] and time == sorted(time)


def test_stop_and_exhaustion_and_stop_iteration():
    _, _, elapsed = ciclo.loop(0, range(100), {ALWAYS: _add}, stop=7)
    assert elapsed.steps == 7
    _, _, elapsed = ciclo.loop(0, range(4), {ALWAYS: _add}, stop=7)
    assert elapsed.steps == 4
    _, _, elapsed = ciclo.loop(
        0, [np.zeros((3, 1))] * 10, {ALWAYS: lambda: None}, stop=ciclo.at(samples=7)
    )
    assert (elapsed.steps, elapsed.samples) == (3, 9)

    after = []

    def stopper(state, batch, elapsed, loop_state):
        if elapsed.steps == 2:
            loop_state.stop_iteration = True

    state, history, elapsed = ciclo.loop(
        0, range(10), {ALWAYS: [_add, stopper, lambda b: after.append(1)]}
    )
    assert elapsed.steps == 3 and state == 0 + 1 + 2
    assert len(after) == 2  # the callback after the stopper did not run at step 2


def test_history_and_elapsed_continue_across_loops():
    state, history, elapsed = ciclo.loop(0, range(3), {ALWAYS: _add})
    state, history, elapsed = ciclo.loop(
        state, range(3, 5), {ALWAYS: _add}, history=history, elapsed=elapsed
    )
    assert history.collect("steps", "value") == ([0, 1, 2, 3, 4], [0, 1, 3, 6, 10])
    assert elapsed.steps == 5


def test_keyboard_interrupt_caught_or_propagated():
    ended = []

    class Closer:
        def __call__(self, state, batch):
            if batch == 3:
                raise KeyboardInterrupt
            return state + batch

        def __loop_end__(self, loop_state):
            ended.append(loop_state.elapsed.steps)

    state, history, elapsed = ciclo.loop(0, range(10), {ALWAYS: Closer()})
    assert (state, elapsed.steps) == (0 + 1 + 2, 3)
    assert ended == [3]
    with pytest.raises(KeyboardInterrupt):
        ciclo.loop(0, range(10), {ALWAYS: Closer()}, catch_keyboard_interrupt=False)
    assert ended == [3, 3]


def test_interrupt_after_the_state_changed_counts_the_batch():
    def train(state, batch):
        return state + batch

    def interrupt(state, batch):
        if batch == 3:
            raise KeyboardInterrupt

    state, history, elapsed = ciclo.loop(0, range(10), {ALWAYS: [train, interrupt]})
    assert (state, elapsed.steps) == (0 + 1 + 2 + 3, 4)


def test_loop_end_hook_runs_on_errors_too():
    ended = []

    class Failing:
        def __call__(self):
            raise RuntimeError("boom")

        def __loop_end__(self, loop_state):
            ended.append(True)

    with pytest.raises(RuntimeError, match="boom"):
        ciclo.loop(0, range(3), {ALWAYS: Failing()})
    assert ended == [True]


def test_one_schedule_object_in_two_loops_keeps_separate_state():
    schedule = ciclo.every(samples=4)
    data = [np.zeros((3, 1))] * 6  # samples before each batch: 0, 3, 6, 9, 12, 15
    fired = []
    ciclo.loop(
        None, data, {schedule: lambda s, b, elapsed: fired.append(elapsed.samples)}
    )
    first = list(fired)
    fired.clear()
    ciclo.loop(
        None, data, {schedule: lambda s, b, elapsed: fired.append(elapsed.samples)}
    )
    assert fired == first == [0, 6, 12]


def test_jitted_1000_step_loop_keeps_every_value():
    @jax.jit
    def train_step(state, batch):
        x, y = batch
        loss = jnp.mean((x @ state - y) ** 2)
        grad = jax.grad(lambda w: jnp.mean((x @ w - y) ** 2))(state)
        logs = ciclo.logs()
        logs.add_loss("loss", loss)
        return logs, state - 0.01 * grad

    rng = np.random.default_rng(0)
    data = [
        (
            rng.normal(size=(8, 3)).astype(np.float32),
            rng.normal(size=(8,)).astype(np.float32),
        )
        for _ in range(1000)
    ]
    w0 = jnp.zeros((3,), jnp.float32)
    state, history, elapsed = ciclo.loop(w0, data, {ciclo.every(1): [train_step]})
    losses = history.collect("loss")
    assert len(losses) == 1000 and elapsed.steps == 1000

    w, expected = w0, []
    for batch in data:
        logs, w = train_step(w, batch)
        expected.append(float(logs.losses.loss))
    np.testing.assert_allclose(losses, expected, rtol=1e-6)
    np.testing.assert_allclose(state, w, rtol=1e-6)


def test_bad_logs_shape_names_the_callback():
    def my_step(state, batch):
        return {"loss": 0.3}, state

    with pytest.raises(TypeError, match="my_step returned logs that are not a dict of"):
        ciclo.loop(0, [0], {ALWAYS: my_step})


def test_bad_history_elapsed_and_arity_fail_before_running():
    ran = []
    good = lambda s, b: ran.append(1)
    with pytest.raises(TypeError, match="`history` must be a ciclo.History"):
        ciclo.loop(0, [0], {ALWAYS: good}, history=[])
    with pytest.raises(TypeError, match="`elapsed` must be a ciclo.Elapsed"):
        ciclo.loop(0, [0], {ALWAYS: good}, elapsed=5)

    def five(state, batch, elapsed, loop_state, extra):
        pass

    with pytest.raises(TypeError, match="five\\) requires more arguments"):
        ciclo.loop(0, [0], {ALWAYS: [good, five]})
    assert ran == []


def test_on_start_runs_once_even_without_batches_and_can_stop():
    events = []
    with pytest.warns(UserWarning, match="yielded no batch"):
        ciclo.loop(
            0,
            [],
            {ALWAYS: lambda: events.append("task")},
            on_start=lambda: events.append("start"),
            on_end=lambda: events.append("end"),
        )
    assert events == ["start", "end"]

    def stop_at_start(state, batch, elapsed, loop_state):
        loop_state.stop_iteration = True

    _, _, elapsed = ciclo.loop(
        0, range(3), {ALWAYS: lambda: events.append("task")}, on_start=stop_at_start
    )
    assert elapsed.steps == 0 and events.count("task") == 0


def test_interrupt_after_commit_does_not_record_a_step_twice():
    def data():
        yield from range(3)
        raise KeyboardInterrupt  # after batch 2 was committed

    _, history, elapsed = ciclo.loop(0, data(), {ALWAYS: _add})
    assert history.collect("steps") == [0, 1, 2]
    assert elapsed.steps == 3


def test_a_callback_logs_object_is_never_changed_by_the_loop():
    # a callback returning the same Logs object every step, and a second callback
    # logging more: each row holds that step's entries only, and the first
    # callback's object keeps its single entry
    same = ciclo.logs().add_metric("constant", 1.0)

    def first(state, batch):
        return same

    def second(state, batch, elapsed):
        if elapsed.steps % 2:
            return ciclo.logs().add_metric("odd", float(elapsed.steps))

    _, history, _ = ciclo.loop(None, range(4), {ciclo.every(1): [first, second]})
    assert dict(same) == {"metrics": {"constant": 1.0}}
    assert history.collect("steps", "odd") == ([1, 3], [1.0, 3.0])
    assert history.collect("constant") == [1.0] * 4
    assert [sorted(row.metrics) for row in history] == [
        ["constant"],
        ["constant", "odd"],
        ["constant"],
        ["constant", "odd"],
    ]


def test_a_jitted_steps_logs_take_later_entries_row_by_row():
    # a jitted step's Logs is rebuilt at every call, so the loop may add the
    # entries of later callbacks to it: each row still holds that step's entries
    # only, the newest value of an entry logged twice winning
    @jax.jit
    def step(state, batch):
        return ciclo.logs().add_loss("loss", batch * 1.0), state + 1

    def odd(state, batch, elapsed):
        if elapsed.steps % 2:
            return (
                ciclo.logs()
                .add_metric("odd", float(elapsed.steps))
                .add_loss("loss", -1.0)
            )

    lr = ciclo.lr_monitor(schedule=lambda count: 0.5 / (1 + count))
    tasks = {ciclo.every(1): [step, lr, odd]}
    state, history, _ = ciclo.loop(jnp.int32(0), jnp.arange(4), tasks)
    assert int(state) == 4
    assert history.collect("loss") == [0.0, -1.0, 2.0, -1.0]
    assert history.collect("steps", "odd") == ([1, 3], [1.0, 3.0])
    assert history.collect("learning_rate") == pytest.approx(
        [0.5, 0.25, 0.5 / 3, 0.125]
    )
    assert [sorted(row.metrics) for row in history] == [
        ["learning_rate"],
        ["learning_rate", "odd"],
        ["learning_rate"],
        ["learning_rate", "odd"],
    ]


def test_end_hooks_see_the_error_the_loop_ends_with():
    seen = []

    class Hook:
        def __call__(self, state, batch):
            if batch == 2:
                raise RuntimeError("boom")

        def __loop_end__(self, loop_state):
            seen.append(loop_state.error)

    ciclo.loop(None, range(2), {ciclo.every(1): Hook()})
    assert seen == [None]
    with pytest.raises(RuntimeError, match="boom"):
        ciclo.loop(None, range(4), {ciclo.every(1): Hook()})
    assert isinstance(seen[-1], RuntimeError)


def test_accumulated_logs_hold_the_newest_value_of_every_entry_over_long_runs():
    """`loop_state.accumulated_logs`: the newest value of each entry ever logged,
    however many steps since it was logged (entries logged at different cadences,
    read at several points of a run longer than any internal batching)."""
    seen = []

    def step(state, batch):
        logs = ciclo.logs().add_metric("every", batch)
        if batch % 7 == 0:
            logs.add_metric("seventh", batch)
        if batch == 3:
            logs.add_loss("once", 3)
        return logs, state

    def read(state, batch, elapsed, loop_state):
        acc = loop_state.accumulated_logs
        metrics, losses = acc["metrics"], acc["losses"]
        seen.append((metrics["every"], metrics["seventh"], losses["once"]))

    def at_300s(elapsed):
        return elapsed.steps % 300 == 5

    ciclo.loop(None, range(1000), {ciclo.every(1): step, at_300s: read})
    expected = [(b, b - b % 7, 3) for b in range(1000) if b % 300 == 5]
    assert seen == expected


def test_accumulated_logs_of_steps_logging_the_same_entries_are_the_newest():
    seen = []

    def step(state, batch):
        if batch % 300 == 299:  # read below: the others' newest values
            return ciclo.logs().add_metric("x", batch), state
        return ciclo.logs().add_metric("m", batch).add_loss("loss", 2.0 * batch), state

    def read(state, batch, elapsed, loop_state):
        acc = loop_state.accumulated_logs
        seen.append((acc["metrics"]["m"], acc["losses"]["loss"], acc["metrics"]["x"]))

    def last_of_each_300(elapsed):
        return elapsed.steps % 300 == 299

    ciclo.loop(None, range(700), {ciclo.every(1): step, last_of_each_300: read})
    assert seen == [(298, 596.0, 299), (598, 1196.0, 599)]


def test_elapsed_after_counts_the_batch_and_the_next_elapsed_follows():
    seen = []

    def record(state, batch, elapsed, loop_state):
        after = loop_state.elapsed_after
        assert loop_state.elapsed_after is after  # one object per batch
        assert loop_state.elapsed is elapsed
        seen.append((elapsed, after))

    batches = [np.zeros((4, 2)), np.zeros((4, 2)), np.zeros((3, 2))]
    _, history, elapsed = ciclo.loop(
        None, batches, {ciclo.every(1): record}, stop=ciclo.at(samples=8)
    )
    assert [(e.steps, e.samples, a.steps, a.samples) for e, a in seen] == [
        (0, 0, 1, 4),
        (1, 4, 2, 8),
    ]
    for e, a in seen:  # both counted on one clock, the batch's after it started
        assert e.date <= a.date and a.time == pytest.approx(a.date - a.date_start)
    (_, first_after), (second, _) = seen
    assert second.steps == first_after.steps and second.date >= first_after.date
    # the loop stopped at `elapsed_after` reaching 8 samples, and returns that count
    assert (elapsed.steps, elapsed.samples) == (2, 8)
    assert elapsed.date >= seen[-1][1].date


def test_history_rows_hold_the_elapsed_callbacks_saw():
    seen = []

    def step(state, batch, elapsed):
        seen.append(elapsed)
        return ciclo.logs().add_metric("x", 1.0), state

    def quiet(state, batch):  # reads no elapsed: the loop need not build it
        return ciclo.logs().add_metric("y", 2.0), state

    batches = [np.zeros((2, 1))] * 5
    _, history, _ = ciclo.loop(
        None, batches, {ciclo.every(2): step, ciclo.every(1): quiet}
    )
    steps, samples, time, date = history.collect(
        "elapsed.steps", "elapsed.samples", "elapsed.time", "elapsed.date"
    )
    assert list(steps) == [0, 1, 2, 3, 4] and list(samples) == [0, 2, 4, 6, 8]
    assert [e.steps for e in seen] == [0, 2, 4]
    for e in seen:  # the very values the callback got
        i = e.steps
        assert (samples[i], time[i], date[i]) == (e.samples, e.time, e.date)
    assert np.all(np.diff(date) >= 0)
