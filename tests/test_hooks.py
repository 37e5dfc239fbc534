"""Loop hooks through the public API: an object among a loop's callbacks has each
of its hooks (`__loop_resume__`, `__loop_start__`, `__loop_end__`) run exactly
once per loop, under `ciclo.loop` and the predefined loops, with or without a
test loop or a resumed checkpoint; `__loop_callback__` once per firing."""

import collections

import numpy as np
import pytest

import ciclo


class Counting:
    """A user callback counting its hooks' calls, with what they received."""

    def __init__(self, restore=None):
        self.calls = collections.Counter()
        self.started_at = []
        self.restore = restore  # (state, history, elapsed) to resume from

    def __loop_resume__(self, state, history, elapsed):
        self.calls["resume"] += 1
        return self.restore

    def __loop_start__(self, elapsed):
        self.calls["start"] += 1
        self.started_at.append(None if elapsed is None else int(elapsed.steps))

    def __loop_callback__(self, loop_state):
        self.calls["callback"] += 1
        return None, None

    def __loop_end__(self, loop_state):
        self.calls["end"] += 1
        assert isinstance(loop_state, ciclo.LoopState)


def train_step(state, batch):
    return ciclo.logs().add_metric("x", float(batch)), state + batch


def eval_step(state, batch):
    return ciclo.logs().add_metric("y", float(batch))


def once_each(hooks, callbacks):
    return hooks.calls == {"resume": 1, "start": 1, "end": 1, "callback": callbacks}


def test_loop_runs_each_hook_once():
    hooks = Counting()
    ciclo.loop(0, range(4), {ciclo.every(1): [hooks]})
    assert once_each(hooks, 4), hooks.calls
    assert hooks.started_at == [None]


def test_an_object_in_several_places_of_one_loop_has_its_hooks_run_once():
    hooks = Counting()
    ciclo.loop(
        0, range(4), {ciclo.every(1): [hooks], ciclo.every(2): hooks},
        on_start=hooks, on_end=[hooks],
    )  # fmt: skip
    assert hooks.calls["resume"] == hooks.calls["start"] == hooks.calls["end"] == 1


@pytest.mark.parametrize("test_dataset", [None, lambda: [0, 0]])
def test_train_loop_runs_each_hook_once(test_dataset):
    hooks = Counting()
    ciclo.train_loop(
        0, range(6), {ciclo.on_train_step: train_step, ciclo.every(1): [hooks],
                      ciclo.on_test_step: eval_step},
        test_dataset=test_dataset, epoch_duration=3,
    )  # fmt: skip
    assert once_each(hooks, 6), hooks.calls
    assert hooks.started_at == [None]


def test_train_loop_callbacks_objects_run_each_hook_once():
    class Registering(Counting):
        def on_epoch_end(self, state, batch, elapsed):
            self.calls["epoch"] += 1

    hooks = Registering()
    ciclo.train_loop(
        0, range(6), {ciclo.on_train_step: train_step}, callbacks=[hooks],
        epoch_duration=3,
    )  # fmt: skip
    assert hooks.calls == {"resume": 1, "start": 1, "end": 1, "epoch": 2}, hooks.calls


def test_a_resume_hook_restoring_runs_once_and_start_sees_the_restored_step():
    restored = (100, ciclo.history(), ciclo.Elapsed.create(steps=2, samples=2))
    hooks = Counting(restore=restored)
    state, _, elapsed = ciclo.train_loop(
        0, lambda start: range(start, 6), {ciclo.on_train_step: train_step,
                                          ciclo.every(1): [hooks]},
    )  # fmt: skip
    assert once_each(hooks, 4), hooks.calls
    assert hooks.started_at == [2]
    assert (state, elapsed.steps) == (100 + 2 + 3 + 4 + 5, 6)


