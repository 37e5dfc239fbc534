"""Every public name is documented with a runnable example (the examples themselves
run under `pytest --doctest-modules ciclo`), and the surface is exactly API.md's."""

from __future__ import annotations

import inspect

import pytest

import ciclo
from ciclo import managed

NAMED_SCHEDULES = {n for n in ciclo.__all__ if n.startswith("on_")}
PUBLIC = [n for n in ciclo.__all__ if n not in NAMED_SCHEDULES]


def _doc(obj) -> str:
    return inspect.getdoc(obj) or ""


@pytest.mark.parametrize("name", PUBLIC)
def test_public_name_has_a_runnable_example(name):
    obj = getattr(ciclo, name)
    doc = _doc(obj)
    assert doc, f"ciclo.{name} has no docstring"
    assert ">>>" in doc, f"ciclo.{name}'s docstring has no runnable example"


@pytest.mark.parametrize("name", ["ManagedState", "train_step", "step"])
def test_managed_names_have_a_runnable_example(name):
    assert ">>>" in _doc(getattr(managed, name)), f"managed.{name}"


def test_loop_state_is_documented_with_an_example():
    doc = _doc(ciclo.LoopState)
    assert ">>>" in doc and "elapsed_after" in doc and "stop_after_batch" in doc


def test_named_schedules_are_their_own_names():
    for name in NAMED_SCHEDULES:
        assert getattr(ciclo, name) == name


def test_the_public_surface_is_the_contract():
    expected = {
        "Elapsed", "Period", "at", "elapse", "every", "after", "piecewise", "always",
        "never", "Schedule", "loop", "LoopState", "logs", "Logs", "history", "History",
        "train_loop", "test_loop", "predict_loop", "keras_bar", "tqdm_bar",
        "checkpoint", "restore", "early_stopping", "inner_loop", "noop", "callbacks",
        "tensorboard", "csv_logger", "jsonl_logger", "wandb_logger", "lr_monitor",
        "nan_guard", "profiler", "managed", "Strategy", "register_strategy",
        "get_strategy", "create_flax_state", "FlaxState", "inject", "sharded",
    }  # fmt: skip
    assert set(PUBLIC) >= expected, expected - set(PUBLIC)
    assert all(not n.startswith("_") for n in ciclo.__all__)
