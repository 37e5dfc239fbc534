"""early_stopping (and the shared Monitor): patience, min_delta, mode, baseline,
restore_best_weights, in train_loop and by hand."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import ciclo


@dataclasses.dataclass
class State:
    n: int
    w: np.ndarray  # mutated in place: a restored best state must be a copy

    def train_step(self, batch):
        self.w += 1
        return State(self.n + 1, self.w)

    def test_step(self, batch):
        logs = ciclo.logs()
        logs.add_loss("loss", float((self.n - 6) ** 2), add_metric=True)
        return logs


def _train(es, **kwargs):
    return ciclo.train_loop(
        State(0, np.zeros(2)),
        range(100),
        callbacks=[es],
        test_dataset=lambda: [0],
        epoch_duration=2,
        **kwargs,
    )


def test_stops_and_restores_best_weights():
    # test loss after batches 2, 4, 6, 8, 10: 16, 4, 0 (best, after 6), 4, 16
    es = ciclo.early_stopping(
        "metrics.loss_test", patience=4, restore_best_weights=True
    )
    state, history, elapsed = _train(es)
    assert elapsed.steps == 10  # stopped at the epoch end 4 steps after the best
    # elapsed values count the batch just trained on (what the state consumed)
    assert es.best == 0.0 and es.best_elapsed.steps == 6
    assert es.stopped_elapsed.steps == 10
    assert state.n == 6
    np.testing.assert_array_equal(state.w, [6.0, 6.0])
    assert history.collect("metrics.loss_test")[-1] == 16.0

    es = ciclo.early_stopping("metrics.loss_test", patience=4)
    state, _, _ = _train(es)
    assert state.n == 10  # no restoring by default

    # the same object reused in another loop starts fresh (on_train_begin)
    state, _, elapsed = _train(es, stop=6)
    assert elapsed.steps == 6 and es.stopped_elapsed is None


def test_callbacks_after_it_still_run_in_the_stopping_batch():
    class Saver:  # e.g. ciclo.checkpoint, given after early_stopping
        def __init__(self):
            self.saved = []

        def on_epoch_end(self, state, batch, elapsed):
            self.saved.append((elapsed.steps, state.n))

    es = ciclo.early_stopping(
        "metrics.loss_test", patience=4, restore_best_weights=True
    )
    saver = Saver()
    state, _, elapsed = ciclo.train_loop(
        State(0, np.zeros(2)),
        range(100),
        callbacks=[es, saver],
        test_dataset=lambda: [0],
        epoch_duration=2,
    )
    assert elapsed.steps == 10
    # the saver ran in the stopping batch and saw the trained state, not the best
    assert saver.saved[-1] == (9, 10)
    assert state.n == 6  # the best state comes back at the end (on_train_end)


def test_baseline_patience_counts_from_the_loop_start():
    # test loss after batches 2, 4: 16, 4 — neither beats the baseline, so the
    # patience of 4 steps, counted from the loop start, ends after batch 4
    es = ciclo.early_stopping("metrics.loss_test", patience=4, baseline=3.5)
    _, _, elapsed = _train(es)
    assert elapsed.steps == 4 and es.stopped_elapsed.steps == 4
    assert es.best == 3.5 and es.best_elapsed.steps == 0


def test_baseline_patience_counts_from_the_loop_start_in_ciclo_loop():
    # as a task of ciclo.loop (no train_loop hooks): the value never beats the
    # baseline, so a patience of 4 steps from the loop start ends after batch 4
    # (Keras: 4 epochs without improvement), not 4 steps after the first check
    def step(state, batch):
        return ciclo.logs().add_metric("val", 5.0), state + 1

    es = ciclo.early_stopping("val", 4, baseline=1.0)
    state, _, elapsed = ciclo.loop(0, range(10), {ciclo.every(1): [step, es]})
    assert elapsed.steps == 4 and state == 4
    assert es.best_elapsed.steps == 0 and es.stopped_elapsed.steps == 4

    # resumed from step 10 (`elapsed=`): counted from where that loop starts
    es = ciclo.early_stopping("val", 4, baseline=1.0)
    _, _, elapsed = ciclo.loop(
        0, range(10), {ciclo.every(1): [step, es]},
        elapsed=ciclo.Elapsed.create(steps=10),
    )  # fmt: skip
    assert elapsed.steps == 14


def test_explicit_task_and_missing_metric_error():
    es = ciclo.early_stopping("metrics.loss_test", patience=0)
    _, _, elapsed = ciclo.train_loop(
        State(0, np.zeros(2)),
        range(100),
        {ciclo.on_epoch_end: es},
        test_dataset=lambda: [0],
        epoch_duration=2,
    )
    assert elapsed.steps == 8  # first non-improvement, after batch 8

    es = ciclo.early_stopping("accuracy_test", patience=2)
    with pytest.raises(ValueError, match="'accuracy_test' was not logged") as info:
        _train(es)
    assert "metrics.loss_test" in str(info.value)


def test_mode_max_min_delta_by_hand():
    es = ciclo.early_stopping("accuracy", patience=2, mode="max", min_delta=0.02)
    stops = []
    for step, value in enumerate([0.5, 0.6, 0.605, 0.61, 0.7]):
        logs = ciclo.logs()
        logs.add_metric("accuracy", np.float32(value))
        stop, state = es(ciclo.Elapsed.create(steps=step), "s", logs)
        assert state == "s"
        stops.append(stop)
    assert stops == [False, False, False, True, False]  # 0.7 improves again
    assert es.best == pytest.approx(0.7)


def test_baseline_and_period_patience():
    es = ciclo.early_stopping(
        "loss", patience=2, baseline=1.0, restore_best_weights=True
    )
    logs = ciclo.logs({"metrics": {"loss": 2.0}})
    results = [es(ciclo.Elapsed.create(steps=s), s, logs) for s in range(3)]
    assert results == [(False, 0), (False, 1), (True, 2)]  # nothing beat the baseline
    assert es.best == 1.0

    es = ciclo.early_stopping("loss", patience=ciclo.at(samples=20))
    for samples, loss, expected in [(0, 1.0, False), (10, 1.0, False), (20, 1.0, True)]:
        elapsed = ciclo.Elapsed.create(steps=samples, samples=samples)
        assert es(elapsed, None, {"metrics": {"loss": loss}})[0] is expected


def test_validation():
    with pytest.raises(ValueError, match="'min' .* or 'max'"):
        ciclo.early_stopping("loss", 1, mode="best")
    with pytest.raises(ValueError, match="min_delta"):
        ciclo.early_stopping("loss", 1, min_delta=-1)
    with pytest.raises(TypeError, match="patience"):
        ciclo.early_stopping("loss", 1.5)
    with pytest.raises(ValueError, match="date"):
        ciclo.early_stopping("loss", ciclo.at(date=1e9))
    with pytest.raises(TypeError, match="monitor"):
        ciclo.early_stopping(None, 1)
    with pytest.raises(TypeError, match="baseline"):
        ciclo.early_stopping("loss", 1, baseline="3")
    with pytest.raises(ValueError, match="min_delta"):
        ciclo.early_stopping("loss", 1, min_delta=float("nan"))


def test_numpy_numbers_are_accepted():
    es = ciclo.early_stopping(
        "loss", np.int64(2), min_delta=np.float32(0.5), baseline=np.float32(2.0)
    )
    stops = [
        es(ciclo.Elapsed.create(steps=step), None, {"metrics": {"loss": loss}})[0]
        for step, loss in enumerate([1.8, 1.0, 0.9, 0.8])
    ]
    # 1.8 does not beat the baseline by 0.5, 1.0 does; 0.9 and 0.8 do not beat 1.0
    assert stops == [False, False, False, True] and es.best == 1.0


def _resumable(values, callbacks, directory, stop):
    """A train_loop whose test loop logs `val_test` = values[step - 1] (and
    `other_test` its negation) at each one-step epoch, resuming from `directory`."""

    def train_step(state, batch):
        return ciclo.logs().add_loss("loss", 0.0), state + 1

    def test_step(state, batch):
        v = values[state - 1]
        return ciclo.logs().add_loss("val", v).add_metric("other", -v), state

    return ciclo.train_loop(
        0, lambda start: range(start, len(values)),
        {ciclo.on_train_step: train_step, ciclo.on_test_step: test_step},
        test_dataset=lambda: [0], epoch_duration=1, stop=stop,
        callbacks=callbacks, resume=directory,
    )  # fmt: skip


def test_a_resumed_run_stops_where_the_uninterrupted_one_does(tmp_path):
    """The checkpoint keeps early stopping's best value and where it was seen:
    stopped after step 4 and resumed, the run stops at step 5 as an
    uninterrupted one does (patience counted from step 3, not from the resume)."""
    values = [5.0, 4.0, 3.0] + [4.0] * 9

    def stops():
        return [ciclo.early_stopping("val_test", patience=2)]

    _, _, whole = _resumable(values, stops(), tmp_path / "whole", 12)
    assert whole.steps == 5
    _resumable(values, stops(), tmp_path / "cut", 4)
    state, history, resumed = _resumable(values, stops(), tmp_path / "cut", 12)
    assert (resumed.steps, state) == (5, 5)
    assert history.collect("steps") == list(range(5))


def test_a_best_state_from_before_a_resume_is_said_to_be_gone(tmp_path):
    """With `restore_best_weights`, the best state seen before a resume is not in
    the checkpoint (only its value): the stop returns the state it reached and
    says so, naming where the best state is kept."""
    values = [5.0, 4.0, 3.0] + [4.0] * 5

    def stops():
        return [ciclo.early_stopping("val_test", 2, restore_best_weights=True)]

    state, _, _ = _resumable(values, stops(), tmp_path / "whole", 8)
    assert state == 3  # the best state, uninterrupted
    _resumable(values, stops(), tmp_path / "cut", 4)
    with pytest.warns(UserWarning, match=r"seen at step 3, before the run was resumed"):
        state, _, elapsed = _resumable(values, stops(), tmp_path / "cut", 8)
    assert (state, elapsed.steps) == (5, 5)


def test_a_finished_early_stopped_run_run_again_trains_nothing(tmp_path):
    values = [5.0, 4.0, 3.0] + [4.0] * 9
    _, _, first = _resumable(
        values, [ciclo.early_stopping("val_test", patience=2)], tmp_path, 12
    )
    assert first.steps == 5
    with pytest.warns(UserWarning, match=r"had stopped early there.*nothing left"):
        state, history, again = _resumable(
            values, [ciclo.early_stopping("val_test", patience=2)], tmp_path, 12
        )
    assert (again.steps, state, len(history)) == (5, 5, 5)
    # a larger patience trains on, from the saved best (step 3)
    state, _, more = _resumable(
        values, [ciclo.early_stopping("val_test", patience=4)], tmp_path, 12
    )
    assert (more.steps, state) == (7, 7)


def test_two_early_stoppings_are_told_apart_by_monitor_not_order(tmp_path):
    values = [5.0, 4.0, 3.0] + [4.0] * 9  # `other_test` improves until step 3 too

    def both(order):
        stops = [
            ciclo.early_stopping("val_test", patience=2),
            ciclo.early_stopping("other_test", patience=3, mode="max"),
        ]
        return stops[::order]

    _, _, whole = _resumable(values, both(1), tmp_path / "whole", 12)
    _resumable(values, both(1), tmp_path / "cut", 4)
    _, _, resumed = _resumable(values, both(-1), tmp_path / "cut", 12)
    assert resumed.steps == whole.steps == 5
    # resumed with another monitor: nothing saved for it, it starts fresh (with
    # `val_test`'s best, 3.0, it would stop at once: -4 never beats it)
    _resumable(values, both(1)[:1], tmp_path / "other", 4)
    other = ciclo.early_stopping("other_test", patience=2, mode="max")
    _, _, fresh = _resumable(values, [other], tmp_path / "other", 12)
    assert fresh.steps == 7  # best -4 at step 5, patience 2
