"""train_loop's epochs: passes over re-iterable data, on_epoch_begin, test_every,
several test datasets, epoch aggregates, and named schedules composed with others."""

import jax.numpy as jnp
import numpy as np
import pytest

import ciclo


def train_step(state, batch):
    return ciclo.logs().add_loss("loss", batch).add_metric("seen", batch), state + batch


def eval_step(state, batch):
    return ciclo.logs().add_metric("acc", state + 0 * batch)


TASKS = {ciclo.on_train_step: train_step, ciclo.on_test_step: eval_step}


def recorder(name):
    def record(state, batch, elapsed):
        return ciclo.logs().add_metric(name, elapsed.steps)

    return record


def test_epochs_over_a_list_end_after_n_passes():
    tasks = {**TASKS, ciclo.on_epoch_end: recorder("end")}
    state, history, elapsed = ciclo.train_loop(0, [1, 2, 3], tasks, epochs=3)
    assert (state, elapsed.steps) == (18, 9)
    assert history.collect("end") == [2, 5, 8]


def test_epochs_with_a_zero_argument_factory_calls_it_each_epoch():
    calls = []

    def batches():
        calls.append(1)
        return iter([1, 1])

    tasks = {**TASKS, ciclo.on_epoch_end: recorder("end")}
    _, history, elapsed = ciclo.train_loop(0, batches, tasks, epochs=2)
    assert elapsed.steps == 4 and len(calls) == 2
    assert history.collect("end") == [1, 3]


def test_a_zero_argument_factory_without_epochs_is_one_pass():
    _, _, elapsed = ciclo.train_loop(0, lambda: [1, 2], TASKS)
    assert elapsed.steps == 2


def test_epochs_with_epoch_duration_repeat_the_data_and_stop_after_n_epochs():
    tasks = {**TASKS, ciclo.on_epoch_end: recorder("end")}
    _, history, elapsed = ciclo.train_loop(
        0, [1, 2, 3], tasks, epochs=3, epoch_duration=2
    )
    assert elapsed.steps == 6
    assert history.collect("end") == [1, 3, 5]


def test_stop_before_the_epochs_end_wins_and_ends_an_epoch():
    tasks = {**TASKS, ciclo.on_epoch_end: recorder("end")}
    _, history, elapsed = ciclo.train_loop(0, [1, 2, 3], tasks, epochs=5, stop=4)
    assert elapsed.steps == 4
    assert history.collect("end") == [2, 3]


def test_epochs_on_a_generator_is_a_clear_error():
    with pytest.raises(TypeError, match="read only once.*lambda: make_batches"):
        ciclo.train_loop(0, (b for b in [1, 2]), TASKS, epochs=2)
    with pytest.raises(ValueError, match="`epochs` must be an int >= 1"):
        ciclo.train_loop(0, [1], TASKS, epochs=0)
    with pytest.raises(TypeError, match="zero-argument factory"):
        ciclo.train_loop(0, lambda a, b: [1], TASKS, epochs=2)


def test_on_epoch_begin_runs_first_on_each_epochs_first_batch():
    order = []
    tasks = {
        ciclo.on_train_batch_begin: lambda: order.append("batch"),
        ciclo.on_epoch_begin: lambda state, batch, elapsed: order.append(
            f"begin@{elapsed.steps}"
        ),
        **TASKS,
    }
    ciclo.train_loop(0, [1, 2], tasks, epochs=2)
    assert order == ["begin@0", "batch", "batch", "begin@2", "batch", "batch"]
    assert ciclo.on_epoch_begin == "on_epoch_begin"


def test_on_epoch_begin_self_registers_on_callbacks():
    class Marker:
        def __init__(self):
            self.steps = []

        def on_epoch_begin(self, state, batch, elapsed):
            self.steps.append(elapsed.steps)

    marker = Marker()
    ciclo.train_loop(0, range(6), TASKS, callbacks=[marker], epoch_duration=2)
    assert marker.steps == [0, 2, 4]


def test_test_every_n_epochs():
    _, history, _ = ciclo.train_loop(
        0, [1, 1], TASKS, test_dataset=lambda: [0], epochs=5, test_every=2
    )
    assert history.collect("steps", "acc_test") == ([3, 7], [4.0, 8.0])


