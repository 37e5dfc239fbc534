"""Metric writers: tensorboard, csv_logger, jsonl_logger, wandb_logger."""

from __future__ import annotations

import csv
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ciclo


def need_tensorboard() -> None:
    """Skips unless the TensorBoard writer (tensorboardX) and the event reader
    (tensorboard) are installed (ciclo[test] installs both)."""
    pytest.importorskip(
        "tensorboardX", reason="needs ciclo[tensorboard] (tensorboardX)"
    )
    pytest.importorskip("tensorboard", reason="reading events needs tensorboard")


@jax.jit
def train_step(state, batch):
    loss = 1.0 / (state + 1.0)
    logs = ciclo.logs().add_loss("loss", loss).add_metric("acc", state / 10.0)
    return logs, state + 1.0


def eval_step(state, batch):
    return ciclo.logs().add_metric("acc", jnp.float32(0.5) + batch.sum() * 0)


def batches(n, size=2):
    return [np.ones((size,), np.float32) for _ in range(n)]


def run_train_loop(*writers, n=6):
    return ciclo.train_loop(
        jnp.float32(0),
        batches(n),
        {ciclo.on_train_step: train_step, ciclo.on_test_step: eval_step},
        callbacks=list(writers),
        test_dataset=lambda: batches(2),
        epoch_duration=3,
        stop=n,
    )


def history_rows(history, *keys):
    steps, *values = history.collect("steps", *keys)
    return steps, values


def read_csv(path):
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


def read_jsonl(path):
    with open(path) as file:
        return [json.loads(line) for line in file]


def test_csv_and_jsonl_rows_equal_history(tmp_path):
    c = ciclo.csv_logger(tmp_path / "log.csv")
    j = ciclo.jsonl_logger(tmp_path / "sub" / "log.jsonl")
    _, history, _ = run_train_loop(c, j)
    steps, (losses, samples) = history_rows(history, "loss", "samples")
    rows = read_csv(tmp_path / "log.csv")
    assert [int(r["steps"]) for r in rows] == steps == list(range(6))
    assert [int(r["samples"]) for r in rows] == samples
    np.testing.assert_allclose([float(r["loss"]) for r in rows], losses)
    # the test entry appears after the first epoch: the header grew, rows kept
    assert list(rows[0])[:3] == ["steps", "samples", "time"]
    assert [r["acc_test"] for r in rows] == ["", "", "0.5", "", "", "0.5"]
    lines = read_jsonl(tmp_path / "sub" / "log.jsonl")
    assert [r["steps"] for r in lines] == steps
    np.testing.assert_allclose([r["loss"] for r in lines], losses)
    assert [r.get("acc_test") for r in lines] == [None, None, 0.5, None, None, 0.5]
    times = history.collect("time")
    np.testing.assert_allclose([r["time"] for r in lines], times)


def test_csv_entry_named_like_an_elapsed_column_and_a_late_entry(tmp_path):
    # an entry named "time" fills the time column (as a row's entries always
    # did); an entry first logged late goes in a new column, earlier rows ""
    def step(state, batch, elapsed):
        logs = ciclo.logs().add_metric("x", float(batch))
        if elapsed.steps >= 70:
            logs.add_metric("time", 100.0 + batch)
        if elapsed.steps >= 3:
            logs.add_metric("late", 2.0 * batch)
        return logs, state

    ciclo.loop(
        None,
        range(80),
        {ciclo.every(1): [step, ciclo.csv_logger(tmp_path / "log.csv")]},
    )
    rows = read_csv(tmp_path / "log.csv")
    assert list(rows[0]) == ["steps", "samples", "time", "completed", "x", "late"]
    assert [int(r["steps"]) for r in rows] == list(range(80))
    assert [r["x"] for r in rows] == [str(float(i)) for i in range(80)]
    assert [r["late"] for r in rows[:3]] == ["", "", ""]
    assert [float(r["late"]) for r in rows[3:]] == [2.0 * i for i in range(3, 80)]
    assert [float(r["time"]) for r in rows[70:]] == [100.0 + i for i in range(70, 80)]
    assert all(float(r["time"]) < 100.0 for r in rows[:70])


