"""No kill makes a checkpoint directory unresumable (API.md §11): a kill at each
filesystem call of an older checkpoint's deletion, and the damage such kills (or
a hand) leave — a step folder without `elapsed`, an empty one, one holding only
`state`, a deleted `history` item — are skipped with a warning naming the step,
never a refusal; another program's orbax checkpoint is still refused."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

import ciclo

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import _faults_worker as worker  # noqa: E402

# orbax's tasks left behind by a failed read end as unraisable "Event loop is
# closed" (see test_checkpoint_faults)
leftovers = pytest.mark.filterwarnings(
    "ignore::pytest.PytestUnraisableExceptionWarning"
)


def straight(stop=worker.STEPS):
    return worker.train(None, stop=stop)


def assert_same_state(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), strict=True)


def resume(directory, keep=1):
    """The worker's command, run here: resumes `directory` to the end."""
    return worker.train(directory, callbacks=[ciclo.checkpoint(directory, keep=keep)])


def assert_resumed_whole(result, directory):
    """`result` (of `resume`) is the uninterrupted run's, and the directory holds
    its last checkpoint and nothing a kill left."""
    state, history, elapsed = result
    expected, expected_history, _ = straight()
    assert_same_state(state, expected)
    assert elapsed.steps == worker.STEPS
    assert history.collect("steps") == list(range(worker.STEPS))
    assert history.collect("loss") == expected_history.collect("loss")
    names = sorted(os.listdir(directory))
    assert str(worker.STEPS) in names
    assert not [n for n in names if not n.isdigit()], names  # no leftovers, no lock
    _, restored = ciclo.restore(directory, worker.init_state())
    assert restored.steps == worker.STEPS


def run_worker(*args, timeout=120):
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    return subprocess.run(
        [sys.executable, os.path.join(HERE, "_faults_worker.py"), *map(str, args)],
        capture_output=True, text=True, env=env, timeout=timeout,
    )  # fmt: skip


def expected_warnings(caught, allowed):
    """Every warning in `caught` matches one of `allowed` (substrings)."""
    for w in caught:
        assert any(a in str(w.message) for a in allowed), str(w.message)


# -- a kill while an older checkpoint is deleted --------------------------------------
@pytest.mark.slow
def test_a_kill_at_each_filesystem_call_of_a_deletion_leaves_a_resumable_directory(
    tmp_path,
):
    # keep=1: saving step 6 deletes step 3. The worker copies the directory as it
    # is just before each filesystem change of that deletion (what a kill there
    # leaves, the lock of the dead process included), then runs to the end.
    directory = tmp_path / "run"
    proc = run_worker("killdel", directory, 0)
    assert proc.returncode == 0 and "DONE 12" in proc.stdout, proc.stderr[-3000:]
    kills = sorted(
        (p for p in tmp_path.iterdir() if p.name.startswith("run-")),
        key=lambda p: int(p.name.split("-")[1]),
    )
    assert len(kills) >= 5  # a rename, files, folders
    for killed in kills:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = resume(killed)
        # the dead run's lock is taken over; the folder it was deleting is gone
        expected_warnings(caught, ["stale lock", "step 3 (", "removed incomplete"])
        assert_resumed_whole(result, killed)


@pytest.mark.slow
@pytest.mark.parametrize("k", [4])
def test_a_process_killed_during_a_deletion_resumes_with_the_same_command(tmp_path, k):
    directory = tmp_path / "run"
    killed = run_worker("killdel", directory, k)
    assert killed.returncode == 137, killed.stderr[-3000:]
    assert "DONE" not in killed.stdout
    again = run_worker("train", directory)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "DONE 12" in again.stdout
    assert "not ciclo checkpoints" not in again.stderr
    state, elapsed = ciclo.restore(directory, worker.init_state())
    assert elapsed.steps == worker.STEPS
    assert_same_state(state, straight()[0])
    assert sorted(os.listdir(directory)) == [str(worker.STEPS)]


# -- damaged step folders beside complete ones -----------------------------------------
def three_checkpoints(directory, keep=3):
    """Checkpoints at steps 3, 6 and 9 (with keep=1: only 9)."""
    worker.train(directory, callbacks=[ciclo.checkpoint(directory, keep=keep)], stop=9)
    steps = sorted(int(p) for p in os.listdir(directory) if p.isdigit())
    assert steps == ([3, 6, 9] if keep == 3 else [9])


def delete_elapsed(step_dir):
    shutil.rmtree(step_dir / "elapsed")


def empty_folder(step_dir):
    shutil.rmtree(step_dir)
    step_dir.mkdir()


def only_state(step_dir):
    for child in step_dir.iterdir():
        if child.name != "state":
            shutil.rmtree(child) if child.is_dir() else child.unlink()


DAMAGES = [delete_elapsed, empty_folder, only_state]


