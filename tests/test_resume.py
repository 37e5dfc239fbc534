"""Resuming: `ciclo.checkpoint(directory, resume=True)` / `train_loop(resume=...)`,
the history saved beside the state, data positioning, crash safety (Ctrl-C, a
checkpoint killed mid-write, SIGKILL of the training process)."""

import os
import pickle
import shutil
import signal
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ciclo

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import _resume_worker as worker  # noqa: E402

TASKS = {ciclo.on_train_step: worker.train_step, ciclo.on_test_step: worker.test_step}
KWARGS = dict(test_dataset=lambda: worker.TEST, epoch_duration=worker.EPOCH)


def factory(start_step):
    return worker.TRAIN[start_step:]


def straight():
    return ciclo.train_loop(
        worker.init_state(), worker.TRAIN, TASKS, stop=worker.STEPS, **KWARGS
    )


def assert_same_run(a, b):
    """Same final state (bit for bit) and same history but for wall-clock fields."""
    (state_a, history_a, elapsed_a), (state_b, history_b, elapsed_b) = a, b
    for x, y in zip(jax.tree.leaves(state_a), jax.tree.leaves(state_b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), strict=True)
    assert worker.rows(history_a) == worker.rows(history_b)
    assert (elapsed_a.steps, elapsed_a.samples) == (elapsed_b.steps, elapsed_b.samples)


def test_resume_in_one_line_continues_exactly(tmp_path):
    first = ciclo.train_loop(
        worker.init_state(), factory, TASKS, stop=6, resume=tmp_path, **KWARGS
    )
    assert first[2].steps == 6
    resumed = ciclo.train_loop(
        worker.init_state(), factory, TASKS, stop=worker.STEPS, resume=tmp_path,
        **KWARGS,
    )  # fmt: skip
    assert_same_run(resumed, straight())
    assert resumed[2].time >= first[2].time  # training time carries over


def test_a_resumed_run_cut_by_ctrl_c_before_its_first_step_is_not_called_finished(
    tmp_path,
):
    # "nothing left to train" is for re-running a finished run (API.md §11); a
    # resumed run that Ctrl-C stops in its first step is not one (pytest turns
    # the warning into an error)
    ciclo.train_loop(worker.init_state(), factory, TASKS, stop=6, resume=tmp_path,
                     **KWARGS)  # fmt: skip

    def cut(state):
        raise KeyboardInterrupt

    _, history, elapsed = ciclo.train_loop(
        worker.init_state(), factory, {**TASKS, ciclo.on_train_batch_begin: cut},
        stop=worker.STEPS, resume=tmp_path, **KWARGS,
    )  # fmt: skip
    assert elapsed.steps == 6 and history.collect("steps")[-1] == 5


def test_rerunning_a_finished_run_reads_no_batch_of_a_plain_iterator(tmp_path):
    # a notebook cell run again: nothing left to train, so the data is not read
    # back (with a real loader that would cost a whole pass), and only that is said
    ciclo.train_loop(worker.init_state(), factory, TASKS, stop=6, resume=tmp_path,
                     **KWARGS)  # fmt: skip
    read = []

    def plain():
        for batch in worker.TRAIN:
            read.append(1)
            yield batch

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, history, elapsed = ciclo.train_loop(
            worker.init_state(), plain(), TASKS, stop=6, resume=tmp_path, **KWARGS
        )
    assert elapsed.steps == 6 and len(history.collect("steps")) == 6
    assert read == []
    said = [str(w.message) for w in caught]
    assert len(said) == 1 and "nothing left to train" in said[0], said


def test_plain_iterable_is_skipped_forward_with_a_warning(tmp_path):
    ckpt = ciclo.checkpoint(tmp_path, resume=True)
    ciclo.train_loop(
        worker.init_state(), worker.TRAIN, TASKS, callbacks=[ckpt], stop=6, **KWARGS
    )
    again = ciclo.checkpoint(tmp_path, resume=True)
    with pytest.warns(UserWarning, match="skipping the first 6 batches.*consumes"):
        resumed = ciclo.train_loop(
            worker.init_state(), iter(worker.TRAIN), TASKS, callbacks=[again],
            stop=worker.STEPS, **KWARGS,
        )  # fmt: skip
    assert_same_run(resumed, straight())