def test_test_every_a_schedule_is_checked_at_the_epoch_ends():
    _, history, _ = ciclo.train_loop(
        0, [1, 1], TASKS, test_dataset=lambda: [0], epochs=4,
        test_every=ciclo.after(4),
    )  # fmt: skip
    assert history.collect("steps") == list(range(8))
    # the schedule sees the count after the batch, as `on_epoch_end & after(4)`:
    # the epoch ends after 4, 6 and 8 steps (rows 3, 5, 7) test
    assert history.collect("steps", "acc_test")[0] == [3, 5, 7]


def test_test_every_errors():
    with pytest.raises(ValueError, match="without `test_dataset`"):
        ciclo.train_loop(0, [1], TASKS, test_every=2)
    with pytest.raises(TypeError, match="`test_every` must be an int"):
        ciclo.train_loop(0, [1], TASKS, test_dataset=lambda: [0], test_every="2")


def test_named_and_schedule_compose_both_ways():
    tasks = {
        **TASKS,
        ciclo.on_epoch_end & ciclo.every(4): recorder("a"),
        ciclo.after(5) & ciclo.on_epoch_end: recorder("b"),
        ciclo.on_train_step.every(3): recorder("c"),
    }
    _, history, _ = ciclo.train_loop(0, range(8), tasks, epoch_duration=2)
    # epoch ends after the 2nd, 4th, 6th and 8th batches (elapsed.steps 1, 3, 5, 7
    # before them); the gates see the count after the batch: 2, 4, 6, 8
    assert history.collect("a") == [3, 7]
    assert history.collect("b") == [5, 7]
    assert history.collect("c") == [2, 5]


def test_epoch_end_and_every_k_a_multiple_of_the_epoch_fires_at_those_epochs():
    def fired(k, n):
        seen = []
        tasks = {
            ciclo.on_train_step: lambda s, b: s,
            ciclo.on_epoch_end & ciclo.every(k): lambda s, b, e: seen.append(e.steps),
        }
        ciclo.train_loop(0, range(n), tasks, epoch_duration=4)
        return seen

    assert fired(4, 12) == [3, 7, 11]  # after the 4th, 8th and 12th batches
    assert fired(8, 16) == [7, 15]  # every second epoch
    assert fired(2, 8) == [3, 7]  # k divides the epoch: every epoch


def test_epoch_end_and_after_fires_from_the_epoch_that_reaches_it():
    seen = []
    tasks = {
        ciclo.on_train_step: lambda s, b: s,
        ciclo.on_epoch_end & ciclo.after(8): lambda s, b, e: seen.append(e.steps),
        ciclo.on_epoch_end & ciclo.after(9) & ciclo.every(2): lambda s, b, e: (
            seen.append(-e.steps)
        ),
    }
    ciclo.train_loop(0, range(16), tasks, epoch_duration=4)
    # the epoch ending after the 8th batch has done 8 steps: after(8) is reached
    assert seen == [7, 11, -11, 15, -15]


def test_gates_before_the_step_see_the_count_before_the_batch():
    seen = {"begin": [], "step": [], "batch_end": [], "plain": []}

    def record(name):
        return lambda s, b, e: seen[name].append(e.steps)

    tasks = {
        ciclo.on_train_step: lambda s, b: s,
        ciclo.on_epoch_begin & ciclo.every(4): record("begin"),
        ciclo.on_train_step & ciclo.every(3): record("step"),
        ciclo.every(3): record("plain"),
        ciclo.on_train_batch_end & ciclo.every(3): record("batch_end"),
    }
    ciclo.train_loop(0, range(8), tasks, epoch_duration=4)
    assert seen["begin"] == [0, 4]  # epochs begin at elapsed.steps 0 and 4
    assert seen["step"] == seen["plain"] == [0, 3, 6]  # as the ordinary schedule
    assert seen["batch_end"] == [2, 5]  # after the 3rd and 6th batches


def test_gated_callbacks_keep_their_place_in_the_order():
    order = []
    tasks = {
        ciclo.on_epoch_end: lambda: order.append("plain-1"),
        ciclo.on_epoch_end.every(1): lambda: order.append("gated"),
        **TASKS,
    }

    class Last:
        def on_epoch_end(self):
            order.append("callback")

    ciclo.train_loop(0, [1], tasks, callbacks=[Last()])
    assert order == ["plain-1", "gated", "callback"]


def test_named_schedules_reject_bad_operands_and_once_only_places():
    # `|` and `~` compose since API.md §5 made named schedules closed under them
    # (tests/test_schedules.py); a non-schedule operand and `every` of a place that
    # runs once are still errors
    with pytest.raises(TypeError, match="expected an ordinary schedule"):
        ciclo.on_epoch_end & 3
    with pytest.raises(ValueError, match="int >= 1"):
        ciclo.on_epoch_end.every(0)
    with pytest.raises(TypeError, match="runs once"):
        ciclo.train_loop(0, [1], {**TASKS, ciclo.on_train_end.every(2): ciclo.noop})


