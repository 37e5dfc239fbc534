"""checkpoint(items=...): part of the state; monitored checkpoints ranked only by
fresh values; the by-hand rule for an `elapsed` that already counts the batch."""

import logging

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.training.train_state import TrainState

import ciclo


def _state(w=1.0):
    params = {"w": jnp.full((2,), w)}
    return TrainState.create(apply_fn=None, params=params, tx=optax.adam(0.1))


def train_step(state, batch):
    grads = {"w": jnp.full((2,), float(batch))}
    return ciclo.logs().add_loss("loss", float(batch)), state.apply_gradients(
        grads=grads
    )


def test_items_saves_only_params_and_restores_into_a_target(tmp_path):
    ckpt = ciclo.checkpoint(tmp_path, items=["params"])
    trained, _, _ = ciclo.train_loop(
        _state(), [1, 2], {ciclo.on_train_step: train_step}, callbacks=[ckpt]
    )
    target = _state(w=0.0)
    restored, elapsed = ciclo.restore(tmp_path, target)
    np.testing.assert_allclose(restored.params["w"], trained.params["w"])
    assert int(restored.step) == 0  # not saved: the target's
    assert restored.opt_state is target.opt_state
    assert elapsed.steps == 2
    assert not (tmp_path / "2" / "state" / "opt_state").exists()
    raw, _ = ciclo.restore(tmp_path)  # no target: the saved dict
    assert set(raw) == {"params"}


def test_items_on_a_dict_state_and_errors(tmp_path):
    ckpt = ciclo.checkpoint(tmp_path, items="a", async_save=False)
    ckpt(ciclo.Elapsed.create(steps=0), {"a": jnp.ones(2), "b": jnp.ones(3)})
    state, _ = ckpt.restore({"a": jnp.zeros(2), "b": jnp.zeros(3)})
    assert state["a"].tolist() == [1.0, 1.0] and state["b"].tolist() == [0.0] * 3
    with pytest.raises(ValueError, match=r"has no field \['c'\]"):
        ciclo.checkpoint(tmp_path / "x", items=["c"])(
            ciclo.Elapsed.create(), {"a": 1.0}
        )
    with pytest.raises(TypeError, match="`items` must be a field name"):
        ciclo.checkpoint(tmp_path, items=[1])


def test_resume_with_items_keeps_a_fresh_optimizer_state(tmp_path):
    tasks = {ciclo.on_train_step: train_step}
    ciclo.train_loop(
        _state(), [1, 2, 3, 4], tasks, epoch_duration=2, stop=2,
        callbacks=[ciclo.checkpoint(tmp_path, items=["params"], resume=True)],
    )  # fmt: skip
    state, _, elapsed = ciclo.train_loop(
        _state(), [1, 2, 3, 4], tasks, epoch_duration=2,
        callbacks=[ciclo.checkpoint(tmp_path, items=["params"], resume=True)],
    )  # fmt: skip
    assert elapsed.steps == 4
    assert int(state.step) == 2  # the fresh target's step, plus the 2 new batches


def test_monitored_checkpoints_rank_only_fresh_values(tmp_path):
    scores = iter([0.9, 0.1])

    def eval_step(state, batch):
        return ciclo.logs().add_metric("score", next(scores))

    ckpt = ciclo.checkpoint(tmp_path, monitor="score_test", mode="max", keep=1)
    ciclo.train_loop(
        jnp.array(0), range(6), {ciclo.on_train_step: lambda s, b: s + b,
                                 ciclo.on_test_step: eval_step},
        test_dataset=lambda: [0], epoch_duration=1, test_every=3,
        callbacks=[ckpt],
    )  # fmt: skip
    # tested at epochs 3 (0.9) and 6 (0.1); epochs 4, 5 saw only the stale 0.9
    assert ckpt.best_step() == 3
    assert ckpt.steps() == [3, 6]  # the best, and the latest
    state, elapsed = ckpt.restore(jnp.array(0), best=True)
    assert elapsed.steps == 3


def test_stale_only_checkpoints_are_kept_as_latest_not_as_best(tmp_path):
    def eval_step(state, batch):
        return ciclo.logs().add_metric("score", 0.5)

    ckpt = ciclo.checkpoint(tmp_path, monitor="score_test", mode="max")
    ciclo.train_loop(
        jnp.array(0), range(4), {ciclo.on_train_step: lambda s, b: s + b,
                                 ciclo.on_test_step: eval_step},
        test_dataset=lambda: [0], epoch_duration=1, test_every=~ciclo.after(2),
        callbacks=[ckpt],
    )  # fmt: skip
    # tested only at the first epoch end (1 step done; after(2) not yet reached)
    assert ckpt.best_step() == 1 and ckpt.latest_step() == 4


