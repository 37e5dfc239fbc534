"""train_loop / test_loop / predict_loop: named schedules, registration, epochs."""

from __future__ import annotations

import dataclasses
import importlib
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ciclo


def _recorder(events, name, logs=None):
    def callback(state, batch, elapsed):
        events.append((name, elapsed.steps))
        return logs

    return callback


@dataclasses.dataclass(frozen=True)
class Counter:
    """A plain state whose methods register themselves; `n` counts train steps."""

    n: int = 0
    resets: int = 0

    def train_step(self, batch):
        logs = ciclo.logs()
        logs.add_metric("n", self.n)
        return logs, dataclasses.replace(self, n=self.n + 1)

    def test_step(self, batch):
        logs = ciclo.logs()
        logs.add_metric("seen", self.n)  # the model the test loop evaluates
        logs.add_metric("batch", batch)
        return logs

    def reset_step(self):
        return dataclasses.replace(self, resets=self.resets + 1)


# -- named schedules -------------------------------------------------------------


def test_named_schedules_are_strings_with_aliases():
    assert ciclo.on_train_step == "on_train_step"
    assert ciclo.on_epoch_end == "on_epoch_end"
    events = []
    ciclo.train_loop(
        None,
        range(2),
        {"train_step": _recorder(events, "alias"), ciclo.on_train_step: None},
    )
    assert events == [("alias", 0), ("alias", 1)]


def test_order_within_a_batch():
    events = []
    tasks = {
        ciclo.on_train_batch_end: _recorder(events, "batch_end"),
        ciclo.every(2): _recorder(events, "every2"),
        ciclo.on_epoch_end: _recorder(events, "epoch_end"),
        ciclo.on_reset_step: _recorder(events, "reset"),
        ciclo.on_test_step: _recorder(events, "test_step"),
        ciclo.on_test_begin: _recorder(events, "test_begin"),
        ciclo.on_test_end: _recorder(events, "test_end"),
        ciclo.on_test_batch_begin: _recorder(events, "test_batch_begin"),
        ciclo.on_test_batch_end: _recorder(events, "test_batch_end"),
        ciclo.on_train_step: _recorder(events, "train_step"),
        ciclo.on_train_batch_begin: _recorder(events, "batch_begin"),
        ciclo.on_train_begin: _recorder(events, "train_begin"),
        ciclo.on_train_end: _recorder(events, "train_end"),
    }
    ciclo.train_loop(
        None, range(10), tasks, test_dataset=lambda: [0], epoch_duration=2, stop=2
    )
    names = [name for name, _ in events]
    assert names == [
        "train_begin",
        "batch_begin",
        "train_step",
        "every2",
        "batch_end",
        "batch_begin",
        "train_step",
        # epoch end: reset (once: the test loop does not reset again), the test
        # loop, on_epoch_end
        "reset",
        "test_begin",
        "test_batch_begin",
        "test_step",
        "test_batch_end",
        "test_end",
        "epoch_end",
        "batch_end",
        "train_end",
    ]


def test_unknown_named_schedule_lists_valid_ones():
    with pytest.raises(ValueError, match="on_trian_step") as info:
        ciclo.train_loop(None, range(2), {"on_trian_step": ciclo.noop})
    message = str(info.value)
    assert "'on_train_step'" in message and "on_epoch_end" in message
    assert "Did you mean 'on_train_step'" in message
    with pytest.raises(ValueError, match="belongs to predict_loop"):
        ciclo.test_loop(None, range(2), {ciclo.on_predict_step: ciclo.noop})
    with pytest.raises(ValueError, match="'train_step' belongs to train_loop"):
        ciclo.predict_loop(None, range(2), {"train_step": ciclo.noop})


# -- self-registration -----------------------------------------------------------


def test_state_methods_register_and_see_the_current_state():
    state, history, elapsed = ciclo.train_loop(
        Counter(), range(12), test_dataset=lambda: [7], epoch_duration=3, stop=12
    )
    assert state.n == 12 and elapsed.steps == 12
    # 4 evaluations, after batches 3, 6, 9 and 12: the last one sees the final model
    steps, seen = history.collect("steps", "seen_test")
    assert steps == [2, 5, 8, 11]
    assert seen == [3, 6, 9, 12]
    # reset_step at each epoch end (the test loop's own reset is not kept)
    assert state.resets == 4
    assert history.collect("n") == list(range(12))


