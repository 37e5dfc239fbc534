"""The history in checkpoints (API.md §11, issue 31 point 5): each save adds only
the rows since the previous one, each checkpoint still holds its whole history,
and a resumed run's history equals an uninterrupted run's row for row (fused
calls' rows, NaN values, arrays and values whose column changes type included);
checkpoints written before (the whole history in one item) restore and resume;
a damaged or missing part of a history makes that checkpoint unreadable (resuming
falls back to an older one), and a kill while a save writes its history leaves a
directory that resumes."""

from __future__ import annotations

import itertools
import json
import os
import shutil
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

import _history_model as model  # noqa: E402

FIXTURES = os.path.join(HERE, "fixtures", "history_v1")
CLOCK = ("elapsed.time", "elapsed.date")  # wall-clock fields differ between runs


def rows(history, clock=True):
    """Every row of `history` as `{"collection.name": value}`."""
    return [
        {
            f"{c}.{n}": v
            for c, entries in logs.items()
            for n, v in entries.items()
            if clock or f"{c}.{n}" not in CLOCK
        }
        for logs in history
    ]


def assert_same_rows(got, expected, clock=True, exact=True):
    """The histories hold the same rows: the same keys, value types and values
    (NaN equal to NaN; arrays of the same dtype; nested values alike)."""
    got, expected = rows(got, clock), rows(expected, clock)
    assert len(got) == len(expected)
    for i, (a, b) in enumerate(zip(got, expected)):
        assert a.keys() == b.keys(), i
        for key in a:
            assert_same(a[key], b[key], exact, f"row {i} {key}")


def assert_same(x, y, exact, where):
    assert type(x) is type(y), (where, x, y)
    if isinstance(x, dict):
        assert list(x) == list(y), where
        for k in x:
            assert_same(x[k], y[k], exact, where)
    elif isinstance(x, list | tuple):
        assert len(x) == len(y), where
        for u, v in zip(x, y):
            assert_same(u, v, exact, where)
    elif isinstance(x, np.ndarray | np.generic | float):
        if isinstance(x, np.ndarray | np.generic):
            assert x.dtype == y.dtype, where
        if exact or not np.issubdtype(np.asarray(x).dtype, np.floating):
            np.testing.assert_array_equal(x, y, err_msg=where, strict=True)
        else:
            np.testing.assert_allclose(x, y, rtol=1e-6, err_msg=where)
    else:
        assert x == y, (where, x, y)


def assert_same_params(a, b):
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def restored(directory, **kwargs):
    """The history the latest checkpoint of `directory` holds (a run with nothing
    left to train returns it as saved)."""
    stop = kwargs.pop("stop", model.STEPS)
    with pytest.warns(UserWarning, match="nothing left to train"):
        return model.run(directory, stop=stop, **kwargs)[1]


def manifest(directory, step):
    with open(os.path.join(directory, str(step), "history", "segments.json")) as f:
        return json.load(f)


# -- a run saved many times, resumed ---------------------------------------------------
@pytest.mark.parametrize("fused", [False, True])
def test_a_run_resumed_twice_equals_an_uninterrupted_one_row_for_row(tmp_path, fused):
    model.run(tmp_path, stop=9, fused=fused)  # saves at 3, 6, 9
    model.run(tmp_path, stop=18, fused=fused)  # resumes at 9; saves at 12, 15, 18
    state, history, elapsed = model.run(tmp_path, fused=fused)  # resumes at 18
    straight_state, straight, _ = model.run(None, fused=fused)
    assert elapsed.steps == model.STEPS
    assert history.collect("steps") == list(range(model.STEPS))
    assert_same_rows(history, straight, clock=False)
    assert_same_params(state, straight_state)
    # the last checkpoint holds that history exactly, wall-clock fields included
    assert_same_rows(restored(tmp_path, fused=fused), history)


def test_each_kept_checkpoint_holds_its_whole_history(tmp_path):
    # keep=3: steps 18, 21 and 24 are kept; each alone restores its whole history
    run = tmp_path / "run"
    _, history, _ = model.run(run, keep=3)
    kept = sorted(int(n) for n in os.listdir(run) if n.isdigit())
    assert kept == [18, 21, 24]
    for step in kept:
        alone = tmp_path / f"alone-{step}"
        shutil.copytree(run, alone)
        for other in kept:
            if other != step:
                shutil.rmtree(alone / str(other))
        assert_same_rows(restored(alone, stop=step, keep=3), history[:step])


