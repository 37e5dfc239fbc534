"""checkpoint / restore on orbax-checkpoint: retention, round trip, resume, errors."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ciclo

TX = optax.adam(0.1)


def init_state():
    params = {"w": jnp.zeros((3,)), "b": jnp.zeros(())}
    return {"params": params, "opt_state": TX.init(params)}


@jax.jit
def train_step(state, batch):
    x, y = batch

    def loss_fn(params):
        return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(state["params"])
    updates, opt_state = TX.update(grads, state["opt_state"], state["params"])
    logs = ciclo.logs()
    logs.add_loss("loss", loss)
    new = {
        "params": optax.apply_updates(state["params"], updates),
        "opt_state": opt_state,
    }
    return logs, new


def data(n):
    rng = np.random.default_rng(0)
    out = []
    for _ in range(n):
        x = rng.normal(size=(4, 3)).astype(np.float32)
        out.append((x, x @ np.array([1.0, -2.0, 0.5], np.float32) + 0.3))
    return out


def assert_trees_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        assert np.asarray(x).dtype == np.asarray(y).dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def finished_steps(directory):
    """Step directories fully written (orbax writes to a tmp dir, then renames)."""
    names = os.listdir(directory)
    assert not [n for n in names if "tmp" in n], names
    return sorted(int(n) for n in names if n.isdigit())


def scored(values, name="score"):
    """A step that logs `values[i]` at step i as metric `name`."""

    def step(state, batch, elapsed):
        logs = ciclo.logs()
        logs.add_metric(name, values[elapsed.steps])
        return logs, {"x": jnp.asarray(elapsed.steps, jnp.int32)}

    return step


def test_round_trip_and_resume_neither_repeats_nor_skips(tmp_path):
    batches = data(6)
    ckpt = ciclo.checkpoint(tmp_path)
    state, _, elapsed = ciclo.loop(
        init_state(),
        batches,
        {ciclo.every(1): train_step, ciclo.every(2): ckpt},
        stop=3,
    )
    # saved after batches 0 and 2; keep=1 leaves the latest; finished on return
    assert finished_steps(tmp_path) == [3]
    restored, restored_elapsed = ciclo.restore(tmp_path, init_state())
    assert_trees_equal(restored, state)  # params, opt state (types and dtypes too)
    assert type(restored["opt_state"][0]) is type(state["opt_state"][0])
    assert (restored_elapsed.steps, restored_elapsed.samples) == (3, 12)
    assert 0 < restored_elapsed.time <= elapsed.time  # training time is kept

    resumed, _, resumed_elapsed = ciclo.train_loop(
        restored,
        batches[restored_elapsed.steps :],
        {ciclo.on_train_step: train_step},
        elapsed=restored_elapsed,
        stop=6,
    )
    straight, _, _ = ciclo.loop(init_state(), batches, {ciclo.every(1): train_step})
    assert resumed_elapsed.steps == 6
    assert_trees_equal(resumed, straight)


def test_keep_best_by_monitor_and_always_the_latest(tmp_path):
    values = [0.5, 0.9, 0.7, 0.1, 0.2]
    ckpt = ciclo.checkpoint(tmp_path, monitor="score", mode="max", keep=2)
    ciclo.loop({"x": jnp.int32(0)}, range(5), {ciclo.every(1): [scored(values), ckpt]})
    # best two: 0.9 (after batch 1 -> step 2), 0.7 (step 3); latest: step 5
    assert finished_steps(tmp_path) == [2, 3, 5]
    assert ckpt.best_step() == 2 and ckpt.latest_step() == 5
    target = {"x": jnp.int32(0)}
    state, elapsed = ciclo.restore(tmp_path, target, best=True)
    assert (int(state["x"]), elapsed.steps) == (1, 2)
    state, elapsed = ckpt.restore(target)  # default: the latest, to resume from
    assert (int(state["x"]), elapsed.steps) == (4, 5)


def test_keep_best_in_min_mode(tmp_path):
    ckpt = ciclo.checkpoint(tmp_path, monitor="metrics.score", mode="min", keep=1)
    ciclo.loop(
        {"x": jnp.int32(0)}, range(3), {ciclo.every(1): [scored([0.3, 0.1, 0.2]), ckpt]}
    )
    assert finished_steps(tmp_path) == [2, 3]
    _, elapsed = ciclo.restore(tmp_path, best=True)
    assert elapsed.steps == 2


def test_missing_monitored_metric_names_it_and_lists_logged(tmp_path):
    ckpt = ciclo.checkpoint(tmp_path, monitor="accuracy_test", mode="max")
    with pytest.raises(ValueError, match="accuracy_test") as info:
        ciclo.loop(
            {"x": jnp.int32(0)}, range(2), {ciclo.every(1): [scored([1, 2]), ckpt]}
        )
    assert "metrics.score" in str(info.value)
    with pytest.raises(ValueError, match="logs"):
        ckpt(ciclo.Elapsed.create(), {"x": jnp.int32(0)})  # by hand without logs


def test_self_registers_on_epoch_end_in_train_loop(tmp_path):
    ckpt = ciclo.checkpoint(tmp_path, keep=2)
    assert ckpt.on_epoch_end is ckpt
    ciclo.train_loop(
        init_state(),
        data(4),
        {ciclo.on_train_step: train_step},
        callbacks=[ckpt],
        epoch_duration=2,
        stop=4,
    )
    assert finished_steps(tmp_path) == [2, 4]  # epochs end after batches 2 and 4


def test_by_hand_counts_the_batch_just_trained_on(tmp_path):
    ckpt = ciclo.checkpoint(tmp_path)
    state = init_state()
    for elapsed, batch in ciclo.elapse(data(2)):
        _, state = train_step(state, batch)
        if elapsed.steps == 1:
            ckpt(elapsed, state, batch=batch)
    ckpt.close()
    restored, restored_elapsed = ckpt.restore(init_state())
    assert (restored_elapsed.steps, restored_elapsed.samples) == (2, 8)
    assert_trees_equal(restored, state)


def test_by_hand_with_the_elapsed_its_loop_returned_is_not_counted_twice(tmp_path):
    # the rule: by hand, `elapsed` is elapse's (before the batch: +1); an elapsed
    # that already counts the batches (a loop's) needs consumed=True. A checkpoint
    # that ran in the loop recognises the elapsed that loop returned.
    ckpt = ciclo.checkpoint(tmp_path / "in_loop", keep=3, async_save=False)
    state, _, elapsed = ciclo.train_loop(
        init_state(), data(4), {ciclo.on_train_step: train_step},
        callbacks=[ckpt], epoch_duration=2, stop=4,
    )  # fmt: skip
    assert elapsed.steps == 4 and ckpt.steps() == [2, 4]
    with pytest.warns(UserWarning, match=r"`elapsed` the loop returned.*step 4, not 5"):
        ckpt(elapsed, state)
    assert ckpt.steps() == [2, 4]  # the same step (and state), not a step 5
    state, _, elapsed = ciclo.loop(  # exhausted (not stopped): same
        state, data(3), {ciclo.every(1): train_step, ciclo.every(2): ckpt},
        elapsed=elapsed,
    )  # fmt: skip
    with pytest.warns(UserWarning, match=r"consumed=True"):
        ckpt(elapsed, state)
    assert ckpt.latest_step() == 7
    ckpt(elapsed, state, consumed=True)  # said explicitly: no warning
    assert ckpt.latest_step() == 7
    # elapse's elapsed continuing from it is a new one, counted before its batch
    for step_elapsed, batch in ciclo.elapse(data(1), initial=elapsed):
        _, state = train_step(state, batch)
        ckpt(step_elapsed, state)
    assert ckpt.latest_step() == 8
    ckpt.close()


def test_waits_for_async_save_when_the_loop_fails(tmp_path):
    ckpt = ciclo.checkpoint(tmp_path)

    def fail(state, batch, elapsed):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        ciclo.loop({"x": jnp.ones((64, 64))}, range(3), {ciclo.every(1): [ckpt, fail]})
    assert finished_steps(tmp_path) == [1]


class Opaque:
    """A state orbax cannot save."""

    def train_step(self, batch):
        return ciclo.logs().add_loss("loss", 1.0), self

    def test_step(self, batch):
        return ciclo.logs().add_metric("acc", 1.0)


def test_a_failing_loop_raises_its_own_error_not_the_unlogged_monitor(tmp_path):
    # the first epoch end (no test yet) saves unranked and orbax refuses the state:
    # that error propagates alone, not under "the monitored metric was not logged"
    ckpt = ciclo.checkpoint(tmp_path, monitor="acc_test", async_save=False)
    with pytest.raises(ValueError, match="Unsupported type") as info:
        ciclo.train_loop(
            Opaque(), [1.0], test_dataset=lambda: [0], epochs=2, test_every=2,
            callbacks=[ckpt],
        )  # fmt: skip
    assert "not logged" not in str(info.value)
    assert info.value.__context__ is None  # not raised while handling another


def test_an_error_after_an_unranked_save_is_not_masked(tmp_path):
    def fail(state, batch, elapsed):
        if elapsed.steps == 1:
            raise RuntimeError("boom")

    ckpt = ciclo.checkpoint(tmp_path, monitor="accuracy_test", mode="max")
    with pytest.raises(RuntimeError, match="boom") as info:
        ciclo.loop(
            {"x": jnp.int32(0)},
            range(3),
            {ciclo.every(1): [scored([1, 2, 3]), ckpt, fail]},
        )
    assert info.value.__context__ is None
    assert finished_steps(tmp_path) == [2]  # the pending save finished
    # a loop that ends normally still names the metric that never appeared
    with pytest.raises(ValueError, match="'accuracy_test' was not logged"):
        ciclo.loop(
            {"x": jnp.int32(0)}, range(2), {ciclo.every(1): [scored([1, 2]), ckpt]}
        )


def test_a_save_failing_at_the_end_of_a_failing_loop_only_warns(tmp_path):
    ckpt = ciclo.checkpoint(tmp_path)
    close = ckpt.store.close  # the part that writes the directory

    def failing_close():
        close()
        raise OSError("disk full")

    def fail(state, batch, elapsed):
        raise RuntimeError("boom")

    ckpt.store.close = failing_close
    with (
        pytest.warns(UserWarning, match="failed while the loop was ending with Run"),
        pytest.raises(RuntimeError, match="boom") as info,
    ):
        ciclo.loop({"x": jnp.ones(())}, range(3), {ciclo.every(1): [ckpt, fail]})
    assert info.value.__context__ is None
    del ckpt.store.close
    ckpt.close()


def test_a_loop_run_while_handling_an_error_still_checks_the_monitor(tmp_path):
    # the error being handled around the loop is not the loop's: the check runs
    ckpt = ciclo.checkpoint(tmp_path, monitor="accuracy_test", mode="max")
    try:
        raise KeyError("outer")
    except KeyError:
        with pytest.raises(ValueError, match="'accuracy_test' was not logged"):
            ciclo.loop(
                {"x": jnp.int32(0)}, range(2), {ciclo.every(1): [scored([1, 2]), ckpt]}
            )


def test_a_directory_from_an_earlier_run_is_one_timeline(tmp_path):
    first = ciclo.checkpoint(tmp_path, keep=3)
    ciclo.loop(
        {"x": jnp.int32(0)}, range(3), {ciclo.every(1): [scored([0] * 3), first]}
    )
    assert finished_steps(tmp_path) == [1, 2, 3]
    again = ciclo.checkpoint(tmp_path, keep=3)
    # a new run restarted from scratch: its step 2 replaces the old 2 and 3
    with pytest.warns(UserWarning, match=r"steps \[2, 3\] from an earlier run"):
        again(ciclo.Elapsed.create(steps=1), {"x": jnp.int32(7)})
    again(ciclo.Elapsed.create(steps=1), {"x": jnp.int32(8)})  # same step: replaced
    again.close()
    assert finished_steps(tmp_path) == [1, 2]
    state, elapsed = ciclo.restore(tmp_path, {"x": jnp.int32(0)})
    assert (int(state["x"]), elapsed.steps) == (8, 2)


def test_never_deletes_a_step_folder_it_did_not_write(tmp_path):
    first = ciclo.checkpoint(tmp_path)
    ciclo.loop({"x": jnp.int32(0)}, range(2), {ciclo.every(1): first})
    (tmp_path / "5").mkdir()  # someone else's folder, at a later step
    (tmp_path / "5" / "notes.txt").write_text("mine")
    again = ciclo.checkpoint(tmp_path)
    with pytest.raises(ValueError, match=r"5/ holds \['notes.txt'\]"):
        again(ciclo.Elapsed.create(steps=2), {"x": jnp.int32(1)})
    with pytest.raises(ValueError, match=r"not ciclo checkpoints"):
        first.restore({"x": jnp.int32(0)})
    assert sorted(os.listdir(tmp_path)) == ["2", "5"]
    assert (tmp_path / "5" / "notes.txt").read_text() == "mine"


def test_bare_array_state_round_trips(tmp_path):
    ckpt = ciclo.checkpoint(tmp_path)
    ckpt(ciclo.Elapsed.create(), jnp.arange(3, dtype=jnp.int32))
    state, elapsed = ckpt.restore(jnp.zeros(3, jnp.int32))
    ckpt.close()
    assert state.tolist() == [0, 1, 2] and state.dtype == jnp.int32
    assert elapsed.steps == 1


def test_a_restore_that_would_change_a_leaf_dtype_is_an_error_naming_it(tmp_path):
    saved = {"params": {"w": jnp.array([1.5, 2.7], jnp.float32)}, "n": jnp.int32(3)}
    ciclo.checkpoint(tmp_path)(ciclo.Elapsed.create(), saved)
    target = {"params": {"w": jnp.zeros(2, jnp.int32)}, "n": jnp.int32(0)}
    with pytest.raises(ValueError) as error:
        ciclo.restore(tmp_path, target)
    message = str(error.value)
    assert "'params/w'" in message and "'n'" not in message
    assert "saved float32, target int32" in message
    assert "target_state=None" in message  # the fix
    # a widening cast loses nothing: read
    wide = {"params": {"w": np.zeros(2, np.float64)}, "n": jnp.int32(0)}
    state, _ = ciclo.restore(tmp_path, wide)
    assert np.asarray(state["params"]["w"]).tolist() == pytest.approx([1.5, 2.7])
    # a target of the saved dtypes restores the saved values as they were
    target = {"params": {"w": jnp.zeros(2, jnp.float32)}, "n": jnp.int32(0)}
    state, _ = ciclo.restore(tmp_path, target)
    assert state["params"]["w"].tolist() == pytest.approx([1.5, 2.7])
    assert state["params"]["w"].dtype == jnp.float32


def test_errors_are_clear(tmp_path):
    with pytest.raises(ValueError, match="keep"):
        ciclo.checkpoint(tmp_path, keep=0)
    with pytest.raises(TypeError, match="directory"):
        ciclo.checkpoint(3)
    with pytest.raises(ValueError, match="mode"):
        ciclo.checkpoint(tmp_path, monitor="loss", mode="best")
    with pytest.raises(ValueError, match="No checkpoint directory"):
        ciclo.restore(tmp_path / "missing")
    ckpt = ciclo.checkpoint(tmp_path)
    ckpt(ciclo.Elapsed.create(), {"x": jnp.int32(0)})
    with pytest.raises(ValueError, match="monitor"):
        ckpt.restore(best=True)
    with pytest.raises(ValueError, match="step 5"):
        ckpt.restore(step=5)
    ckpt.close()


def managed_state(strategy, value):
    params = {"w": jnp.full((3,), value), "b": jnp.float32(value)}
    return ciclo.managed.ManagedState.create(params=params, tx=TX, strategy=strategy)


@pytest.mark.parametrize(
    ("saved", "restored"), [("data_parallel", "jit"), ("jit", "data_parallel")]
)
def test_managed_state_moves_between_strategies(tmp_path, saved, restored):
    # data_parallel replicates even on 1 device: params (1, 3) against jit's (3,)
    ckpt = ciclo.checkpoint(tmp_path)
    ckpt(ciclo.Elapsed.create(steps=2), managed_state(saved, 1.5))
    ckpt.close()
    target = managed_state(restored, 0.0)
    state, elapsed = ciclo.restore(tmp_path, target)
    assert state.strategy == restored and elapsed.steps == 3
    host = state.with_strategy("eager")
    assert_trees_equal(host.params, managed_state("eager", 1.5).params)
    assert_trees_equal(
        jax.tree.map(jnp.shape, state.params), jax.tree.map(jnp.shape, target.params)
    )


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MANUAL_SCRIPT = """
import sys
import jax.numpy as jnp
import ciclo

