"""train_loop / test_loop / predict_loop: named schedules, registration, epochs."""

from __future__ import annotations

import dataclasses

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
        # epoch end: reset, the test loop (which resets at its start), on_epoch_end
        "reset",
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
        dataset=batches, epoch_duration=ciclo.at(samples=10), stop=6
    )
    assert by_samples == [2, 4]
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
    assert history.collect("batch_test") == [2, 2, 2]  # "last" of batches 0, 1, 2


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
