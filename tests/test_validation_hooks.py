"""Validation hooks: train_loop's evaluation at the epoch ends fires the
`on_validation_*` named schedules (the test ones given to train_loop still run
there); test_loop fires only the test ones."""

from __future__ import annotations

import pytest

import ciclo

VALIDATION_NAMES = [
    "on_validation_begin", "on_validation_batch_begin", "on_validation_step",
    "on_validation_batch_end", "on_validation_end",
]  # fmt: skip


class Hooks:
    """A Lightning-style callback object with both validation and test hooks."""

    def __init__(self):
        self.events = []

    def on_validation_begin(self):
        self.events.append("validation_begin")

    def on_validation_batch_end(self, state, batch):
        self.events.append(("validation_batch_end", batch))

    def on_validation_end(self):
        self.events.append("validation_end")

    def on_test_begin(self):
        self.events.append("test_begin")

    def on_test_end(self):
        self.events.append("test_end")

    def on_epoch_end(self, state, batch, elapsed):
        self.events.append(("epoch_end", elapsed.steps))


def _train_step(state, batch):
    return state + 1


def _test_step(state, batch):
    return ciclo.logs().add_metric("seen", batch)


def test_names_are_exported_strings_with_an_alias():
    for name in VALIDATION_NAMES:
        assert getattr(ciclo, name) == name and name in ciclo.__all__
    events = []
    ciclo.train_loop(
        0, range(2), {"train_step": _train_step,
                      "validation_step": lambda s, batch: events.append(batch)},
        test_dataset=lambda: [7], epoch_duration=2,
    )  # fmt: skip
    assert events == [7]


def test_a_callback_object_tells_validation_from_a_final_test():
    hooks = Hooks()
    ciclo.train_loop(
        0,
        range(4),
        {ciclo.on_train_step: _train_step, ciclo.on_test_step: _test_step},
        callbacks=[hooks],
        test_dataset=lambda: [10, 11],
        epoch_duration=2,
    )
    validation = [
        "validation_begin",
        ("validation_batch_end", 10),
        ("validation_batch_end", 11),
        "validation_end",
    ]
    # twice, each before its epoch's on_epoch_end; the object's test hooks do not
    # run in train_loop
    assert hooks.events == [*validation, ("epoch_end", 1), *validation,
                            ("epoch_end", 3)]  # fmt: skip
    hooks.events.clear()
    ciclo.test_loop(0, [10, 11], {ciclo.on_test_step: _test_step}, callbacks=[hooks])
    assert hooks.events == ["test_begin", "test_end"]  # no validation hooks


def test_order_of_validation_and_test_hooks_given_as_tasks():
    tags = []

    def rec(name):
        return lambda: tags.append(name)

    names = [*VALIDATION_NAMES[:2], *VALIDATION_NAMES[3:],
             "on_test_begin", "on_test_batch_begin", "on_test_step",
             "on_test_batch_end", "on_test_end", "on_epoch_end"]  # fmt: skip
    tasks = {getattr(ciclo, name): rec(name) for name in names}
    ciclo.train_loop(
        0, [0, 0], {**tasks, ciclo.on_train_step: _train_step},
        test_dataset=lambda: range(2), epoch_duration=2,
    )  # fmt: skip
    batch = ["on_validation_batch_begin", "on_test_batch_begin", "on_test_step",
             "on_test_batch_end", "on_validation_batch_end"]  # fmt: skip
    # the test hooks given to train_loop still run in its evaluation (as before),
    # inside the validation ones
    assert tags == [
        "on_validation_begin", "on_test_begin", *batch, *batch, "on_test_end",
        "on_validation_end", "on_epoch_end",
    ]  # fmt: skip


def test_validation_step_replaces_test_step_in_validation_only():
    class State(int):
        def train_step(self, batch):
            return State(self + 1)

        def test_step(self, batch):
            return ciclo.logs().add_metric("from_test_step", 1.0)

        def validation_step(self, batch):
            return ciclo.logs().add_metric("from_validation_step", 2.0)

    _, history, _ = ciclo.train_loop(
        State(0), range(2), test_dataset=lambda: [0], epoch_duration=2
    )
    assert history.collect("from_validation_step_test") == [2.0]
    with pytest.raises(KeyError, match="never logged"):
        history.collect("from_test_step_test")
    _, history, _ = ciclo.test_loop(State(0), [0])
    assert history.collect("from_test_step") == [1.0]
    with pytest.raises(KeyError, match="never logged"):
        history.collect("from_validation_step")


def test_validation_hooks_run_per_test_set_and_behind_test_every():
    hooks = Hooks()
    ciclo.train_loop(
        0,
        range(6),
        {ciclo.on_train_step: _train_step, ciclo.on_test_step: _test_step},
        callbacks=[hooks],
        test_dataset={"val": lambda: [1], "holdout": lambda: [2]},
        epoch_duration=2,
        test_every=2,  # epochs 2 only (of 3)
    )
    assert [e for e in hooks.events if isinstance(e, tuple)] == [
        ("epoch_end", 1),
        ("validation_batch_end", 1),
        ("validation_batch_end", 2),
        ("epoch_end", 3),
        ("epoch_end", 5),
    ]
    assert hooks.events.count("validation_begin") == 2


def test_validation_names_are_errors_outside_train_loop():
    with pytest.raises(ValueError, match="belongs to train_loop"):
        ciclo.test_loop(
            0, [0], {ciclo.on_test_step: _test_step, ciclo.on_validation_end: print}
        )
    with pytest.raises(TypeError, match="runs once"):
        ciclo.train_loop(
            0, range(2),
            {ciclo.on_train_step: _train_step, ciclo.on_test_step: _test_step,
             ciclo.on_validation_end & ciclo.every(2): print},
            test_dataset=lambda: [0], epoch_duration=2,
        )  # fmt: skip