def test_jsonl_lines_are_json_dumps_of_each_row(tmp_path):
    # the file's text, byte for byte, is json.dumps of each row's record (json's
    # NaN/Infinity, escaped names, ints as ints), as json.loads reads it back
    values = [0.5, float("nan"), float("inf"), -float("inf"), -0.0, 1e300, 3.0]

    def step(state, batch, elapsed):
        logs = ciclo.logs().add_metric('qu"ote ü', values[batch])
        return logs.add_loss("loss", float(batch)), state

    _, history, _ = ciclo.loop(
        None,
        range(len(values)),
        {ciclo.every(1): [step, ciclo.jsonl_logger(tmp_path / "log.jsonl")]},
    )
    with open(tmp_path / "log.jsonl") as file:
        lines = file.read().splitlines()
    times, samples = history.collect("time"), history.collect("samples")
    expected = [
        json.dumps(
            {
                "steps": i,
                "samples": samples[i],
                "time": times[i],
                "completed": i + 1,
                "loss": float(i),  # losses first, then metrics
                'qu"ote ü': value,
            }
        )
        for i, value in enumerate(values)
    ]
    assert lines == expected
    assert '"qu\\"ote \\u00fc": NaN' in lines[1] and '"steps": 6, ' in lines[6]


def test_tensorboard_event_file_holds_tags_steps_and_last_values(tmp_path):
    need_tensorboard()
    from tensorboard.backend.event_processing.event_accumulator import (
        EventAccumulator,
    )

    tb = ciclo.tensorboard(tmp_path, hparams={"lr": 0.1})
    assert tb.on_train_batch_end is tb
    _, history, _ = run_train_loop(tb)
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert {"loss", "acc", "acc_test"} <= set(events.Tags()["scalars"])
    loss = events.Scalars("loss")
    # at the completed steps (Keras, clu, Jaxloop): one past the history's count,
    # so the epoch-end evaluations land on the epoch boundaries 3 and 6
    assert [e.step for e in loss] == [s + 1 for s in history.collect("steps")]
    assert loss[-1].value == pytest.approx(history.collect("loss")[-1])
    assert history.collect("steps", "acc_test")[0] == [2, 5]
    assert [e.step for e in events.Scalars("acc_test")] == [3, 6]
    assert (tmp_path / "hparams").is_dir()


def test_writers_in_loop_under_a_schedule_and_by_hand(tmp_path):
    j = ciclo.jsonl_logger(tmp_path / "a.jsonl")
    ciclo.loop(
        jnp.float32(0), batches(7), {ciclo.every(1): train_step, ciclo.every(3): j}
    )
    # steps 0, 3, 6 (the last batch also when off-schedule: it is the final row)
    assert [r["steps"] for r in read_jsonl(tmp_path / "a.jsonl")] == [0, 3, 6]

    by_hand = ciclo.csv_logger(tmp_path / "b.csv")
    state = jnp.float32(0)
    for elapsed, batch in ciclo.elapse(batches(3)):
        logs, state = train_step(state, batch)
        by_hand(elapsed, logs)
    by_hand.close()
    rows = read_csv(tmp_path / "b.csv")
    assert [r["steps"] for r in rows] == ["0", "1", "2"]
    assert [r["samples"] for r in rows] == ["0", "2", "4"]


def test_writer_reads_lagged_without_syncing(tmp_path):
    # With the values on the device, no transfer happens during the loop except of
    # values already computed; transfer_guard forbids implicit ones.
    j = ciclo.jsonl_logger(tmp_path / "log.jsonl")
    with jax.transfer_guard_device_to_host("disallow"):
        _, history, _ = ciclo.loop(
            jnp.float32(0), batches(20), {ciclo.every(1): train_step, **j}
        )
    assert len(read_jsonl(tmp_path / "log.jsonl")) == 20


def test_entries_logged_after_the_writer_and_by_on_end_are_written(tmp_path):
    def late(state, batch):
        return ciclo.logs().add_metric("late", 1.0)

    def final(state):
        return ciclo.logs().add_metric("final", 2.0)

    j = ciclo.jsonl_logger(tmp_path / "log.jsonl")
    _, history, _ = ciclo.loop(
        jnp.float32(0),
        batches(3),
        {ciclo.every(1): [train_step, j, late]},
        on_end=final,
    )
    rows = read_jsonl(tmp_path / "log.jsonl")
    assert [r["steps"] for r in rows] == history.collect("steps") == [0, 1, 2, 3]
    # a row is the history's row at that step (read from it): entries logged
    # after the writer's call in the step are in it, in every row
    assert [r["late"] for r in rows[:3]] == [1.0, 1.0, 1.0]
    assert rows[3]["final"] == 2.0


