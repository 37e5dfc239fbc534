"""ciclo.iterate: train_loop as a generator of its epoch ends."""

import threading

import jax.numpy as jnp
import pytest

import ciclo


def train_step(state, batch):
    return ciclo.logs().add_loss("loss", batch), state + batch


def eval_step(state, batch):
    return ciclo.logs().add_metric("acc", state)


TASKS = {ciclo.on_train_step: train_step, ciclo.on_test_step: eval_step}


def test_yields_state_logs_elapsed_at_each_epoch_end():
    seen = [
        (state, float(logs.entry_value("acc_test")), elapsed.steps)
        for state, logs, elapsed in ciclo.iterate(
            0, [1, 2], TASKS, test_dataset=lambda: [0], epochs=3
        )
    ]
    assert seen == [(3, 3.0, 2), (6, 6.0, 4), (9, 9.0, 6)]


def test_the_return_value_is_train_loops():
    def run():
        return (yield from ciclo.iterate(0, [1, 2], TASKS, epochs=2))

    assert len(list(run())) == 2
    state, history, elapsed = _result(ciclo.iterate(0, [1, 2], TASKS, epochs=2))
    assert (state, elapsed.steps, len(history)) == (6, 4, 4)


def _result(generator):
    while True:
        try:
            next(generator)
        except StopIteration as stop:
            return stop.value


def test_break_ends_training_cleanly_and_runs_end_hooks():
    ended = []

    class Hooks:
        def on_train_batch_end(self, state, batch, elapsed):
            ended.append(("batch_end", elapsed.steps))

        def on_train_end(self):
            ended.append("train_end")

        def __loop_end__(self, loop_state):
            ended.append("hook")

    for _, _, elapsed in ciclo.iterate(
        0, [1, 1], TASKS, callbacks=[Hooks()], epochs=100
    ):
        if elapsed.steps == 4:
            break
    assert ended[-3:] == [("batch_end", 3), "train_end", "hook"]
    assert not [t for t in threading.enumerate() if t.name == "ciclo.iterate"]


def test_checkpoint_saves_finish_when_breaking(tmp_path):
    ckpt = ciclo.checkpoint(tmp_path)
    for _, _, elapsed in ciclo.iterate(
        jnp.array(0), [1, 1], TASKS, callbacks=[ckpt], epochs=10
    ):
        if elapsed.steps == 4:
            break
    state, restored = ciclo.restore(tmp_path, jnp.array(0))
    assert (int(state), restored.steps) == (4, 4)


def test_errors_of_the_loop_reach_the_caller():
    def failing(state, batch):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        list(ciclo.iterate(0, [1], {ciclo.on_train_step: failing}))
    with pytest.raises(TypeError, match="read only once"):
        next(ciclo.iterate(0, iter([1]), TASKS, epochs=2))


def test_an_exception_in_the_for_body_stops_the_loop():
    steps = []
    with pytest.raises(ValueError, match="user"):
        for _, _, elapsed in ciclo.iterate(
            0, [1], {**TASKS, ciclo.on_train_batch_end: lambda: steps.append(1)},
            epochs=100,
        ):  # fmt: skip
            if elapsed.steps == 2:
                raise ValueError("user")
    assert len(steps) == 2