def test_several_test_datasets_with_their_durations():
    _, history, _ = ciclo.train_loop(
        0,
        [1, 1],
        TASKS,
        test_dataset={"val": lambda: [0, 0, 0], "holdout": lambda: [0]},
        test_duration={"val": 2},
        epochs=2,
    )
    assert history.collect("acc_val", "acc_holdout") == ([2.0, 4.0], [2.0, 4.0])
    counted = []
    ciclo.train_loop(
        0, [1], {**TASKS, ciclo.on_test_step: lambda: counted.append(1)},
        test_dataset={"val": lambda: [0, 0, 0], "holdout": lambda: [0]},
        test_duration={"val": 2},
    )  # fmt: skip
    assert len(counted) == 3  # 2 (bounded) + 1
    with pytest.raises(ValueError, match=r"names \['vall'\]"):
        ciclo.train_loop(
            0, [1], TASKS, test_dataset={"val": lambda: [0]}, test_duration={"vall": 1}
        )
    with pytest.raises(TypeError, match="`test_duration` is a dict"):
        ciclo.train_loop(
            0, [1], TASKS, test_dataset=lambda: [0], test_duration={"a": 1}
        )


def test_epoch_logs_are_the_epochs_batch_weighted_means_on_device():
    batches = [jnp.ones(2) * 1.0, jnp.ones(4) * 4.0, jnp.ones(2) * 2.0]

    def step(state, batch):
        return ciclo.logs().add_loss("loss", batch.mean()), state

    seen = []

    def check(state, batch, elapsed, loop_state):
        seen.append(type(loop_state.logs.losses.loss_epoch))

    _, history, _ = ciclo.train_loop(
        0, batches, {ciclo.on_train_step: step, ciclo.on_epoch_end: check},
        epochs=2, epoch_logs=True,
    )  # fmt: skip
    assert history.collect("steps", "loss_epoch") == ([2, 5], [2.75, 2.75])
    assert all(issubclass(t, jnp.ndarray) for t in seen)  # not fetched by the loop


def test_epoch_logs_are_monitorable_and_exclude_test_entries():
    _, history, _ = ciclo.train_loop(
        0, [1, 3], TASKS, test_dataset=lambda: [0], epochs=2, epoch_logs=True,
        callbacks=[ciclo.early_stopping("loss_epoch", patience=10)],
    )  # fmt: skip
    assert history.collect("seen_epoch") == [2.0, 2.0]
    assert "acc_test_epoch" not in str(history.to_dict())
    with pytest.raises(ValueError, match="epoch_logs: unknown aggregation 'yes'"):
        ciclo.train_loop(0, [1], TASKS, epoch_logs="yes")
    with pytest.raises(TypeError, match="epoch_logs"):
        ciclo.train_loop(0, [1], TASKS, epoch_logs=3)


def test_epochs_resume_skips_consumed_batches_across_passes(tmp_path):
    def run(epochs, stop=None):
        ckpt = ciclo.checkpoint(tmp_path, resume=True)
        return ciclo.train_loop(
            jnp.array(0), [1, 2, 3], TASKS, epochs=epochs, stop=stop,
            callbacks=[ckpt],
        )  # fmt: skip

    run(epochs=3, stop=4)  # saved after epoch 1 and at the stop (step 4)
    state, _, elapsed = run(epochs=3)
    assert (int(state), elapsed.steps) == (18, 9)
    np.testing.assert_equal(int(state), 3 * 6)


def test_each_epoch_makes_one_iterator_of_a_reiterable_dataset():
    """A loader makes one iterator per epoch, as in a plain `for` loop: a
    shuffled PyTorch DataLoader draws its seed (and starts its workers) at
    `iter()`, so an iterator made and dropped would change every epoch's order."""

    class Loader:
        def __init__(self):
            self.iterators = 0

        def __iter__(self):
            self.iterators += 1
            offset = 10 * self.iterators  # each iterator its own batches
            return iter([offset + 1, offset + 2])

    loader = Loader()
    _, history, _ = ciclo.train_loop(
        0, loader, {ciclo.on_train_step: train_step}, epochs=3
    )
    assert loader.iterators == 3
    assert history.collect("seen") == [11, 12, 21, 22, 31, 32]