def test_a_save_adds_only_its_new_rows(tmp_path):
    # 7 saves of 3 rows each; the two kept checkpoints share the files of the
    # rows they have in common, and each holds a handful of files
    model.run(tmp_path, stop=21)
    older, newer = manifest(tmp_path, 18), manifest(tmp_path, 21)
    assert (older["rows"], newer["rows"]) == (18, 21)
    for saved in (older, newer):
        ranges = [(s["start"], s["stop"]) for s in saved["segments"]]
        assert ranges[0][0] == 0 and ranges[-1][1] == saved["rows"]
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))  # contiguous
        assert len(ranges) <= 3  # merged as they grow: ~log2(saves)
    shared = {s["file"] for s in older["segments"]} & {
        s["file"] for s in newer["segments"]
    }
    assert shared  # rows 0-18 are not written again
    for name in shared:
        a = os.stat(tmp_path / "18" / "history" / name)
        b = os.stat(tmp_path / "21" / "history" / name)
        assert (a.st_ino, a.st_dev) == (b.st_ino, b.st_dev)  # one file, linked


def test_a_checkpoint_holds_few_segments_however_its_saves_are_spaced(tmp_path):
    # saves further and further apart, then closer and closer: each checkpoint
    # holds at most ~log2(rows) segments, and restores every row
    ckpt = ciclo.checkpoint(tmp_path, keep=1)
    history = ciclo.history()
    gaps = [1, 2, 3, 5, 8, 13, 21, 34, 21, 13, 8, 5, 3, 2, 1, 1, 1, 1, 1, 1, 1]
    for gap in gaps:
        for _ in range(gap):
            e = ciclo.Elapsed.create(steps=len(history))
            history.commit(e, ciclo.logs().add_metric("m", float(len(history))))
        ckpt(e, {"w": jnp.int32(0)}, history=history, consumed=True)
        ckpt.wait()
        segments = manifest(tmp_path, int(e.steps))["segments"]
        assert len(segments) <= np.log2(len(history)) + 1, segments
    ckpt.close()
    resumed = ciclo.checkpoint(tmp_path, resume=True)
    _, back, _ = resumed.__loop_resume__({"w": jnp.int32(0)}, None, None)
    resumed.close()
    assert_same_rows(back, history)


# -- by hand: values that change type ---------------------------------------------------
def _value(i):
    """Row `i`'s entries: a column that goes int -> float -> arrays, one that
    appears late, NaN, bools, numpy scalars, nested values."""
    logs = ciclo.logs()
    logs.add_metric("m", i if i < 4 else float(i) if i < 8 else np.full(2, i))
    logs.add_metric("x", np.float32(i / 3) if i % 5 else np.float32(np.nan))
    logs.add_output("b", i % 2 == 0)
    if i >= 6:
        logs.add_output("late", {"k": (i, [1.5, np.arange(2, dtype=np.int16)])})
    if i == 9:
        logs.add_metric("bf", jnp.bfloat16(1.5))
    return logs


def test_saves_by_hand_bring_back_every_value_exactly(tmp_path):
    ckpt = ciclo.checkpoint(tmp_path, keep=2)
    history = ciclo.history()
    state = {"w": jnp.int32(0)}
    before_commit = {2, 9}  # saved with the step's logs, then committed
    after_commit = {4, 6, 11}
    for e, _ in ciclo.elapse(range(12)):
        i = int(e.steps)
        logs = _value(i)
        if i in before_commit:
            ckpt(e, state, logs, history=history)
        history.commit(e, logs)
        if i in after_commit:
            ckpt(e, state, logs, history=history)
    ckpt.close()
    resumed = ciclo.checkpoint(tmp_path, resume=True)
    _, back, elapsed = resumed.__loop_resume__(state, None, None)
    resumed.close()
    assert elapsed.steps == 12
    assert_same_rows(back, history)
    assert repr(back.collect("late")) == repr(history.collect("late"))
    assert back.to_dict().keys() == history.to_dict().keys()


