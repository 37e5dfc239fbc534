"""Errors name the real culprit (API.md §3, §9, §11): a dataset that raises while
the epoch end reads ahead is reported as the dataset fetching that batch, with
the rows before it kept; a schedule that raises or returns a non-bool is named,
not the train step."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import ciclo


def train_step(state, batch):
    return ciclo.logs().add_loss("loss", jnp.float32(batch)), state + batch


def failing_at(n, start=0):
    for i in range(start, 20):
        if i == n:
            raise RuntimeError(f"cannot read batch {n}")
        yield jnp.float32(i)


def note(error):
    return " ".join(getattr(error, "__notes__", []))


@pytest.mark.parametrize("epoch_duration", [None, 5])
@pytest.mark.parametrize("how", ["resume", "checkpoint", "factory"])
def test_a_dataset_raising_is_named_with_its_batch_and_the_rows_before_are_kept(
    tmp_path, how, epoch_duration
):
    # with a checkpoint in the loop, the epoch end asks whether the pass is over,
    # reading batch 8 while step 7 runs
    dataset = failing_at(8)
    kwargs = {}
    if how == "resume":
        kwargs["resume"] = tmp_path
    elif how == "checkpoint":
        kwargs["callbacks"] = [ciclo.checkpoint(tmp_path)]
    else:
        kwargs["resume"] = tmp_path
        dataset = lambda start: failing_at(8, start)
    history = ciclo.history()
    with pytest.raises(RuntimeError, match="cannot read batch 8") as info:
        ciclo.train_loop(
            jnp.float32(0), dataset, {ciclo.on_train_step: train_step},
            epoch_duration=epoch_duration, history=history, **kwargs,
        )  # fmt: skip
    said = note(info.value)
    assert "raised by the dataset, fetching the batch of step 8" in said, said
    assert "train_step" not in said
    assert history.collect("steps") == list(range(8))  # row 7 kept


def sched(elapsed):
    raise ValueError("schedule failed")


def test_a_schedule_that_raises_is_named(tmp_path):
    for run in (
        lambda: ciclo.train_loop(
            jnp.float32(0), [jnp.float32(i) for i in range(5)],
            {ciclo.on_train_step: train_step, sched: ciclo.noop}, resume=tmp_path,
        ),
        lambda: ciclo.loop(
            jnp.float32(0), [jnp.float32(i) for i in range(5)],
            {ciclo.every(1): train_step, sched: ciclo.noop},
        ),
    ):  # fmt: skip
        with pytest.raises(ValueError, match="schedule failed") as info:
            run()
        said = note(info.value)
        assert "raised at step 0 by the schedule sched" in said, said
        assert "train_step" not in said


@pytest.mark.parametrize(
    "result",
    [jnp.array([True, False]), np.array([1.0]), jnp.float32(1.0), None],
    ids=["bool-array", "float-array", "float-scalar", "None"],
)
def test_a_schedule_that_returns_a_non_bool_is_named(result):
    def every_other(elapsed):
        return result

    with pytest.raises(TypeError, match=r"The schedule .*every_other returned") as info:
        ciclo.train_loop(
            jnp.float32(0), [jnp.float32(i) for i in range(5)],
            {ciclo.on_train_step: train_step, every_other: ciclo.noop},
        )  # fmt: skip
    assert "not a bool" in str(info.value)
    said = note(info.value)
    assert "by the schedule" in said and "train_step" not in said, said


def test_a_schedule_may_return_numpy_and_0d_bools():
    seen = []
    schedules = {
        (lambda e: np.bool_(e.steps % 2 == 0)): lambda: seen.append("np"),
        (lambda e: jnp.array(e.steps == 1)): lambda: seen.append("0d"),
        (lambda e: int(e.steps == 2)): lambda: seen.append("int"),
    }
    ciclo.loop(0, range(3), schedules)
    assert seen == ["np", "0d", "np", "int"]


def test_a_fused_batch_leaf_that_does_not_stack_is_named_not_the_dataset():
    """A string leaf cannot be stacked into a fused call: the error names the
    leaf and the fix, and the note blames the input stage, not the dataset
    (which yielded its batches without error)."""
    batches = [{"x": np.full(2, i, np.float32), "name": f"b{i}"} for i in range(6)]
    step = lambda state, batch: (ciclo.logs().add_loss("loss", 0.0), state)
    with pytest.raises(TypeError, match=r"batch\['name'\] holds str") as info:
        ciclo.loop(0, batches, {ciclo.every(1): step}, steps_per_call=2, stop=6)
    assert "without steps_per_call" in str(info.value)
    assert "by the input stage, stacking the batches of the fused call from step 0" in (
        note(info.value)
    )
    assert "dataset" not in note(info.value)


def test_a_plain_jitted_step_given_fused_steps_says_how_to_fuse_it():
    """`steps_per_call` hands every callback a `ciclo.Steps`: a plain jitted
    step taking arrays fails on it, and the note names the fix."""
    import jax

    @jax.jit
    def step(w, batch):
        return ciclo.logs().add_loss("loss", jnp.mean(batch * w)), w

    data = [np.ones((4, 2), np.float32)] * 8
    with pytest.raises(TypeError) as info:
        ciclo.train_loop(
            jnp.ones(2), data, {ciclo.on_train_step: step}, steps_per_call=4
        )
    assert "each callback gets a ciclo.Steps (4 batches" in note(info.value)
    assert "Wrap the step with managed.train_step" in note(info.value)


def test_a_flax_loss_that_raises_is_named_with_its_arguments_shapes():
    """A loss failing inside a Flax state's step (labels given as a column) is
    named, with the shapes it was called with, not only the step."""
    import optax
    from flax import nnx

    x, y = np.ones((16, 8), np.float32), np.zeros((16, 1), np.int32)
    state = ciclo.create_flax_state(
        nnx.Linear(8, 3, rngs=nnx.Rngs(0)), tx=optax.adam(1e-3),
        losses={"loss": optax.softmax_cross_entropy_with_integer_labels},
    )  # fmt: skip
    with pytest.raises(Exception) as info:
        ciclo.train_loop(state, [(x, y)] * 2, epochs=1)
    assert (
        "Raised by the loss 'loss' (softmax_cross_entropy_with_integer_labels), "
        "called with logits: shape (16, 3) float32, labels: shape (16, 1) int32."
    ) in note(info.value)