def test_csv_append_and_nonfinite_values(tmp_path):
    path = tmp_path / "log.csv"
    first = ciclo.csv_logger(path)
    first(ciclo.Elapsed.create(), ciclo.logs().add_loss("loss", 1.0))
    first.close()
    second = ciclo.csv_logger(path, append=True)
    logs = ciclo.logs().add_loss("loss", float("nan")).add_metric("new", 3)
    second(ciclo.Elapsed.create(steps=1), logs)
    second.close()
    rows = read_csv(path)
    assert rows[0]["loss"] == "1.0" and math.isnan(float(rows[1]["loss"]))
    assert [r["new"] for r in rows] == ["", "3"]


def test_csv_logger_signature_is_explicit_and_matches_jsonl_logger():
    import inspect

    csv_params = inspect.signature(ciclo.csv_logger).parameters
    assert list(csv_params) == ["path", "append", "collections", "max_pending", "every"]
    assert not any(p.kind is p.VAR_KEYWORD for p in csv_params.values())
    jsonl_params = inspect.signature(ciclo.jsonl_logger).parameters
    assert [(p.name, p.kind, p.default) for p in csv_params.values()] == [
        (p.name, p.kind, p.default) for p in jsonl_params.values()
    ]


@pytest.mark.parametrize("name", ["tensorboard", "csv_logger", "jsonl_logger"])
def test_writer_survives_ctrl_c_with_committed_rows_on_disk(tmp_path, name):
    if name == "tensorboard":
        need_tensorboard()

    def interrupt(state, batch, elapsed):
        if elapsed.steps == 4:
            raise KeyboardInterrupt

    path = tmp_path / ("tb" if name == "tensorboard" else "log")
    writer = getattr(ciclo, name)(path)
    # the interrupt comes after the writer in batch 4: its row is committed
    _, history, elapsed = ciclo.loop(
        jnp.float32(0), batches(10), {ciclo.every(1): [train_step, writer, interrupt]}
    )
    assert history.collect("steps") == [0, 1, 2, 3, 4]
    if name == "tensorboard":
        from tensorboard.backend.event_processing.event_accumulator import (
            EventAccumulator,
        )

        events = EventAccumulator(str(path))
        events.Reload()  # at the completed steps
        assert [e.step for e in events.Scalars("loss")] == [1, 2, 3, 4, 5]
    elif name == "csv_logger":
        assert [r["steps"] for r in read_csv(path)] == ["0", "1", "2", "3", "4"]
    else:
        assert [r["steps"] for r in read_jsonl(path)] == [0, 1, 2, 3, 4]


def written(name, path, key):
    """The steps `name` wrote `key` at in `path`, in order."""
    if name == "tensorboard":
        from tensorboard.backend.event_processing.event_accumulator import (
            EventAccumulator,
        )

        events = EventAccumulator(str(path))
        events.Reload()
        return [e.step for e in events.Scalars(key)]
    if name == "csv_logger":
        return [int(r["steps"]) for r in read_csv(path) if r.get(key)]
    return [r["steps"] for r in read_jsonl(path) if key in r]


@pytest.mark.parametrize("name", ["tensorboard", "csv_logger", "jsonl_logger"])
def test_a_batch_ctrl_c_cut_before_it_counted_leaves_no_row(tmp_path, name):
    if name == "tensorboard":
        need_tensorboard()

    # The writer holds batch 4's row, then Ctrl-C comes before the state changed:
    # the batch does not count (no history row, `elapsed` excludes it), so the
    # writer does not write it either; `on_end`'s row at that step is its own.
    def log_loss(state, batch):
        return ciclo.logs().add_loss("loss", state)

    def interrupt(state, batch, elapsed):
        if elapsed.steps == 4:
            raise KeyboardInterrupt

    def final(state):
        return ciclo.logs().add_metric("final", 1.0)

    path = tmp_path / ("tb" if name == "tensorboard" else "log")
    writer = getattr(ciclo, name)(path)
    _, history, elapsed = ciclo.loop(
        jnp.float32(0),
        batches(10),
        {ciclo.every(1): [log_loss, writer, interrupt, lambda s: s + 1.0]},
        on_end=final,
        catch_keyboard_interrupt=True,
    )
    assert elapsed.steps == 4
    assert history.collect("steps", "loss")[0] == [0, 1, 2, 3]
    assert history.collect("steps", "final")[0] == [4]
    # TensorBoard counts completed steps: batch 3's row at 4, on_end's too
    shift = 1 if name == "tensorboard" else 0
    assert written(name, path, "loss") == [s + shift for s in [0, 1, 2, 3]]
    assert written(name, path, "final") == [4]
    if name == "jsonl_logger":
        rows = read_jsonl(path)
        assert [r["steps"] for r in rows] == history.collect("steps")


