"""What a checkpoint in a loop saves (API.md §11): the row of the saved step holds
every entry logged in that step (`lr_monitor` logs after an epoch-end save), and
with `nan_guard` in the loop a state whose logs are not finite never replaces the
last finite checkpoint."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import ciclo


def train_step(state, batch):
    w = state["w"] + batch
    return ciclo.logs().add_loss("loss", jnp.mean(w)), {"w": w}


def init():
    return {"w": jnp.ones(3)}


def batches(start=0, nan_at=None, n=16):
    return [jnp.float32(np.nan if i == nan_at else 0.125 * i) for i in range(start, n)]


def schedule(step):
    return 0.5 / (1.0 + step)


def run(directory, stop, **kwargs):
    return ciclo.train_loop(
        init(), lambda start: batches(start), {ciclo.on_train_step: train_step},
        callbacks=[ciclo.lr_monitor(schedule)], epoch_duration=4, stop=stop,
        resume=directory, **kwargs,
    )  # fmt: skip


# -- the row of the saved step -----------------------------------------------------------
def test_the_saved_row_holds_entries_logged_after_the_save(tmp_path):
    # lr_monitor runs on on_train_batch_end, after the on_epoch_end save
    _, first, _ = run(tmp_path, stop=8)  # saved at 4 and 8 (keep=1: 8)
    state, history, elapsed = run(tmp_path, stop=16)  # resumes at step 8
    assert elapsed.steps == 16
    steps, rates = history.collect("steps", "learning_rate")
    assert steps == list(range(16))  # no hole at the resume point (row 7)
    np.testing.assert_allclose(rates, [schedule(s) for s in range(16)], rtol=1e-6)
    assert history.collect("steps", "loss")[0] == list(range(16))
    _, straight, _ = run(None, stop=16)
    assert history.collect("learning_rate") == straight.collect("learning_rate")


def test_a_save_by_hand_still_saves_the_logs_given(tmp_path):
    history = ciclo.history()
    elapsed = ciclo.Elapsed.create()
    history.commit(elapsed, ciclo.logs().add_metric("m", 1.0))
    ckpt = ciclo.checkpoint(tmp_path, async_save=False)
    logs = ciclo.logs().add_metric("m", 2.0)
    ckpt(elapsed.update(1), init(), logs, history=history)
    ckpt.close()
    _, restored, _ = ciclo.train_loop(
        init(), lambda start: batches(start, n=3), {ciclo.on_train_step: train_step},
        resume=tmp_path,
    )  # fmt: skip
    assert restored.collect("steps", "m") == ([0, 1], [1.0, 2.0])


# -- nan_guard: no non-finite state replaces the last finite checkpoint -----------------
def guarded(directory, nan_at, **guard):
    return ciclo.train_loop(
        init(), lambda start: batches(start, nan_at), {ciclo.on_train_step: train_step},
        callbacks=[ciclo.nan_guard(**guard)], epoch_duration=4, resume=directory,
    )  # fmt: skip


@pytest.fixture
def device_behind(monkeypatch):
    """An accelerator running behind the host: no value is ever ready early, so
    the guard reads each one only when `max_lag` newer steps wait, or at the end."""
    monkeypatch.setattr(type(jnp.ones(1)), "is_ready", lambda self: False)


@pytest.mark.parametrize("max_lag", [8, 1])
def test_a_nan_in_an_epochs_last_batch_never_replaces_the_last_finite_checkpoint(
    tmp_path, device_behind, max_lag
):
    # keep=1: the epoch-end save of step 8 would replace step 4's; the guard,
    # reading lagged, learns of the NaN of step 7 after that save
    with pytest.raises(FloatingPointError, match="losses.loss is nan at step 7") as e:
        guarded(tmp_path, nan_at=7, max_lag=max_lag)
    notes = " ".join(e.value.__notes__)
    assert "checkpoint of step 8 (and any later) was not saved" in notes
    assert "keeps step 4, the last finite one" in notes
    assert_last_finite(tmp_path)


def test_a_nan_seen_in_its_own_step_never_replaces_the_last_finite_checkpoint(
    tmp_path,
):
    with pytest.raises(FloatingPointError, match="losses.loss is nan at step 7"):
        guarded(tmp_path, nan_at=7)
    assert_last_finite(tmp_path)


def assert_last_finite(tmp_path):
    state, elapsed = ciclo.restore(tmp_path, init())
    assert elapsed.steps == 4
    assert np.isfinite(np.asarray(state["w"])).all()
    expected, _, _ = ciclo.train_loop(
        init(), batches(0), {ciclo.on_train_step: train_step}, stop=4
    )
    np.testing.assert_array_equal(np.asarray(state["w"]), np.asarray(expected["w"]))
    # the same command resumes from that finite state (and meets the NaN again)
    with pytest.raises(FloatingPointError, match="at step 7"):
        guarded(tmp_path, nan_at=7)
    assert ciclo.restore(tmp_path, init())[1].steps == 4


def test_with_a_warning_guard_the_last_finite_checkpoint_is_kept_and_said(
    tmp_path, device_behind
):
    with pytest.warns(RuntimeWarning) as seen:
        _, _, elapsed = guarded(tmp_path, nan_at=7, action="warn")
    said = [str(w.message) for w in seen]
    assert any("losses.loss is nan at step 7" in m for m in said), said
    assert any("of step 8 (and any later) was not saved" in m for m in said), said
    assert any("keeps step 4, the last finite one" in m for m in said), said
    assert ciclo.restore(tmp_path, init())[1].steps == 4


def test_finite_runs_with_a_guard_save_every_epoch(tmp_path):
    ckpt = ciclo.checkpoint(tmp_path, keep=4)
    ciclo.train_loop(
        init(), lambda start: batches(start), {ciclo.on_train_step: train_step},
        callbacks=[ciclo.nan_guard(), ckpt], epoch_duration=4,
    )  # fmt: skip
    assert ckpt.steps() == [4, 8, 12, 16]