def test_callback_objects_register_by_attribute():
    class Watcher:
        def __init__(self):
            self.events, self.ended = [], 0

        def on_train_batch_end(self, state, batch, elapsed):
            self.events.append(("batch_end", elapsed.steps))

        def on_epoch_end(self, state, batch, elapsed, loop_state):
            self.events.append(("epoch", loop_state.logs.entry_value("seen_test")))

        def __loop_end__(self, loop_state):
            self.ended += 1

    watcher = Watcher()
    ciclo.train_loop(
        Counter(),
        range(4),
        callbacks=[watcher],
        test_dataset=lambda: [0],
        epoch_duration=2,
    )
    assert watcher.events == [
        ("batch_end", 0),
        ("epoch", 2),  # the test entries are visible to on_epoch_end in the same step
        ("batch_end", 1),
        ("batch_end", 2),
        ("epoch", 4),
        ("batch_end", 3),
    ]
    assert watcher.ended == 1

    with pytest.raises(TypeError, match="no attribute named like a named schedule"):
        ciclo.train_loop(None, range(2), callbacks=[lambda: None])


def test_managed_step_as_state_method():
    import optax

    from ciclo import managed

    class State(managed.ManagedState):
        @managed.step
        def test_step(self, batch):
            logs = ciclo.logs()
            logs.add_metric("total", jnp.sum(self.params * batch))
            return logs, self

    state = State.create(params=jnp.ones(2), tx=optax.sgd(0.1), strategy="eager")
    _, history, _ = ciclo.test_loop(state, [jnp.ones(2), 2 * jnp.ones(2)])
    assert history.collect("total") == [2.0, 4.0]


def test_jitted_method_is_called_with_the_current_state():
    @jax.tree_util.register_dataclass
    @dataclasses.dataclass
    class State:
        w: jax.Array

        @jax.jit
        def train_step(self, batch):
            return State(self.w + batch)

    state, _, _ = ciclo.train_loop(State(jnp.zeros(())), [1.0, 2.0, 3.0])
    assert float(state.w) == 6.0


# -- epochs ----------------------------------------------------------------------


def _epoch_steps(**kwargs):
    events = []
    ciclo.train_loop(
        None,
        kwargs.pop("dataset"),
        {ciclo.on_epoch_end: _recorder(events, "e")},
        **kwargs,
    )
    return [steps for _, steps in events]


def test_epoch_duration_in_steps_samples_and_resume():
    assert _epoch_steps(dataset=range(12), epoch_duration=3, stop=12) == [2, 5, 8, 11]
    batches = [np.zeros(4)] * 6  # samples after each batch: 4 8 12 16 20 24
    by_samples = _epoch_steps(
        dataset=batches, epoch_duration=ciclo.at(samples=10), stop=ciclo.at(samples=20)
    )
    assert by_samples == [2, 4]
    # the batch reaching `stop` ends a (partial) epoch: the final model is evaluated
    by_samples = _epoch_steps(
        dataset=batches, epoch_duration=ciclo.at(samples=10), stop=6
    )
    assert by_samples == [2, 4, 5]
    # without `stop`, the dataset's last batch also ends a (partial) epoch
    assert _epoch_steps(dataset=batches, epoch_duration=ciclo.at(samples=10)) == [
        2,
        4,
        5,
    ]
    resumed = _epoch_steps(
        dataset=range(5),
        epoch_duration=3,
        elapsed=ciclo.Elapsed.create(steps=4),
        stop=9,
    )
    assert resumed == [5, 8]
    # no epoch_duration: the run is one epoch, ending at stop or exhaustion
    assert _epoch_steps(dataset=range(10), stop=4) == [3]
    assert _epoch_steps(dataset=range(5)) == [4]
    assert _epoch_steps(dataset=range(5), epoch_duration=2) == [1, 3, 4]
    with pytest.raises(ValueError, match="date"):
        _epoch_steps(dataset=range(2), epoch_duration=ciclo.at(date=1e9))


def test_test_dataset_is_fresh_each_epoch_with_test_duration():
    calls = []

    def test_dataset():
        calls.append(1)
        return iter(range(100))

    _, history, _ = ciclo.train_loop(
        Counter(),
        range(6),
        test_dataset=test_dataset,
        epoch_duration=2,
        test_duration=3,
    )
    assert len(calls) == 3
    # the default aggregation of a metric: the batch-size-weighted mean of 0, 1, 2
    assert history.collect("batch_test") == [1.0, 1.0, 1.0]