@pytest.mark.skipif(not hasattr(signal, "SIGINT"), reason="needs SIGINT")
def test_ctrl_c_landing_inside_a_write_loses_no_row_and_doubles_none(tmp_path):
    # SIGINT arrives while the writer writes a batch of rows during a batch's
    # call: the writer finishes its call first, then the loop sees Ctrl-C; that
    # batch had not changed the state, so it does not count
    # Ctrl-C as in a terminal, also where the test runner ignores SIGINT
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _interrupted_write_run(tmp_path)
    finally:
        signal.signal(signal.SIGINT, previous)


def _interrupted_write_run(tmp_path):
    def log_loss(state, batch):
        return ciclo.logs().add_loss("loss", state)

    j = ciclo.jsonl_logger(tmp_path / "log.jsonl")
    write = j._write
    cut = []

    def interrupted_write(rows):
        if not cut and any(row.steps == 3 for row in rows):
            cut.append(rows[-1].steps)
            os.kill(os.getpid(), signal.SIGINT)
        write(rows)

    j._write = interrupted_write
    _, history, elapsed = ciclo.loop(
        0.0,
        range(40),
        {ciclo.every(1): [log_loss, j, lambda s: s + 1.0]},
        history=ciclo.history(lag=2),  # hands rows over every 2 steps
    )
    assert cut and 4 <= elapsed.steps < 40  # cut during a batch, not at the end
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    rows = read_jsonl(tmp_path / "log.jsonl")
    steps = list(range(elapsed.steps))
    assert [r["steps"] for r in rows] == history.collect("steps") == steps
    assert [r["loss"] for r in rows] == [float(s) for s in steps]


def test_train_loop_writer_rows_equal_history_after_an_uncounted_ctrl_c(tmp_path):
    def interrupt(state, batch, elapsed):
        if elapsed.steps == 2:
            raise KeyboardInterrupt

    j = ciclo.jsonl_logger(tmp_path / "log.jsonl")
    # on_train_batch_begin runs before the train step: batch 2 never counts, and
    # the writer (on_train_batch_end) saw batch 1 last
    _, history, elapsed = ciclo.train_loop(
        jnp.float32(0),
        batches(6),
        {ciclo.on_train_batch_begin: interrupt, ciclo.on_train_step: train_step},
        callbacks=[j],
    )
    assert elapsed.steps == 2
    rows = read_jsonl(tmp_path / "log.jsonl")
    assert [r["steps"] for r in rows] == history.collect("steps") == [0, 1]


def test_writer_flushes_on_error(tmp_path):
    def fail(state, batch, elapsed):
        if elapsed.steps == 3:
            raise RuntimeError("boom")

    j = ciclo.jsonl_logger(tmp_path / "log.jsonl")
    history = ciclo.history()
    with pytest.raises(RuntimeError, match="boom"):
        ciclo.loop(
            jnp.float32(0),
            batches(10),
            {ciclo.every(1): [train_step, j, fail]},
            history=history,
        )
    # the rows committed before the error are on disk, and the failing step's row
    # as the writer saw it (the history does not commit it; nan_guard's bad value
    # is in the log this way)
    assert history.collect("steps") == [0, 1, 2]
    assert [r["steps"] for r in read_jsonl(tmp_path / "log.jsonl")] == [0, 1, 2, 3]


def test_writer_keeps_the_last_row_when_the_dataset_fails_after_it(tmp_path):
    # the error comes from the data between batches: batch 2's row is committed
    def data():
        yield from batches(3)
        raise OSError("disk gone")

    j = ciclo.jsonl_logger(tmp_path / "log.jsonl")
    history = ciclo.history()
    with pytest.raises(OSError, match="disk gone"):
        ciclo.loop(
            jnp.float32(0), data(), {ciclo.every(1): [train_step, j]}, history=history
        )
    assert history.collect("steps") == [0, 1, 2]
    assert [r["steps"] for r in read_jsonl(tmp_path / "log.jsonl")] == [0, 1, 2]