total_steps = 5
call_checkpoint = ciclo.every(steps=2)  # Schedule
checkpoint = ciclo.checkpoint(sys.argv[1])  # Callback
history = ciclo.history()  # History
state = {"w": jnp.zeros((128, 128))}
for elapsed, batch in ciclo.elapse(range(total_steps), stop=total_steps):
    logs = ciclo.logs()
    state = {"w": state["w"] + batch}
    logs.add_metric("w", state["w"][0, 0])
    if call_checkpoint(elapsed):
        checkpoint(elapsed, state)  # serialize state; no wait(): the script ends
    history.commit(elapsed, logs)
"""


def run_script(source, *args, timeout=120):
    import subprocess
    import sys

    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-c", source, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )


def test_a_checkpoint_made_by_hand_is_on_disk_when_the_script_ends(tmp_path):
    proc = run_script(MANUAL_SCRIPT, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "ERROR" not in proc.stderr, proc.stderr
    assert finished_steps(tmp_path) == [5]  # the last save (after batch 4) finished
    state, elapsed = ciclo.restore(tmp_path, {"w": jnp.zeros((128, 128))})
    assert elapsed.steps == 5 and float(state["w"][0, 0]) == 0 + 1 + 2 + 3 + 4


def test_restore_in_the_same_process_waits_for_pending_saves(tmp_path):
    ckpt = ciclo.checkpoint(tmp_path)
    for step in range(3):  # by hand, no wait()
        ckpt(ciclo.Elapsed.create(steps=step), {"w": jnp.full((256, 256), step)})
    state, elapsed = ciclo.restore(tmp_path, {"w": jnp.zeros((256, 256), jnp.int32)})
    assert elapsed.steps == 3 and float(state["w"][0, 0]) == 2.0
    ckpt.close()


def test_two_writers_on_one_directory_is_an_error_naming_it(tmp_path):
    def step(state, batch):
        return state + 1

    first, second = ciclo.checkpoint(tmp_path), ciclo.checkpoint(tmp_path)
    with pytest.raises(ValueError, match="Two ciclo.checkpoint writers save to"):
        ciclo.loop(jnp.zeros(()), range(3), {ciclo.every(1): [step, first, second]})


def test_by_hand_with_iterates_or_a_restored_elapsed_is_not_counted_twice(tmp_path):
    """`ciclo.iterate`'s and `ciclo.restore`'s `Elapsed` count their batches
    already: saved without `consumed=True`, it is recognised (with a warning)
    and recorded as it is, not one step later."""
    ckpt = ciclo.checkpoint(tmp_path, keep=5, async_save=False)
    for state, _, elapsed in ciclo.iterate(
        init_state(), data(4), {ciclo.on_train_step: train_step}, epoch_duration=2
    ):
        with pytest.warns(UserWarning, match=r"ciclo.iterate yielded.*step \d, not"):
            ckpt(elapsed, state)
    assert ckpt.steps() == [2, 4]
    restored, elapsed = ciclo.restore(tmp_path, init_state())
    with pytest.warns(UserWarning, match=r"ciclo.restore returned.*step 4, not 5"):
        ckpt(elapsed, restored)
    assert ckpt.steps() == [2, 4]
    ckpt.close()