@pytest.mark.parametrize("damage", DAMAGES, ids=lambda f: f.__name__)
def test_an_incomplete_newest_step_folder_is_skipped_with_a_warning(tmp_path, damage):
    three_checkpoints(tmp_path)
    damage(tmp_path / "9")
    skipped = r"resuming from step 6 .*incomplete step folder.*step 9 \("
    with pytest.warns(UserWarning, match=skipped) as seen:
        result = resume(tmp_path, keep=3)
    assert len(seen) == 1, [str(w.message) for w in seen]  # no second one about 9
    assert_resumed_whole(result, tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["12", "6", "9"]  # 9: this run's


@pytest.mark.parametrize("damage", DAMAGES, ids=lambda f: f.__name__)
def test_restore_skips_an_incomplete_newest_step_folder_with_a_warning(
    tmp_path, damage
):
    three_checkpoints(tmp_path)
    damage(tmp_path / "9")
    with pytest.warns(UserWarning, match=r"restoring step 6 .*step 9 \("):
        state, elapsed = ciclo.restore(tmp_path, worker.init_state())
    assert elapsed.steps == 6
    assert_same_state(state, straight(stop=6)[0])
    with pytest.raises(ValueError, match=r"step folder 9/ .* is incomplete"):
        ciclo.restore(tmp_path, worker.init_state(), step=9)
    assert ciclo.checkpoint(tmp_path, keep=3).steps() == [3, 6]


@pytest.mark.parametrize("damage", DAMAGES, ids=lambda f: f.__name__)
def test_an_incomplete_older_step_folder_is_removed_with_a_warning(tmp_path, damage):
    # what a kill while orbax deleted step 6 in place left: 6/ beside a complete 9/
    three_checkpoints(tmp_path)
    damage(tmp_path / "6")
    with pytest.warns(UserWarning, match=r"removed incomplete .*step 6 \(") as seen:
        result = resume(tmp_path, keep=3)
    assert len(seen) == 1, [str(w.message) for w in seen]
    assert_resumed_whole(result, tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["12", "3", "9"]


def test_a_half_deleted_folder_beside_the_only_checkpoint_resumes(tmp_path):
    # keep=1: `3/` holding only `state/` (orbax killed deleting it) beside `9/`
    three_checkpoints(tmp_path, keep=1)
    shutil.copytree(tmp_path / "9" / "state", tmp_path / "3" / "state")
    with pytest.warns(UserWarning, match=r"removed incomplete .*step 3 \("):
        result = resume(tmp_path)
    assert_resumed_whole(result, tmp_path)


@leftovers
def test_a_deleted_history_item_falls_back_to_an_older_checkpoint(tmp_path):
    three_checkpoints(tmp_path)
    shutil.rmtree(tmp_path / "9" / "history")
    missing = r"resuming from step 6 .*step 9 \(.*'history' item is missing"
    with pytest.warns(UserWarning, match=missing):
        result = resume(tmp_path, keep=3)
    assert_resumed_whole(result, tmp_path)  # the whole history, never a hole


@leftovers
def test_a_deleted_history_item_of_the_only_checkpoint_is_a_clear_error(tmp_path):
    three_checkpoints(tmp_path, keep=1)
    shutil.rmtree(tmp_path / "9" / "history")
    with pytest.raises(ValueError, match=r"step 9 .*'history' item is missing"):
        resume(tmp_path)
    # the state alone still restores (it needs no history)
    _, elapsed = ciclo.restore(tmp_path, worker.init_state())
    assert elapsed.steps == 9


# -- another program's checkpoints ------------------------------------------------------
def other_program(directory, item="params"):
    """An orbax checkpoint another program wrote: one item, `item`, at step 5."""
    with ocp.CheckpointManager(directory, item_names=(item,)) as manager:
        manager.save(
            5,
            args=ocp.args.Composite(
                **{item: ocp.args.StandardSave({"w": jnp.ones(3)})}
            ),
        )
        manager.wait_until_finished()


@pytest.mark.parametrize("item", ["params", "state"])
def test_another_programs_orbax_checkpoint_is_still_refused(tmp_path, item):
    other_program(tmp_path, item)
    before = sorted(os.listdir(tmp_path / "5"))
    refused = r"not ciclo checkpoints: 5/"
    with pytest.raises(ValueError, match=refused):
        resume(tmp_path)
    with pytest.raises(ValueError, match=refused):
        ciclo.restore(tmp_path, worker.init_state())
    assert sorted(os.listdir(tmp_path / "5")) == before  # never touched


def test_another_programs_step_folder_among_ciclos_is_refused_and_kept(tmp_path):
    three_checkpoints(tmp_path, keep=1)
    other = tmp_path / "other"
    other_program(other, "state")  # named like ciclo's item, but not ciclo's
    shutil.copytree(other / "5", tmp_path / "5")
    with pytest.raises(ValueError, match=r"not ciclo checkpoints: 5/"):
        resume(tmp_path)
    with pytest.raises(ValueError, match=r"not ciclo checkpoints: 5/"):
        ciclo.restore(tmp_path, worker.init_state())
    assert sorted(os.listdir(tmp_path / "5")) == sorted(os.listdir(other / "5"))