def test_a_list_is_indexed_past_the_consumed_batches_without_a_warning(tmp_path):
    ckpt = ciclo.checkpoint(tmp_path, resume=True)
    ciclo.train_loop(
        worker.init_state(), worker.TRAIN, TASKS, callbacks=[ckpt], stop=6, **KWARGS
    )
    again = ciclo.checkpoint(tmp_path, resume=True)
    resumed = ciclo.train_loop(
        worker.init_state(), worker.TRAIN, TASKS, callbacks=[again],
        stop=worker.STEPS, **KWARGS,
    )  # fmt: skip
    assert_same_run(resumed, straight())


def test_no_checkpoint_starts_fresh(tmp_path):
    def run(directory):
        return ciclo.train_loop(
            worker.init_state(), factory, TASKS, stop=worker.STEPS,
            resume=directory, **KWARGS,
        )  # fmt: skip

    assert_same_run(run(tmp_path / "missing"), straight())
    (tmp_path / "empty").mkdir()
    assert_same_run(run(tmp_path / "empty"), straight())


def test_a_checkpoint_killed_mid_write_is_never_loaded(tmp_path):
    ciclo.train_loop(
        worker.init_state(), factory, TASKS, stop=6, resume=tmp_path, **KWARGS
    )
    # what a kill during the write of step 9 leaves: orbax's temporary directory
    partial = tmp_path / "9.orbax-checkpoint-tmp"
    shutil.copytree(tmp_path / "6", partial)
    shutil.rmtree(partial / "state")
    _, elapsed = ciclo.restore(tmp_path, worker.init_state())
    assert elapsed.steps == 6
    resumed = ciclo.train_loop(
        worker.init_state(), factory, TASKS, stop=worker.STEPS, resume=tmp_path,
        **KWARGS,
    )  # fmt: skip
    assert_same_run(resumed, straight())
    assert sorted(os.listdir(tmp_path)) == ["12"]  # leftovers removed


def test_the_history_of_a_save_has_every_entry_committed_before_it(tmp_path):
    state, history, _ = ciclo.train_loop(
        worker.init_state(), worker.TRAIN, TASKS, stop=6,
        callbacks=[ciclo.checkpoint(tmp_path, keep=2)], **KWARGS,
    )  # fmt: skip
    ckpt = ciclo.checkpoint(tmp_path, resume=True)
    restored_state, restored, elapsed = ckpt.__loop_resume__(
        worker.init_state(), None, None
    )
    assert elapsed.steps == 6
    # lagged values and the saving batch's own row (its test metrics) included
    assert worker.rows(restored) == worker.rows(history)
    assert restored.collect("steps", "mse_test")[0] == [2, 5]
    ckpt.close()


