"""API.md §5 — Predefined loops and named schedules."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

import ciclo

TRAIN_NAMES = [
    "on_train_begin", "on_train_end", "on_train_batch_begin", "on_train_step",
    "on_train_batch_end", "on_epoch_end", "on_reset_step",
]  # fmt: skip
TEST_NAMES = [
    "on_test_begin", "on_test_end", "on_test_batch_begin", "on_test_step",
    "on_test_batch_end",
]  # fmt: skip
PREDICT_NAMES = [
    "on_predict_begin", "on_predict_end", "on_predict_batch_begin",
    "on_predict_step", "on_predict_batch_end",
]  # fmt: skip


def _metrics(**values):
    logs = ciclo.logs()
    for k, v in values.items():
        logs.add_metric(k, v)
    return logs


def _inc(state, batch):
    return state + 1


def test_named_schedules_are_exported_strings():
    for name in TRAIN_NAMES + TEST_NAMES + PREDICT_NAMES:
        value = getattr(ciclo, name)
        assert isinstance(value, str)
        assert value == name


# ------------------------------------------------------------------- order


def test_per_train_batch_order(recorder):
    def rec(name):
        return lambda: recorder(name)

    tasks = {getattr(ciclo, name): [rec(name)] for name in TRAIN_NAMES + TEST_NAMES}
    ciclo.train_loop(
        0,
        range(4),
        tasks,
        test_dataset=lambda: range(2),
        epoch_duration=2,
        stop=4,
    )
    seq = recorder.tags()
    test = [
        "on_test_begin",
        "on_test_batch_begin", "on_test_step", "on_test_batch_end",
        "on_test_batch_begin", "on_test_step", "on_test_batch_end",
        "on_test_end",
    ]  # fmt: skip
    plain = ["on_train_batch_begin", "on_train_step", "on_train_batch_end"]
    epoch_end = [
        "on_train_batch_begin",
        "on_train_step",
        *test,
        "on_epoch_end",
        "on_train_batch_end",
    ]
    expected = [
        "on_train_begin",
        *plain,
        *epoch_end,
        *plain,
        *epoch_end,
        "on_train_end",
    ]
    assert [t for t in seq if t != "on_reset_step"] == expected

    # reset steps run after the train step of an epoch-ending batch, before its test loop
    batches = []
    for t in seq:
        if t == "on_train_batch_begin":
            batches.append([])
        if batches:
            batches[-1].append(t)
    for i, b in enumerate(batches):
        if i in (1, 3):
            assert "on_reset_step" in b
            first_reset = b.index("on_reset_step")
            assert b.index("on_train_step") < first_reset < b.index("on_test_begin")
        else:
            assert "on_reset_step" not in b


def test_aliases_and_ordinary_schedules_mix(recorder):
    ciclo.train_loop(
        0,
        range(4),
        {
            "train_step": [
                lambda state, batch: (recorder("train", batch), state + 1)[1]
            ],
            ciclo.every(2): [lambda state, batch: recorder("every2", batch)],
            "reset_step": [lambda: recorder("reset")],
            "test_step": [lambda batch=None: recorder("test")],
        },
        test_dataset=lambda: range(1),
        epoch_duration=2,
        stop=4,
    )
    assert [v for t, v in recorder.events if t == "train"] == [0, 1, 2, 3]
    assert [v for t, v in recorder.events if t == "every2"] == [0, 2]
    assert recorder.tags().count("test") == 2
    assert recorder.tags().count("reset") >= 2


@pytest.mark.parametrize("epoch_duration", [3, ciclo.at(3)], ids=["int", "period"])
def test_epochs_end_after_batches_3_6_9_12_and_final_model_is_evaluated(epoch_duration):
    epoch_ends = []
    evaluated = []

    def on_epoch_end(state):
        epoch_ends.append(state)

    def test_step(state, batch):
        evaluated.append(state)

    state, _, elapsed = ciclo.train_loop(
        0,
        range(100),
        {
            ciclo.on_train_step: [_inc],
            ciclo.on_test_step: [test_step],
            ciclo.on_epoch_end: [on_epoch_end],
        },
        test_dataset=lambda: range(1),
        epoch_duration=epoch_duration,
        stop=12,
    )
    assert state == 12 and elapsed.steps == 12
    assert epoch_ends == [3, 6, 9, 12]
    assert evaluated == [3, 6, 9, 12]


# ------------------------------------------------------------------- test loop


def _test_step(state, batch):
    logs = ciclo.logs()
    logs.add_metric("acc", jnp.asarray(float(state)))
    return logs


@pytest.mark.parametrize("test_name", ["test", "val"])
def test_test_entries_are_suffixed_and_seen_by_on_epoch_end(test_name):
    seen = []

    def monitor(state, batch, elapsed, loop_state):
        seen.append(float(loop_state.logs.entry_value(f"acc_{test_name}")))

    _, history, _ = ciclo.train_loop(
        0,
        range(6),
        {
            ciclo.on_train_step: [_inc],
            ciclo.on_test_step: [_test_step],
            ciclo.on_epoch_end: [monitor],
        },
        test_dataset=lambda: range(2),
        epoch_duration=2,
        stop=6,
        test_name=test_name,
    )
    assert seen == [2.0, 4.0, 6.0]
    steps, acc = history.collect("steps", f"acc_{test_name}")
    assert [float(a) for a in acc] == [2.0, 4.0, 6.0]
    assert len(steps) == 3


def test_test_dataset_is_called_each_epoch_and_test_duration_limits_it():
    calls = []
    tested = []

    def test_dataset():
        calls.append(1)
        return iter(range(5))

    ciclo.train_loop(
        0,
        range(4),
        {
            ciclo.on_train_step: [_inc],
            ciclo.on_test_step: [lambda state, batch: tested.append(batch)],
        },
        test_dataset=test_dataset,
        epoch_duration=2,
        test_duration=2,
        stop=4,
    )
    assert len(calls) == 2
    assert tested == [0, 1, 0, 1]


_UNEVEN_TEST_BATCHES = [np.full(4, 1.0), np.full(4, 2.0), np.full(2, 10.0)]


def _uneven_test_run():
    def test_step(state, batch):
        logs = ciclo.logs()
        logs.add_loss("loss", jnp.mean(batch))
        logs.add_metric("m", jnp.mean(batch))
        logs.add_stateful_metric("s", jnp.asarray(batch[0]))
        return logs

    _, history, _ = ciclo.train_loop(
        0,
        range(1),
        {ciclo.on_train_step: [_inc], ciclo.on_test_step: [test_step]},
        test_dataset=lambda: _UNEVEN_TEST_BATCHES,
        stop=1,
        epoch_duration=1,
    )
    return history


def test_default_test_aggregation_is_weighted_mean_for_losses_and_metrics():
    history = _uneven_test_run()
    weighted = (
        4 * 1.0 + 4 * 2.0 + 2 * 10.0
    ) / 10  # 3.2 (mean of means: 4.33, last: 10)
    loss, m = history.collect("loss_test", "m_test")
    assert float(loss[0]) == pytest.approx(weighted)
    assert float(m[0]) == pytest.approx(weighted)


def test_default_test_aggregation_is_last_for_stateful_metrics():
    history = _uneven_test_run()
    (s,) = history.collect("s_test")
    assert float(s) == pytest.approx(10.0)


def test_unknown_named_schedule_raises_value_error_listing_valid_ones():
    with pytest.raises(ValueError) as info:
        ciclo.train_loop(0, range(3), {"on_trian_step": [_inc]}, stop=3)
    msg = str(info.value)
    assert "on_trian_step" in msg
    assert "on_train_step" in msg and "on_epoch_end" in msg


# ------------------------------------------------------------------- registration


def test_self_registration_order_method_then_tasks_then_callbacks():
    events = []

    class State(struct.PyTreeNode):
        n: int = 0

        def train_step(self, batch):
            events.append(("method", batch, self.n))
            return self.replace(n=self.n + 1)

        def reset_step(self):
            events.append(("reset", None, self.n))

    class CB:
        def on_train_step(self, state, batch):
            events.append(("callback", batch, state.n))

        def on_epoch_end(self, state):
            events.append(("epoch_end", None, state.n))

    def task(state, batch):
        events.append(("task", batch, state.n))

    state, _, _ = ciclo.train_loop(
        State(),
        range(2),
        {ciclo.on_train_step: [task]},
        callbacks=[CB()],
        epoch_duration=2,
        stop=2,
    )
    assert state.n == 2
    train = [e for e in events if e[0] in ("method", "task", "callback")]
    assert train == [
        ("method", 0, 0), ("task", 0, 1), ("callback", 0, 1),
        ("method", 1, 1), ("task", 1, 2), ("callback", 1, 2),
    ]  # fmt: skip
    assert ("reset", None, 2) in events
    assert [e for e in events if e[0] == "epoch_end"] == [("epoch_end", None, 2)]


def test_test_loop_and_predict_loop_with_state_methods():
    class State(struct.PyTreeNode):
        k: float = 2.0

        def test_step(self, batch):
            return _metrics(acc=jnp.asarray(self.k * batch))

        def predict_step(self, batch):
            logs = ciclo.logs()
            logs.add_output("preds", jnp.asarray(self.k * batch))
            return logs

    state, history, elapsed = ciclo.test_loop(State(), [1.0, 2.0, 3.0])
    assert elapsed.steps == 3
    assert [float(v) for v in history.collect("acc")] == [2.0, 4.0, 6.0]

    state, history, elapsed = ciclo.predict_loop(State(), [1.0, 2.0], stop=1)
    assert elapsed.steps == 1
    assert [float(v) for v in history.collect("preds")] == [2.0]


def test_test_loop_runs_reset_steps_at_its_start(recorder):
    class State(struct.PyTreeNode):
        def reset_step(self):
            recorder("reset")

        def test_step(self, batch):
            recorder("test", batch)

    ciclo.test_loop(State(), range(2))
    assert recorder.events == [("reset", None), ("test", 0), ("test", 1)]


def test_test_loop_callbacks_register_on_test_names(recorder):
    class CB:
        def on_test_batch_end(self, state, batch):
            recorder("end", batch)

    ciclo.test_loop(0, range(3), callbacks=[CB()])
    assert recorder.events == [("end", 0), ("end", 1), ("end", 2)]


# ------------------------------------------------------------------- stopping


def test_stop_iteration_in_train_loop_ends_after_the_current_callback(recorder):
    def stopper(state, batch, elapsed, loop_state):
        recorder("step", batch)
        if batch == 1:
            loop_state.stop_iteration = True
        return state + 1

    state, _, _ = ciclo.train_loop(
        0,
        range(10),
        {
            ciclo.on_train_step: [stopper],
            ciclo.on_train_batch_end: [
                lambda state, batch: recorder("batch_end", batch)
            ],
        },
    )
    assert [v for t, v in recorder.events if t == "step"] == [0, 1]
    assert [v for t, v in recorder.events if t == "batch_end"] == [0]


def test_stop_after_batch_in_train_loop_finishes_the_batch(recorder):
    def stopper(state, batch, elapsed, loop_state):
        recorder("step", batch)
        if batch == 1:
            loop_state.stop_after_batch()
        return state + 1

    state, _, _ = ciclo.train_loop(
        0,
        range(10),
        {
            ciclo.on_train_step: [stopper],
            ciclo.on_train_batch_end: [
                lambda state, batch: recorder("batch_end", batch)
            ],
            ciclo.on_train_end: [lambda: recorder("train_end")],
        },
    )
    assert state == 2
    assert [v for t, v in recorder.events if t == "step"] == [0, 1]
    assert [v for t, v in recorder.events if t == "batch_end"] == [0, 1]
    assert recorder.tags()[-1] == "train_end"