def test_unranked_saves_do_not_make_orbax_warn(tmp_path, caplog):
    def train_step(state, batch):
        return {"w": state["w"] + batch}

    def test_step(state, batch):
        return ciclo.logs().add_metric("acc", state["w"])

    ckpt = ciclo.checkpoint(tmp_path, monitor="acc_test", mode="max", async_save=False)
    with caplog.at_level(logging.WARNING):
        ciclo.train_loop(
            {"w": jnp.zeros(())}, [1.0, 1.0],
            {ciclo.on_train_step: train_step, ciclo.on_test_step: test_step},
            test_dataset=lambda: [0], epochs=4, test_every=2, callbacks=[ckpt],
        )  # fmt: skip
    # epochs end at steps 2 (unranked), 4 (acc 4), 6 (unranked), 8 (acc 8)
    assert not [r for r in caplog.records if "tracked_metric" in r.getMessage()]
    assert ckpt.steps() == [8] and ckpt.best_step() == 8


def test_unranked_checkpoints_are_not_ranked_nor_kept_as_best(tmp_path):
    scores = iter([0.5, 0.7])

    def eval_step(state, batch):
        return ciclo.logs().add_metric("score", next(scores))

    ckpt = ciclo.checkpoint(tmp_path, monitor="score_test", mode="max", keep=2)
    ciclo.train_loop(
        jnp.array(0), range(7), {ciclo.on_train_step: lambda s, b: s + b,
                                 ciclo.on_test_step: eval_step},
        test_dataset=lambda: [0], epoch_duration=1, test_every=3,
        callbacks=[ckpt],
    )  # fmt: skip
    # tested at steps 3 (0.5) and 6 (0.7); 1, 2, 4, 5 and 7 are unranked
    assert ckpt.steps() == [3, 6, 7]  # the two best, and the latest
    assert ckpt.best_step() == 6
    _, elapsed = ciclo.restore(tmp_path, jnp.array(0), best=True)
    assert elapsed.steps == 6


@pytest.mark.parametrize("mode", ["min", "max"])
def test_ties_keep_the_earliest_best_as_keras_does(tmp_path, mode):
    # Keras' ModelCheckpoint(save_best_only) and Lightning keep the first of equal
    # best values (only a strict improvement replaces the best)
    values = [0.5, 0.9, 0.9, 0.9, 0.1] if mode == "max" else [0.5, 0.2, 0.2, 0.9]

    def step(state, batch, elapsed):
        return ciclo.logs().add_metric("score", values[elapsed.steps]), state + 1

    ckpt = ciclo.checkpoint(tmp_path, monitor="score", mode=mode, keep=1)
    ciclo.loop(jnp.array(0), range(len(values)), {ciclo.every(1): [step, ckpt]})
    # the first best is after batch 1: step 2; the latest is kept beside it
    assert ckpt.steps() == [2, len(values)]
    assert ckpt.best_step() == 2
    _, elapsed = ckpt.restore(jnp.array(0), best=True)
    assert elapsed.steps == 2


def test_a_tie_with_the_latest_keeps_the_earliest_as_best(tmp_path):
    def step(state, batch, elapsed):
        return ciclo.logs().add_metric("score", [0.3, 0.8, 0.8][elapsed.steps]), state

    ckpt = ciclo.checkpoint(tmp_path, monitor="score", mode="max", keep=1)
    ciclo.loop(jnp.array(0), range(3), {ciclo.every(1): [step, ckpt]})
    assert ckpt.steps() == [2, 3] and ckpt.best_step() == 2


def test_by_hand_consumed_records_the_loops_elapsed_as_is(tmp_path):
    ckpt = ciclo.checkpoint(tmp_path, async_save=False)
    state, history, elapsed = ciclo.train_loop(
        _state(), [1, 2, 3], {ciclo.on_train_step: train_step}
    )
    ckpt(elapsed, state, consumed=True, history=history)
    assert ckpt.latest_step() == 3
    pairs = list(ciclo.elapse([1, 2], initial=elapsed))
    step_elapsed, batch = pairs[-1]
    state = train_step(state, batch)[1]
    ckpt(step_elapsed, state, batch=[1])  # elapse's before-the-batch count: +1
    assert ckpt.latest_step() == 5
    with pytest.raises(ValueError, match="drop `batch=`"):
        ckpt(elapsed, state, consumed=True, batch=[1])
    with pytest.raises(TypeError, match="`consumed` must be True or False"):
        ckpt(elapsed, state, consumed="yes")