def test_ctrl_c_finishes_the_in_flight_save_and_returns(tmp_path):
    def interrupt(state, batch, elapsed, loop_state):
        if loop_state.elapsed_after.steps == 3:  # the epoch's save just started
            raise KeyboardInterrupt

    state, history, elapsed = ciclo.train_loop(
        worker.init_state(), worker.TRAIN,
        {**TASKS, ciclo.on_train_batch_end: interrupt},
        callbacks=[ciclo.checkpoint(tmp_path)], stop=worker.STEPS, **KWARGS,
    )  # fmt: skip
    assert elapsed.steps == 3 and os.listdir(tmp_path) == ["3"]
    restored, restored_elapsed = ciclo.restore(tmp_path, worker.init_state())
    assert restored_elapsed.steps == 3
    for x, y in zip(jax.tree.leaves(restored), jax.tree.leaves(state), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_resume_in_loop_and_by_hand_with_history(tmp_path):
    def step(state, batch):
        return ciclo.logs().add_metric("x", state + batch), state + batch

    def run(stop):
        ckpt = ciclo.checkpoint(tmp_path, resume=True)
        tasks = {ciclo.every(1): step, ciclo.every(2): ckpt}
        return ciclo.loop(
            jnp.int32(0), lambda start: range(start, 10), tasks, stop=stop
        )

    run(5)  # saves after batches 1 and 3 (steps 2, 4); resumes at step 4
    state, history, elapsed = run(10)
    assert int(state) == sum(range(10)) and elapsed.steps == 10
    assert history.collect("steps") == list(range(10))
    assert [int(v) for v in history.collect("x")] == np.cumsum(range(10)).tolist()

    by_hand = ciclo.checkpoint(tmp_path / "hand")
    history = ciclo.history()
    for e, batch in ciclo.elapse(range(3)):
        logs = ciclo.logs().add_metric("b", batch)
        by_hand(e, jnp.int32(batch), logs, history=history)  # before the commit
        history.commit(e, logs)
    by_hand.close()
    resumed = ciclo.checkpoint(tmp_path / "hand", resume=True)
    _, restored, _ = resumed.__loop_resume__(jnp.int32(0), None, None)
    assert restored.collect("steps", "b") == ([0, 1, 2], [0, 1, 2])
    resumed.close()


def test_history_values_round_trip_exactly(tmp_path):
    values = [
        1, 2.5, float("nan"), True, "text", None, np.float32(0.1),
        np.arange(3, dtype=np.int16), [1.0, np.ones(2)], {"a": (1, 2)},
        jnp.bfloat16(1.5),
    ]  # fmt: skip
    history = ciclo.history()
    for i, value in enumerate(values):
        history.commit(
            ciclo.Elapsed.create(steps=i),
            ciclo.logs().add_output("v", value).add_metric("i", i),
        )
    ckpt = ciclo.checkpoint(tmp_path)
    ckpt(ciclo.Elapsed.create(steps=len(values)), {"x": jnp.int32(0)}, history=history)
    ckpt.close()
    resumed = ciclo.checkpoint(tmp_path, resume=True)
    _, restored, _ = resumed.__loop_resume__({"x": jnp.int32(0)}, None, None)
    resumed.close()
    assert restored.collect("i") == list(range(len(values)))
    assert repr(restored.collect("v")) == repr(history.collect("v"))
    got = restored.collect("v")
    assert [type(v) for v in got] == [type(v) for v in history.collect("v")]
    assert got[6].dtype == np.float32 and got[10].dtype == jnp.bfloat16


def test_errors_name_what_was_received(tmp_path):
    with pytest.raises(TypeError, match="resume.*'yes'"):
        ciclo.checkpoint(tmp_path, resume="yes")
    with pytest.raises(TypeError, match="factory.*start_step"):
        ciclo.loop(0, lambda: range(3), {ciclo.every(1): ciclo.noop})
    ckpt = ciclo.checkpoint(tmp_path)
    with pytest.warns(UserWarning, match=r"outputs\.o holds a object.*left out"):
        ckpt(
            ciclo.Elapsed.create(), {"x": jnp.int32(0)},
            history=_history_with(object()),
        )  # fmt: skip
    ckpt.close()
    _, elapsed = ciclo.restore(tmp_path)  # the state was saved anyway
    assert elapsed.steps == 1


def _history_with(value):
    history = ciclo.history()
    history.commit(ciclo.Elapsed.create(), ciclo.logs().add_output("o", value))
    return history


# -- SIGKILL of a training process --------------------------------------------------
def run_worker(directory, out, kill, data, sig="KILL"):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, os.path.join(HERE, "_resume_worker.py"),
         str(directory), str(out), str(kill), data, sig],
        capture_output=True, text=True, timeout=120, env=env, cwd=ROOT,
    )  # fmt: skip


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("straight") / "out.pkl"
    proc = run_worker("-", out, 0, "factory")
    assert proc.returncode == 0, proc.stderr
    with open(out, "rb") as f:
        return pickle.load(f)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kill", "data", "resumed_from"),
    [
        # killed at step 3 right after the first save started: the async save is
        # in flight (its `3.orbax-checkpoint-tmp` is left), no checkpoint complete
        (3, "factory", {None, 3}),
        (6, "factory", {3, 6}),  # right after the epoch-2 save started
        (2, "list", {None}),  # before any checkpoint completed
    ],
)
def test_sigkill_then_one_line_resume_equals_uninterrupted(
    tmp_path, uninterrupted, kill, data, resumed_from
):
    directory, out = tmp_path / "ckpts", tmp_path / "out.pkl"
    killed = run_worker(directory, out, kill, data)
    assert killed.returncode == -9, killed.stderr
    complete = [int(n) for n in os.listdir(directory) if n.isdigit()] if (
        directory.exists()
    ) else []  # fmt: skip
    assert (max(complete) if complete else None) in resumed_from
    if kill == 3 and not complete:  # the first save was in flight: its leftovers
        assert "3.orbax-checkpoint-tmp" in os.listdir(directory)
    resumed = run_worker(directory, out, 0, data)
    assert resumed.returncode == 0, resumed.stderr
    if complete and data == "list":
        assert "skipping the first" in resumed.stderr
    assert not [n for n in os.listdir(directory) if "tmp" in n]  # leftovers removed
    with open(out, "rb") as f:
        result = pickle.load(f)
    assert result["steps"] == uninterrupted["steps"] == worker.STEPS
    for key in ("params", "opt_state", "key"):
        for x, y in zip(
            jax.tree.leaves(result[key]), jax.tree.leaves(uninterrupted[key]),
            strict=True,
        ):  # fmt: skip
            np.testing.assert_array_equal(x, y, strict=True)
    assert result["rows"] == uninterrupted["rows"]