SIGINT_CHILD = textwrap.dedent(
    """
    import itertools, json, os, signal, sys, time
    import ciclo

    # Ctrl-C as in a terminal, even when the parent runs with SIGINT ignored (a
    # background job of a non-interactive shell, which the child would inherit)
    signal.signal(signal.SIGINT, signal.default_int_handler)

    out = sys.argv[1]
    writers = {
        "csv_logger": ciclo.csv_logger(os.path.join(out, "log.csv")),
        "jsonl_logger": ciclo.jsonl_logger(os.path.join(out, "log.jsonl")),
    }
    try:  # the optional writers, where their package is installed
        import tensorboard, tensorboardX  # noqa: F401
    except ImportError:
        pass
    else:
        writers["tensorboard"] = ciclo.tensorboard(os.path.join(out, "tb"))
    try:
        import wandb  # noqa: F401
    except ImportError:
        pass
    else:
        writers["wandb_logger"] = ciclo.wandb_logger(
            project="ciclo-test", mode="offline", dir=out
        )

    def step(state, batch):
        time.sleep(0.005)
        return ciclo.logs().add_loss("loss", float(batch)), state

    def ready(state, batch, elapsed):  # once every writer has written rows: SIGINT may come
        if elapsed.steps >= 5 and all(w.rows_written for w in writers.values()):
            if not ready.said:
                ready.said = True
                print("ready", flush=True)

    ready.said = False
    data = range(200_000)  # ~17 minutes: the SIGINT ends it
    tasks = {ciclo.every(1): [step, *writers.values(), ready]}
    _, history, _ = ciclo.loop(None, data, tasks)
    print(json.dumps({"steps": history.collect("steps"), "writers": list(writers)}))
    """
)


@pytest.fixture(scope="module")
def sigint_run(tmp_path_factory):
    """One subprocess runs every writer in one loop and gets an external SIGINT
    mid-loop; returns its output folder and what it committed to its history."""
    out = tmp_path_factory.mktemp("sigint")
    env = {
        **os.environ,
        "WANDB_SILENT": "true",
        "WANDB_MODE": "offline",
        "PYTHONFAULTHANDLER": "1",  # SIGABRT below dumps every thread's stack
    }
    with subprocess.Popen(
        [sys.executable, "-c", SIGINT_CHILD, str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(ciclo.__file__))),
    ) as child:
        try:
            line = child.stdout.readline()  # blocks until the loop is running
            assert line.strip() == "ready", line + child.stderr.read()[-2000:]
            child.send_signal(signal.SIGINT)
            try:
                stdout, stderr = child.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                # a loop that ignores Ctrl-C: fail with where every thread hangs
                child.send_signal(signal.SIGABRT)
                _, stderr = child.communicate(timeout=30)
                pytest.fail(f"the loop did not end after SIGINT:\n{stderr[-6000:]}")
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
    assert child.returncode == 0, stderr[-2000:]
    return out, json.loads(stdout.splitlines()[-1])


def wandb_history_steps(run_dir, key):
    """The steps of the history records logging `key` in an offline run's
    `run-*.wandb` file (a LevelDB-style log of `wandb_internal_pb2.Record`s)."""
    import struct

    from wandb.proto import wandb_internal_pb2

    (path,) = run_dir.glob("run-*.wandb")
    data, block, steps = path.read_bytes(), 32768, []
    pos, pending = 7, b""  # after the file header (":W&B", magic, version)
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # the block's tail is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST: a whole record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                items = {
                    item.key or "/".join(item.nested_key): item.value_json
                    for item in record.history.item
                }
                if key in items:
                    steps.append((record.history.step.num, float(items[key])))
    return steps


