"""Warnings about the user's code point at the user's line, not into ciclo (API.md
§6), however deep in ciclo they are raised; re-running a finished `resume=` run
says where it was restored from and how to start fresh (§11)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import ciclo


def _step(state, batch):
    return ciclo.logs().add_loss("loss", float(np.sum(state["w"]))), {
        "w": state["w"] + 1
    }


def _state():
    return {"w": np.zeros(2, np.float32)}


def _data(n=6):
    return [np.ones(2, np.float32)] * n


def caught(run):
    """The warnings `run()` raises (each once)."""
    with warnings.catch_warnings(record=True) as found:
        warnings.simplefilter("always")
        run()
    return found


def _empty_loop(tmp_path):
    ciclo.loop(_state(), [], {ciclo.every(1): _step})


def _empty_train_loop(tmp_path):
    ciclo.train_loop(_state(), [], {ciclo.on_train_step: _step})


def _empty_test_loop(tmp_path):
    ciclo.test_loop(_state(), [], {ciclo.on_test_step: _step})


def _exhausted_test_dataset(tmp_path):
    once = iter(_data(1))
    ciclo.train_loop(
        _state(), _data(4), {ciclo.on_train_step: _step, ciclo.on_test_step: _step},
        test_dataset=lambda: once, epoch_duration=2,
    )  # fmt: skip


def _callback_replacing_the_state(tmp_path):
    ciclo.loop(_state(), _data(2), {ciclo.every(1): lambda state: [1, 2]})


def _nan_guard_warns(tmp_path):
    def nan_step(state, batch):
        return ciclo.logs().add_loss("loss", float("nan")), state

    ciclo.loop(
        _state(), _data(3),
        {ciclo.every(1): [nan_step], **ciclo.nan_guard(action="warn")},
    )  # fmt: skip


def _skipped_batches_of_a_generator(tmp_path):
    ciclo.train_loop(_state(), _data(2), {ciclo.on_train_step: _step}, resume=tmp_path)
    ciclo.train_loop(
        _state(), (b for b in _data(4)), {ciclo.on_train_step: _step},
        resume=tmp_path,
    )  # fmt: skip


def _finished_train_loop_rerun(tmp_path):
    for _ in range(2):
        ciclo.train_loop(
            _state(), _data(3), {ciclo.on_train_step: _step}, epochs=2,
            resume=tmp_path,
        )  # fmt: skip


def _finished_loop_rerun(tmp_path):
    for _ in range(2):
        ckpt = ciclo.checkpoint(tmp_path, resume=True, async_save=False)
        ciclo.loop(_state(), _data(3), {ciclo.every(1): [_step, ckpt]})


CASES = [
    _empty_loop,
    _empty_train_loop,
    _empty_test_loop,
    _exhausted_test_dataset,
    _callback_replacing_the_state,
    _nan_guard_warns,
    _skipped_batches_of_a_generator,
    _finished_train_loop_rerun,
    _finished_loop_rerun,
]


@pytest.mark.parametrize("run", CASES, ids=[c.__name__.strip("_") for c in CASES])
def test_a_warning_points_at_the_users_line(run, tmp_path):
    found = caught(lambda: run(tmp_path))
    assert found, "expected a warning"
    for warning in found:
        assert warning.filename == __file__, (
            f"{warning.filename}:{warning.lineno}: {warning.message}"
        )


@pytest.mark.parametrize("stop", [None, 6])
def test_rerunning_a_finished_train_loop_says_it_was_restored(tmp_path, stop):
    directory = tmp_path / "ckpts"
    kwargs = dict(epochs=2) if stop is None else dict(stop=stop, epoch_duration=3)
    data = _data(3) if stop is None else _data(6)
    state, history, elapsed = ciclo.train_loop(
        _state(), data, {ciclo.on_train_step: _step}, resume=directory, **kwargs
    )
    assert elapsed.steps == 6
    edited = {"w": np.full(2, 100.0, np.float32)}  # e.g. a new learning rate
    with pytest.warns(UserWarning) as found:
        again, history_again, elapsed_again = ciclo.train_loop(
            edited, data, {ciclo.on_train_step: _step}, resume=directory, **kwargs
        )
    (warning,) = found
    message = str(warning.message)
    assert warning.filename == __file__
    assert f"restored from {str(directory)!r} at step 6" in message, message
    assert "nothing left to train" in message, message
    assert "new directory" in message and "resume=False" in message, message
    assert "exhausted" not in message, message
    # the restored run, as it was (the edited state is not used)
    assert elapsed_again.steps == 6
    np.testing.assert_array_equal(again["w"], state["w"])
    assert history_again.collect("loss") == history.collect("loss")


def test_resume_false_starts_fresh(tmp_path):
    ciclo.train_loop(_state(), _data(3), {ciclo.on_train_step: _step}, resume=tmp_path)
    state, _, elapsed = ciclo.train_loop(
        _state(), _data(3), {ciclo.on_train_step: _step}, resume=False
    )
    assert elapsed.steps == 3
    np.testing.assert_array_equal(state["w"], [3.0, 3.0])


def test_rerunning_a_finished_loop_with_a_resuming_checkpoint_says_so(tmp_path):
    for _ in range(2):
        ckpt = ciclo.checkpoint(tmp_path, resume=True, async_save=False)
        with warnings.catch_warnings(record=True) as found:
            warnings.simplefilter("always")
            _, _, elapsed = ciclo.loop(
                _state(), _data(3), {ciclo.every(1): [_step, ckpt]}
            )
    assert elapsed.steps == 3
    (warning,) = found
    assert f"ciclo.loop: restored from {str(tmp_path)!r} at step 3" in str(
        warning.message
    )


def test_resuming_with_an_edited_model_says_how_to_start_fresh(tmp_path):
    ciclo.train_loop(_state(), _data(3), {ciclo.on_train_step: _step}, resume=tmp_path)
    wider = {"w": np.zeros(3, np.float32)}  # the model edited since
    with pytest.raises(ValueError, match=r"shape differs") as raised:
        ciclo.train_loop(wider, _data(3), {ciclo.on_train_step: _step}, resume=tmp_path)
    note = " ".join(getattr(raised.value, "__notes__", []))
    assert str(tmp_path) in note and "resume=False" in note, note