@pytest.mark.slow
def test_sigterm_saves_the_step_in_flight_and_ends_as_sigterm(tmp_path, uninterrupted):
    # preempted mid-epoch (epochs of 3 steps): the step in flight finishes, its
    # state is saved and waited for, the lock is released, and the process ends
    # as SIGTERM ends it; the same command then resumes exactly
    directory, out, data = tmp_path / "ckpts", tmp_path / "out.pkl", "list"
    stopped = run_worker(directory, out, 5, data, "TERM")
    assert stopped.returncode == -signal.SIGTERM, stopped.stderr
    assert "Traceback" not in stopped.stderr, stopped.stderr
    assert sorted(os.listdir(directory)) == ["5"]  # keep=1; no lock left behind
    restored, elapsed = ciclo.restore(directory, worker.init_state())
    straight5 = ciclo.train_loop(
        worker.init_state(), worker.TRAIN, TASKS, stop=5, **KWARGS
    )  # fmt: skip
    assert elapsed.steps == 5
    for x, y in zip(
        jax.tree.leaves(restored), jax.tree.leaves(straight5[0]), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), strict=True)
    resumed = run_worker(directory, out, 0, data)
    assert resumed.returncode == 0, resumed.stderr
    with open(out, "rb") as f:
        result = pickle.load(f)
    assert result["steps"] == uninterrupted["steps"] == worker.STEPS
    for key in ("params", "opt_state", "key"):
        for x, y in zip(
            jax.tree.leaves(result[key]), jax.tree.leaves(uninterrupted[key]),
            strict=True,
        ):  # fmt: skip
            np.testing.assert_array_equal(x, y, strict=True)
    assert result["rows"] == uninterrupted["rows"]


class GrainLikeIterator:
    """A checkpointable iterator with Grain's protocol (`get_state() -> dict`,
    `set_state(dict)`), counting the batches it produces; `encode` gives the
    bytes state of Grain's DataLoader iterators instead."""

    def __init__(self, batches, encode=False):
        self.batches, self.index, self.produced, self.encode = batches, 0, 0, encode

    def __iter__(self):
        return self

    def __next__(self):
        if self.index >= len(self.batches):
            raise StopIteration
        self.index += 1
        self.produced += 1
        return self.batches[self.index - 1]

    def get_state(self):
        state = {"next_index": np.int64(self.index), "epoch": 0}
        return pickle.dumps(state) if self.encode else state

    def set_state(self, state):
        state = pickle.loads(state) if self.encode else state
        self.index = int(state["next_index"])


@pytest.mark.parametrize("encode", [False, True], ids=["dict_state", "bytes_state"])
def test_a_checkpointable_iterator_resumes_from_its_saved_state(tmp_path, encode):
    # killed after 6 steps (saves at the epoch ends 3 and 6); resumed with a NEW
    # iterator at position 0: set_state puts it at batch 6, nothing is skipped
    first = GrainLikeIterator(worker.TRAIN, encode)
    ciclo.train_loop(
        worker.init_state(), first, TASKS, stop=6, resume=tmp_path, **KWARGS
    )
    fresh = GrainLikeIterator(worker.TRAIN, encode)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "skipping ... batches" warning
        resumed = ciclo.train_loop(
            worker.init_state(), fresh, TASKS, stop=worker.STEPS, resume=tmp_path,
            **KWARGS,
        )  # fmt: skip
    assert fresh.produced == worker.STEPS - 6
    assert_same_run(resumed, straight())


def test_a_checkpointable_iterator_in_loop_by_hand(tmp_path):
    data = GrainLikeIterator(worker.TRAIN)
    ckpt = ciclo.checkpoint(tmp_path, resume=True, async_save=False)
    step = {ciclo.every(1): worker.train_step, ciclo.every(2): ckpt}
    ciclo.loop(worker.init_state(), data, step, stop=5)
    saved = ckpt.latest_step()
    ckpt.close()  # one writer per directory
    fresh = GrainLikeIterator(worker.TRAIN)
    again = ciclo.checkpoint(tmp_path, resume=True, async_save=False)
    _, _, elapsed = ciclo.loop(
        worker.init_state(),
        fresh,
        {ciclo.every(1): worker.train_step, ciclo.every(2): again},
        stop=worker.STEPS,
    )
    assert elapsed.steps == worker.STEPS
    assert fresh.produced == worker.STEPS - saved  # started at the saved position