@pytest.mark.parametrize(
    "name", ["tensorboard", "csv_logger", "jsonl_logger", "wandb_logger"]
)
@pytest.mark.slow
def test_writer_survives_sigint_in_a_subprocess(sigint_run, name):
    out, result = sigint_run
    if name not in result["writers"]:
        pytest.skip(f"{name}'s optional dependency is not installed")
    if name == "tensorboard":
        need_tensorboard()
    elif name == "wandb_logger":
        pytest.importorskip("wandb", reason="needs ciclo[wandb] (wandb)")
    steps = result["steps"]  # the history's rows; the loss logged is the step
    assert steps == list(range(len(steps))) and len(steps) >= 5
    # TensorBoard and W&B plot a step's values at the completed steps (one more)
    shift = 1 if name in ("tensorboard", "wandb_logger") else 0
    committed = [(step + shift, float(step)) for step in steps]
    if name == "tensorboard":
        from tensorboard.backend.event_processing.event_accumulator import (
            EventAccumulator,
        )

        events = EventAccumulator(str(out / "tb"))
        events.Reload()
        on_disk = [(e.step, e.value) for e in events.Scalars("loss")]
    elif name == "csv_logger":
        rows = read_csv(out / "log.csv")
        on_disk = [(int(r["steps"]), float(r["loss"])) for r in rows]
    elif name == "jsonl_logger":
        on_disk = [(r["steps"], r["loss"]) for r in read_jsonl(out / "log.jsonl")]
    else:
        (run_dir,) = (out / "wandb").glob("offline-run-*")
        deadline = time.monotonic() + 20  # wandb's service may still be writing
        while True:
            on_disk = wandb_history_steps(run_dir, "loss")
            if len(on_disk) >= len(steps) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    # exactly the committed rows, in order: not the row the writer saw of a batch
    # the SIGINT cut before it counted (that batch is not in the history)
    assert on_disk == committed


def test_wandb_offline_run_holds_the_logged_keys(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    logger = ciclo.wandb_logger(project="ciclo-test")
    _, history, _ = ciclo.loop(
        jnp.float32(0), batches(4), {ciclo.every(1): train_step, **logger}
    )
    assert logger.rows_written == 4 and logger.run is None  # finished
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    # the offline run's log holds the history records with the logged keys (wandb's
    # service process may still be writing it for a moment after finish())
    keys = (b"loss", b"acc", b"samples", b"time")
    deadline = time.monotonic() + 20
    while True:
        records = list(runs[0].glob("run-*.wandb"))
        data = records[0].read_bytes() if records else b""
        if all(key in data for key in keys) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert len(records) == 1
    for key in keys:
        assert key in data


@pytest.mark.parametrize(
    ("name", "module", "extra"),
    [
        ("tensorboard", "tensorboardX", "tensorboard"),
        ("wandb_logger", "wandb", "wandb"),
    ],
)
def test_missing_dependency_says_what_to_install(
    monkeypatch, tmp_path, name, module, extra
):
    monkeypatch.setitem(sys.modules, module, None)
    factory = getattr(ciclo, name)
    args = (tmp_path,) if name == "tensorboard" else ()
    with pytest.raises(ImportError, match=rf"install ciclo\[{extra}\]"):
        factory(*args)


def test_public_names():
    for name in ["tensorboard", "csv_logger", "jsonl_logger", "wandb_logger"]:
        assert name in ciclo.__all__ and name in ciclo.callbacks.__all__
        assert getattr(ciclo.callbacks, name) is getattr(ciclo, name)


def test_tensorboard_records_are_framed_with_valid_crcs(tmp_path):
    """Every TFRecord of the event file: its length, the length's masked CRC-32C,
    the event, the event's masked CRC-32C (what TensorBoard's reader checks),
    over rows whose events differ in length (steps past 127, values of every
    size, a new entry midway)."""
    import struct

    from tensorboardX.record_writer import masked_crc32c

    def step(state, batch):
        logs = ciclo.logs().add_loss("loss", float(batch) * 1.5)
        if batch >= 150:
            logs.add_metric("accuracy", 1.0 / (batch + 1))
        return logs, state

    ciclo.loop(None, range(300), {ciclo.every(1): step, **ciclo.tensorboard(tmp_path)})
    (name,) = [f for f in os.listdir(tmp_path) if "tfevents" in f or "events" in f]
    data = (tmp_path / name).read_bytes()
    offset, records = 0, 0
    while offset < len(data):
        header = data[offset : offset + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[offset + 8 : offset + 12])
        event = data[offset + 12 : offset + 12 + length]
        (event_crc,) = struct.unpack(
            "<I", data[offset + 12 + length : offset + 16 + length]
        )
        assert header_crc == masked_crc32c(header)
        assert event_crc == masked_crc32c(event)
        offset += 16 + length
        records += 1
    assert offset == len(data)
    assert records >= 300  # a record per row, after the file's own