def test_inner_loop_kwargs_and_test_name():
    _, history, _ = ciclo.train_loop(
        Counter(),
        range(2),
        test_dataset=lambda: [1, 2, 3, 6],
        epoch_duration=2,
        test_name="valid",
        inner_loop_kwargs={"aggregation": "mean"},
    )
    assert history.collect("batch_valid") == [3.0]


def test_train_loop_errors():
    with pytest.raises(ValueError, match="on_test_step"):
        ciclo.train_loop(None, range(2), test_dataset=lambda: [0], epoch_duration=1)
    with pytest.raises(TypeError, match="zero-argument callable"):
        ciclo.train_loop(Counter(), range(2), test_dataset=[0], epoch_duration=1)
    with pytest.raises(TypeError, match="`tasks` must be a dict"):
        ciclo.train_loop(None, range(2), [ciclo.noop])
    # a test_dataset that needs arguments fails at construction, one returning a
    # non-iterable at the first epoch end, both naming it
    with pytest.raises(TypeError, match="cannot be called without arguments"):
        ciclo.train_loop(Counter(), range(2), test_dataset=lambda split: [0])
    with pytest.raises(TypeError, match=r"`test_dataset\(\)` returned None"):
        ciclo.train_loop(Counter(), range(2), test_dataset=lambda: None)
    with pytest.raises(TypeError, match="`stop`"):
        ciclo.train_loop(None, range(2), stop=2.5)
    with pytest.raises(TypeError, match="`test_duration`"):
        ciclo.train_loop(None, range(2), test_duration="all")


# -- when the loop ends ----------------------------------------------------------


@pytest.fixture
def clock(monkeypatch):
    """ciclo's wall clock, moved only by the test (`clock.now += seconds`)."""
    fake = types.SimpleNamespace(now=0.0)
    fake.time = lambda: fake.now
    monkeypatch.setattr(importlib.import_module("ciclo._time"), "_time", fake)
    return fake


def test_time_stop_ends_the_last_epoch(clock):
    def tick():  # each batch ends 1/16 s after its epoch check
        clock.now += 0.0625

    ends = []
    tasks = {
        ciclo.on_train_step: lambda state, batch: state + 1,
        ciclo.on_train_batch_end: tick,
        ciclo.on_epoch_end: _recorder(ends, "epoch"),
    }
    state, _, elapsed = ciclo.train_loop(
        0, iter(int, 1), tasks, stop=ciclo.at(time=0.375)
    )
    # the epoch check of the 7th batch reads 0.375 s: it ends the epoch AND the loop
    assert ends == [("epoch", 6)] and elapsed.steps == state == 7
    ends.clear()
    ciclo.train_loop(
        0,
        iter(int, 1),
        tasks,
        epoch_duration=ciclo.at(time=0.25),
        stop=ciclo.at(time=0.5),
    )
    assert ends == [("epoch", 4), ("epoch", 8)]


def test_stop_accepts_any_period_and_zero():
    data = iter(range(10))
    _, _, elapsed = ciclo.train_loop(0, data, stop=ciclo.at(steps=3, date=2e9))
    assert elapsed.steps == 3 and next(data) == 3  # nothing drawn beyond stop
    events = []
    tasks = {ciclo.on_train_begin: _recorder(events, "begin")}
    _, _, elapsed = ciclo.train_loop(0, data, tasks, stop=0)
    assert elapsed.steps == 0 and next(data) == 4 and events == [("begin", 0)]
    already = ciclo.at(date=time.time() - 1.0)
    _, _, elapsed = ciclo.train_loop(0, data, stop=already)
    assert elapsed.steps == 0 and next(data) == 5
    resumed = ciclo.Elapsed.create(steps=7)
    _, _, elapsed = ciclo.train_loop(0, data, elapsed=resumed, stop=7)
    assert elapsed.steps == 7 and next(data) == 6