# -- damage ----------------------------------------------------------------------------
@pytest.mark.parametrize("damage", ["deleted", "changed"])
def test_a_damaged_history_segment_falls_back_to_the_older_checkpoint(tmp_path, damage):
    _, straight, _ = model.run(None)
    model.run(tmp_path, stop=21)  # keeps 18 and 21
    newest = manifest(tmp_path, 21)["segments"][-1]["file"]
    path = tmp_path / "21" / "history" / newest
    if damage == "deleted":
        os.remove(path)
    else:  # a digit changed inside the file: it still parses
        text = path.read_text()
        i = max(text.index('"b64": "') + 9, 0)
        os.remove(path)  # the file may be shared with another checkpoint
        path.write_text(text[:i] + ("A" if text[i] != "A" else "B") + text[i + 1 :])
    with pytest.warns(UserWarning, match=r"resuming from step 18 .*step 21 \("):
        state, history, elapsed = model.run(tmp_path)
    assert elapsed.steps == model.STEPS
    assert_same_rows(history, straight, clock=False)
    assert sorted(os.listdir(tmp_path)) == ["21", "24"]  # 21 saved again
    assert_same_rows(restored(tmp_path), history)


# -- checkpoints of an earlier format -----------------------------------------------------
@pytest.mark.parametrize("fused", [False, True])
def test_a_checkpoint_with_the_whole_history_in_one_item_restores_and_resumes(
    tmp_path, fused
):
    # written by ciclo before histories were saved in segments (see
    # fixtures/make_history_v1.py): steps 3 and 6, `history/metadata` JSON
    directory = tmp_path / "v1"
    shutil.copytree(os.path.join(FIXTURES, "fused" if fused else "plain"), directory)
    assert os.path.exists(directory / "6" / "history" / "metadata")
    state, elapsed = ciclo.restore(directory, model.init_state())
    assert elapsed.steps == 6
    old = restored(directory, stop=6, fused=fused)
    assert old.collect("steps") == list(range(6))
    _, straight, _ = model.run(None, fused=fused)
    assert_same_rows(old, straight[:6], clock=False, exact=False)
    _, history, elapsed = model.run(directory, fused=fused)  # resumed at 6
    assert elapsed.steps == model.STEPS
    assert_same_rows(history, straight, clock=False, exact=False)
    assert_same_rows(history[:6], old)  # the saved rows as they were
    assert manifest(directory, model.STEPS)["rows"] == model.STEPS  # the new layout
    assert_same_rows(restored(directory, fused=fused), history)


# -- kills --------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_a_kill_while_a_save_writes_its_history_leaves_a_resumable_directory(
    tmp_path, k
):
    # the worker dies before the k-th file call (a link or a write) of the
    # history of its third save (step 9), which builds on the second's files
    directory = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    killed = subprocess.run(
        [sys.executable, os.path.join(HERE, "_history_kill_worker.py"),
         str(directory), str(k)],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert killed.returncode == 137, killed.stderr[-3000:]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state, history, elapsed = model.run(directory, keep=1)
    assert all("stale lock" in str(w.message) for w in caught), [
        str(w.message) for w in caught
    ]
    straight_state, straight, _ = model.run(None)
    assert elapsed.steps == model.STEPS
    assert_same_rows(history, straight, clock=False)
    assert_same_params(state, straight_state)
    assert sorted(os.listdir(directory)) == [str(model.STEPS)]  # nothing left over


@pytest.mark.slow
def test_under_jax_distributed_every_process_resumes_the_history(tmp_path):
    # two processes, a checkpoint every 2 steps: process 0 writes the history,
    # both read it back when resuming
    from _workers import run_processes

    directory, out = tmp_path / "ckpts", tmp_path / "out"
    worker = "_history_multihost_worker.py"
    run_processes(worker, str(directory), "6", str(out))
    run_processes(worker, str(directory), "10", str(out))  # resumes at 6
    expected = [float(np.float32(sum(range(i + 1)))).hex() for i in range(10)]
    for process in range(2):
        with open(f"{out}.{process}.json") as f:
            got = json.load(f)
        assert got == {"steps": list(range(10)), "loss": expected}, process
    assert manifest(directory, 10)["rows"] == 10
    assert sorted(os.listdir(directory)) == ["10", "8"]