@pytest.mark.parametrize("test_dataset", [None, lambda: [0]])
def test_train_loop_with_resume_runs_each_hook_once(tmp_path, test_dataset):
    kwargs = dict(test_dataset=test_dataset, epoch_duration=2, resume=tmp_path)
    tasks = {ciclo.on_train_step: train_step, ciclo.on_test_step: eval_step}
    first = Counting()
    ciclo.train_loop(0, range(6), {**tasks, ciclo.every(1): first}, stop=4, **kwargs)
    assert once_each(first, 4), first.calls
    assert first.started_at == [None]

    second = Counting()
    state, history, elapsed = ciclo.train_loop(
        0, range(6), {**tasks, ciclo.every(1): second}, stop=6, **kwargs
    )
    assert once_each(second, 2), second.calls
    assert second.started_at == [4]  # told the restored step, once
    assert (state, elapsed.steps) == (sum(range(6)), 6)
    np.testing.assert_array_equal(history.collect("x"), [0, 1, 2, 3, 4, 5])


def test_a_checkpoints_resume_hook_is_asked_once_per_train_loop(tmp_path):
    tasks = {ciclo.on_train_step: train_step}
    ciclo.train_loop(0, range(6), tasks, stop=3, resume=tmp_path)
    checkpoint = ciclo.checkpoint(tmp_path, resume=True)
    asked = []
    resume = checkpoint.__loop_resume__

    def counted(*args):
        asked.append(args[2])
        return resume(*args)

    checkpoint.__loop_resume__ = counted
    state, _, elapsed = ciclo.train_loop(
        0, range(6), {**tasks, ciclo.on_test_step: eval_step},
        callbacks=[checkpoint], test_dataset=lambda: [0], epoch_duration=2,
    )  # fmt: skip
    assert asked == [None]  # once, before the loop: nothing restored yet
    assert (state, elapsed.steps) == (sum(range(6)), 6)


@pytest.mark.parametrize("loop", ["test_loop", "predict_loop"])
def test_evaluation_loops_run_each_hook_once(loop):
    hooks = Counting()
    getattr(ciclo, loop)(0, range(3), {ciclo.every(1): [hooks]})
    assert once_each(hooks, 3), hooks.calls


def test_iterate_runs_each_hook_once():
    hooks = Counting()
    for _ in ciclo.iterate(
        0, range(6), {ciclo.on_train_step: train_step, ciclo.every(1): [hooks]},
        epoch_duration=2,
    ):  # fmt: skip
        pass
    assert once_each(hooks, 6), hooks.calls


def test_a_hook_set_on_an_instance_is_read():
    class Plain:
        def __call__(self, state):
            return None

    plain, ended = Plain(), []
    plain.__loop_end__ = lambda loop_state: ended.append(loop_state.elapsed.steps)
    ciclo.loop(0, range(3), {ciclo.every(1): plain})
    assert ended == [3]


def test_a_resuming_checkpoint_restores_before_the_first_loop_only(tmp_path):
    # `resume=True` restores before the first loop the checkpoint is given to; a
    # second loop with the same checkpoint goes on from what it is given
    def add(state, batch):
        return state + batch

    ciclo.loop(0, range(3), {ciclo.every(1): [add, ciclo.checkpoint(tmp_path)]})
    checkpoint = ciclo.checkpoint(tmp_path, resume=True)
    tasks = {ciclo.every(1): [add, checkpoint]}
    state, _, elapsed = ciclo.loop(0, lambda start: range(start, 5), tasks)
    assert (state, elapsed.steps) == (sum(range(5)), 5)  # restored at step 3
    state, _, elapsed = ciclo.loop(
        1000, lambda start: range(start, 7), tasks, elapsed=elapsed
    )
    assert (state, elapsed.steps) == (1000 + 5 + 6, 7)  # not restored again


def test_a_subclass_overriding_an_observers_loop_call_has_its_output_applied():
    # ciclo's observers (lr_monitor, writers, bars) are called without looking
    # at an output; a subclass that overrides the call returns one, and it counts
    class Logged(ciclo.lr_monitor):
        def __loop_callback__(self, loop_state):
            return ciclo.logs().add_metric("seen", loop_state.elapsed.steps), None

    _, history, _ = ciclo.loop(
        None, range(3), {ciclo.every(1): Logged(schedule=lambda step: 0.1)}
    )
    assert history.collect("seen") == [0, 1, 2]