def test_partial_final_epoch_is_evaluated_without_losing_batches(clock):
    # the data runs out before `stop`: the last batch ends the (partial) epoch
    _, history, _ = ciclo.train_loop(
        Counter(), range(5), test_dataset=lambda: [0], stop=10
    )
    assert history.collect("steps", "seen_test") == ([4], [5])
    # a shared iterator loses no batch to the read-ahead: not at an epoch end, not
    # at `stop` (steps or time)
    data = iter(range(100))
    run = dict(test_dataset=lambda: [0], epoch_duration=2)
    _, history, _ = ciclo.train_loop(Counter(), data, stop=3, **run)
    assert history.collect("seen_test") == [2, 3] and next(data) == 3

    def tick():
        clock.now += 1.0

    _, history, _ = ciclo.train_loop(
        Counter(),
        data,
        {ciclo.on_train_batch_end: tick},
        stop=ciclo.at(time=2),  # read at the epoch check of the 3rd batch
        **run,
    )
    assert history.collect("seen_test") == [2, 3] and next(data) == 7


def test_a_stop_request_takes_effect_at_the_end_of_the_batch():
    events = []

    def stop(state, batch, elapsed, loop_state):
        events.append(("stop", elapsed.steps))
        loop_state.stop_after_batch()

    data = iter(range(100))
    tasks = {
        ciclo.on_epoch_end: [stop, _recorder(events, "after")],
        ciclo.on_train_batch_end: _recorder(events, "batch_end"),
        ciclo.on_train_end: _recorder(events, "end"),
    }
    _, _, elapsed = ciclo.train_loop(None, data, tasks, epoch_duration=2)
    # the rest of the batch runs (the callbacks after it, on_train_batch_end)
    assert events == [
        ("batch_end", 0),
        ("stop", 1),
        ("after", 1),
        ("batch_end", 1),
        ("end", 2),
    ]
    assert elapsed.steps == 2 and next(data) == 2
    # asked for before the epoch check: the batch ends no epoch, nothing read ahead
    events.clear()
    tasks = {
        ciclo.on_train_step: stop,
        ciclo.on_epoch_end: _recorder(events, "epoch"),
        ciclo.on_train_batch_end: _recorder(events, "batch_end"),
    }
    _, _, elapsed = ciclo.train_loop(None, data, tasks)
    assert events == [("stop", 0), ("batch_end", 0)] and next(data) == 4
    # the same in test_loop
    events.clear()
    tasks = {
        ciclo.on_test_step: stop,
        ciclo.on_test_batch_end: _recorder(events, "batch_end"),
    }
    _, _, elapsed = ciclo.test_loop(None, range(5), tasks)
    assert events == [("stop", 0), ("batch_end", 0)] and elapsed.steps == 1


def test_stop_iteration_ends_the_loop_after_the_current_callback():
    events = []

    def stop(state, batch, elapsed, loop_state):
        events.append(("stop", elapsed.steps))
        loop_state.stop_iteration = True

    data = iter(range(100))
    tasks = {
        ciclo.on_epoch_end: [stop, _recorder(events, "after")],
        ciclo.on_train_batch_end: _recorder(events, "batch_end"),
        ciclo.on_train_end: _recorder(events, "end"),
    }
    _, _, elapsed = ciclo.train_loop(None, data, tasks, epoch_duration=2)
    # as in ciclo.loop: nothing else of the batch runs; the batch still counts
    assert events == [("batch_end", 0), ("stop", 1), ("end", 2)]
    assert elapsed.steps == 2 and next(data) == 2


def test_keyboard_interrupt_in_test_loop_ends_training():
    def test_step(state, batch):
        raise KeyboardInterrupt

    events = []
    state, _, elapsed = ciclo.train_loop(
        Counter(),
        range(10),
        {
            ciclo.on_test_step: test_step,
            ciclo.on_train_batch_end: _recorder(events, "e"),
        },
        test_dataset=lambda: [0],
        epoch_duration=2,
    )
    assert state.n == 2 and elapsed.steps == 2 and len(events) == 1


# -- test_loop / predict_loop ----------------------------------------------------


def test_test_loop_resets_first_and_predict_loop_outputs():
    state, history, _ = ciclo.test_loop(Counter(n=5), [1, 2])
    assert state.resets == 1 and history.collect("seen") == [5, 5]

    def predict_step(state, batch):
        logs = ciclo.logs()
        logs.add_output("y", 2 * batch)
        return logs

    events = []
    _, history, elapsed = ciclo.predict_loop(
        None,
        [1, 2, 3],
        {
            ciclo.on_predict_step: predict_step,
            ciclo.on_predict_begin: _recorder(events, "begin"),
            ciclo.on_predict_end: _recorder(events, "end"),
        },
        stop=2,
    )
    assert history.collect("y") == [2, 4] and elapsed.steps == 2
    assert events == [("begin", 0), ("end", 2)]
