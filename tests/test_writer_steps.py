"""Writers' step numbering, tag prefixes and resume points, in one process (the
kill-and-resume runs are in test_writers_resume.py)."""

from __future__ import annotations

import csv
import json
import math
import sys
import types

import jax.numpy as jnp
import numpy as np
import pytest

import ciclo


def step(state, batch):
    return ciclo.logs().add_loss("loss", jnp.float32(batch)), state


def read_jsonl(path):
    with open(path) as file:
        return [json.loads(line) for line in file]


def test_a_loop_started_past_zero_keeps_earlier_rows_and_replaces_later_ones(tmp_path):
    j, c = tmp_path / "log.jsonl", tmp_path / "log.csv"
    # a first run logged steps 0..7 (loss = step), then "crashed"
    ciclo.loop(
        None,
        range(8),
        {ciclo.every(1): [step, ciclo.jsonl_logger(j), ciclo.csv_logger(c)]},
    )
    # resumed from a checkpoint of step 5, with other values: rows 5.. replaced
    ciclo.loop(
        None,
        [100 + s for s in range(5, 10)],
        {ciclo.every(1): [step, ciclo.jsonl_logger(j), ciclo.csv_logger(c)]},
        elapsed=ciclo.Elapsed.create(steps=5),
    )
    rows = read_jsonl(j)
    assert [r["steps"] for r in rows] == list(range(10))
    assert [r["loss"] for r in rows] == [0, 1, 2, 3, 4, 105, 106, 107, 108, 109]
    assert [r["completed"] for r in rows] == list(range(1, 11))
    with open(c, newline="") as file:
        rows = list(csv.DictReader(file))
    assert [int(r["steps"]) for r in rows] == list(range(10))
    assert [float(r["loss"]) for r in rows] == [0, 1, 2, 3, 4, 105, 106, 107, 108, 109]
    assert [int(r["completed"]) for r in rows] == list(range(1, 11))


def test_a_resumed_loop_cut_before_its_first_row_still_drops_the_later_rows(tmp_path):
    # a run logged steps 0..7, then "crashed"; the resumed run (from the
    # checkpoint of step 5) gets Ctrl-C before it commits a row: the files hold
    # the history's rows, 0..4, not the crashed run's 5..7 (API.md §6)
    pytest.importorskip("tensorboardX", reason="needs ciclo[tensorboard]")
    pytest.importorskip("tensorboard", reason="reading events needs tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import (
        EventAccumulator,
    )

    j, c, tb = tmp_path / "log.jsonl", tmp_path / "log.csv", tmp_path / "tb"

    def writers():
        return [ciclo.jsonl_logger(j), ciclo.csv_logger(c), ciclo.tensorboard(tb)]

    ciclo.loop(None, range(8), {ciclo.every(1): [step, *writers()]})

    def cut(state, batch):
        raise KeyboardInterrupt

    _, history, elapsed = ciclo.loop(
        None,
        [100 + s for s in range(5, 10)],
        {ciclo.every(1): [cut, step, *writers()]},
        elapsed=ciclo.Elapsed.create(steps=5),
    )
    assert elapsed.steps == 5 and len(history) == 0
    assert [r["steps"] for r in read_jsonl(j)] == [0, 1, 2, 3, 4]
    with open(c, newline="") as file:
        assert [int(r["steps"]) for r in csv.DictReader(file)] == [0, 1, 2, 3, 4]
    events = EventAccumulator(str(tb))
    events.Reload()  # the restart marker at 6 hides the crashed run's 6, 7, 8
    assert [e.step for e in events.Scalars("loss")] == [1, 2, 3, 4, 5]


def test_a_fresh_loop_truncates_and_append_keeps_everything(tmp_path):
    j = tmp_path / "log.jsonl"
    ciclo.loop(None, range(4), {ciclo.every(1): [step, ciclo.jsonl_logger(j)]})
    ciclo.loop(None, range(2), {ciclo.every(1): [step, ciclo.jsonl_logger(j)]})
    assert [r["steps"] for r in read_jsonl(j)] == [0, 1]
    ciclo.loop(
        None, range(2), {ciclo.every(1): [step, ciclo.jsonl_logger(j, append=True)]}
    )
    assert [r["steps"] for r in read_jsonl(j)] == [0, 1, 0, 1]


def test_by_hand_the_first_row_is_the_resume_point(tmp_path):
    j = tmp_path / "log.jsonl"
    first = ciclo.jsonl_logger(j)
    for elapsed, batch in ciclo.elapse(range(6)):
        first(elapsed, step(None, batch)[0])
    first.close()
    with open(j, "a") as file:
        file.write('{"steps": 6, "lo')  # a line a SIGKILL cut
    second = ciclo.jsonl_logger(j)
    for elapsed, batch in ciclo.elapse(range(3), initial=ciclo.Elapsed.create(steps=4)):
        second(elapsed, step(None, 50 + batch)[0])
    second.close()
    rows = read_jsonl(j)
    assert [(r["steps"], r["loss"]) for r in rows] == [
        (0, 0),
        (1, 1),
        (2, 2),
        (3, 3),
        (4, 50),
        (5, 51),
        (6, 52),
    ]


def test_tensorboard_completed_steps_prefixes_and_a_resumed_run_purges(tmp_path):
    pytest.importorskip("tensorboardX", reason="needs ciclo[tensorboard]")
    pytest.importorskip("tensorboard", reason="reading events needs tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import (
        EventAccumulator,
    )

    def both(state, batch):
        return ciclo.logs().add_loss("loss", float(batch)).add_metric(
            "acc_test", 2.0 * batch
        ), state

    prefix = {"": "train/", "test": "val/"}
    ciclo.loop(
        None,
        range(8),
        {ciclo.every(1): [both, ciclo.tensorboard(tmp_path, prefix=prefix)]},
    )
    ciclo.loop(
        None,
        [100 + s for s in range(5, 10)],
        {ciclo.every(1): [both, ciclo.tensorboard(tmp_path, prefix=prefix)]},
        elapsed=ciclo.Elapsed.create(steps=5),
    )
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert {"train/loss", "val/acc"} <= set(events.Tags()["scalars"])
    loss = [(e.step, e.value) for e in events.Scalars("train/loss")]
    # completed steps 1..10, each once: 1..5 from the first run, 6.. replaced
    assert loss == [(1, 0), (2, 1), (3, 2), (4, 3), (5, 4), (6, 105), (7, 106),
                    (8, 107), (9, 108), (10, 109)]  # fmt: skip


def test_bad_prefix_is_a_clear_error(tmp_path):
    pytest.importorskip("tensorboardX", reason="needs ciclo[tensorboard]")
    with pytest.raises(TypeError, match="prefix"):
        ciclo.tensorboard(tmp_path, prefix=3)


class FakeWandb(types.ModuleType):
    """A W&B server's view: runs by id; `resume_from` rewinds, as W&B does."""

    def __init__(self):
        super().__init__("wandb")
        self.inits, self.runs = [], {}

    def init(self, **kwargs):
        self.inits.append(kwargs)
        moment = kwargs.get("resume_from")
        run_id = moment.split("?")[0] if moment else kwargs["id"]
        rows = self.runs.setdefault(run_id, [])
        if moment:
            cut = int(moment.split("_step=")[1])
            rows[:] = [r for r in rows if r[0] < cut]
        fake = self

        class Run:
            def log(self, data, step):
                fake.runs[run_id].append((step, data))

            def finish(self):
                pass

        return Run()


def test_wandb_resumes_and_rewinds_the_same_run(tmp_path, monkeypatch):
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    ciclo.loop(
        None,
        range(8),
        {ciclo.every(1): [step, ciclo.wandb_logger(project="p", dir=str(tmp_path))]},
    )
    ciclo.loop(
        None,
        [100 + s for s in range(5, 10)],
        {
            ciclo.every(1): [
                step,
                ciclo.wandb_logger(project="p", dir=str(tmp_path), prefix="train/"),
            ]
        },
        elapsed=ciclo.Elapsed.create(steps=5),
    )
    first, second = fake.inits
    assert (
        "resume_from" not in first and second["resume_from"] == f"{first['id']}?_step=6"
    )
    (rows,) = fake.runs.values()  # one run, rewound to the checkpoint
    assert [s for s, _ in rows] == list(range(1, 11))
    assert [d.get("loss", d.get("train/loss")) for _, d in rows] == [
        0,
        1,
        2,
        3,
        4,
        105,
        106,
        107,
        108,
        109,
    ]
    # a fresh run (from step 0) is a new W&B run
    ciclo.loop(
        None,
        range(2),
        {ciclo.every(1): [step, ciclo.wandb_logger(project="p", dir=str(tmp_path))]},
    )
    assert fake.inits[2]["id"] != first["id"] and len(fake.runs) == 2
    assert np.all([isinstance(k, str) for k in fake.runs])


def test_a_writer_on_a_schedule_writes_exactly_the_steps_it_fired_at(tmp_path):
    pytest.importorskip("tensorboardX", reason="needs ciclo[tensorboard]")
    pytest.importorskip("tensorboard", reason="reading events needs tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import (
        EventAccumulator,
    )

    j, tb = ciclo.jsonl_logger(tmp_path / "log.jsonl"), ciclo.tensorboard(tmp_path)
    _, history, _ = ciclo.loop(
        None, range(10), {ciclo.every(1): step, ciclo.every(4): [j, tb]}
    )
    assert history.collect("steps") == list(range(10))
    assert [r["steps"] for r in read_jsonl(tmp_path / "log.jsonl")] == [0, 4, 8]
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [
        (1, 0.0),
        (5, 4.0),
        (9, 8.0),
    ]


@pytest.mark.parametrize("cut_at", [6, 8])
def test_a_writer_on_a_schedule_and_a_batch_ctrl_c_cut_before_it(tmp_path, cut_at):
    # Ctrl-C in a task before the writer's: the batch counts (the step ran), and
    # the writer writes its row only if its schedule fires there (every(4): step
    # 8 yes, step 6 no), as it would have had the batch run whole
    pytest.importorskip("tensorboardX", reason="needs ciclo[tensorboard]")
    pytest.importorskip("tensorboard", reason="reading events needs tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import (
        EventAccumulator,
    )

    def cut(state, batch, elapsed):
        if elapsed.steps == cut_at:
            raise KeyboardInterrupt
        return state

    def count(state):
        return state + 1

    j, tb = ciclo.jsonl_logger(tmp_path / "log.jsonl"), ciclo.tensorboard(tmp_path)
    lr = ciclo.lr_monitor(lambda step: 0.5 * step)
    state, history, elapsed = ciclo.loop(
        0,
        range(10),
        {ciclo.every(1): [step, count, cut], ciclo.every(4): [lr, j, tb]},
    )
    assert elapsed.steps == cut_at + 1 == state  # the cut batch counted
    assert history.collect("steps") == list(range(cut_at + 1))
    fired = [s for s in range(cut_at + 1) if s % 4 == 0]
    assert [r["steps"] for r in read_jsonl(tmp_path / "log.jsonl")] == fired
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert [e.step for e in events.Scalars("loss")] == [s + 1 for s in fired]
    # lr_monitor, an observer on the same schedule, ran on the cut batch too
    assert history.collect("steps", "learning_rate")[0] == fired


@pytest.mark.parametrize("writer_first", [False, True])
def test_a_nan_guard_error_leaves_the_bad_row_in_the_writers_log(
    tmp_path, writer_first
):
    # the failing step's row as the writer sees it, whichever of the two runs
    # first in that batch (the history does not commit it)
    def nan_at_5(state, batch):
        loss = jnp.float32(np.nan if batch == 5 else batch)
        return ciclo.logs().add_loss("loss", loss), state

    guard = ciclo.nan_guard(max_lag=0)
    writer = ciclo.jsonl_logger(tmp_path / "log.jsonl")
    callbacks = [writer, guard] if writer_first else [guard, writer]
    with pytest.raises(FloatingPointError, match="at step 5"):
        ciclo.train_loop(
            None, range(10), {ciclo.on_train_step: nan_at_5}, callbacks=callbacks
        )
    rows = read_jsonl(tmp_path / "log.jsonl")
    assert [r["steps"] for r in rows] == [0, 1, 2, 3, 4, 5]
    assert math.isnan(rows[-1]["loss"])


def test_two_tensorboard_writers_on_one_logdir_is_an_error_naming_both(tmp_path):
    pytest.importorskip("tensorboardX", reason="needs ciclo[tensorboard]")
    first = ciclo.tensorboard(tmp_path / "tb")
    second = ciclo.tensorboard(tmp_path / "tb")
    with pytest.raises(ValueError, match="Two TensorBoard writers") as error:
        ciclo.loop(None, range(3), {ciclo.every(1): [step, first, second]})
    assert str(error.value).count("test_writer_steps.py:") == 2  # where each was made
    # one after the other is fine (the first closed at its loop's end), and so
    # are two logdirs in one loop
    ciclo.loop(None, range(3), {ciclo.every(1): [step, first]})
    ciclo.loop(None, range(3), {ciclo.every(1): [step, second]})
    ciclo.loop(
        None,
        range(3),
        {
            ciclo.every(1): [
                step,
                ciclo.tensorboard(tmp_path / "a"),
                ciclo.tensorboard(tmp_path / "b"),
            ]
        },
    )
    # by hand: the second's first write is refused while the first is open
    first, second = (ciclo.tensorboard(tmp_path / "c") for _ in range(2))
    first(ciclo.Elapsed.create(), step(None, 1)[0])  # writing until its close()
    with pytest.raises(ValueError, match="Two TensorBoard writers"):
        second(ciclo.Elapsed.create(), step(None, 1)[0])
    first.close()
    second(ciclo.Elapsed.create(steps=1), step(None, 2)[0])  # now it may
    second.close()


@pytest.mark.parametrize("name", ["csv_logger", "jsonl_logger"])
def test_two_file_writers_on_one_path_is_an_error_naming_both(tmp_path, name):
    # each starts its file afresh: the second would hide the first's rows
    make = getattr(ciclo, name)
    first, second = make(tmp_path / "log"), make(tmp_path / "sub" / ".." / "log")
    tasks = {ciclo.every(1): step, ciclo.every(2): first, ciclo.every(3): second}
    with pytest.raises(ValueError, match="Two writers on one file") as error:
        ciclo.loop(None, range(6), tasks)
    assert str(error.value).count("test_writer_steps.py:") == 2  # where each was made
    assert f"ciclo.{name}(" in str(error.value)
    # one after the other is fine (the first closed at its loop's end)
    ciclo.loop(None, range(6), {ciclo.every(1): step, ciclo.every(2): first})
    ciclo.loop(None, range(6), {ciclo.every(1): step, ciclo.every(3): second})
    # by hand: refused while the first is open, fine after its close()
    first(ciclo.Elapsed.create(), step(None, 1)[0])
    with pytest.raises(ValueError, match="Two writers on one file"):
        second(ciclo.Elapsed.create(), step(None, 1)[0])
    first.close()
    second(ciclo.Elapsed.create(steps=1), step(None, 2)[0])
    second.close()
    # different files, or a csv and a jsonl beside each other, in one loop
    _, history, _ = ciclo.loop(
        None,
        range(4),
        {ciclo.every(1): [step, make(tmp_path / "a"), make(tmp_path / "b")]},
    )
    assert len(history) == 4


@pytest.mark.parametrize("name", ["csv_logger", "jsonl_logger"])
def test_rows_reach_the_file_in_batches_not_per_step(tmp_path, name):
    path = tmp_path / "log"
    on_disk = []

    def look(state, batch):  # after the writer: the rows in the file now
        if path.exists():
            with open(path) as file:
                on_disk.append(sum(1 for _ in file))
        else:
            on_disk.append(0)

    writer = getattr(ciclo, name)(path)
    _, history, _ = ciclo.loop(None, range(200), {ciclo.every(1): [step, writer, look]})
    header = 1 if name == "csv_logger" else 0
    counts = sorted(set(on_disk))
    # a handful of writes (when the history hands rows over: every 64 commits),
    # never one per step, and no row waits long
    assert 3 <= len(counts) <= 200 // 16
    lagging = [i + 1 - (n - header if n else 0) for i, n in enumerate(on_disk)]
    assert max(lagging) <= 2 * 64 + 1  # 2 x the history's lag
    with open(path) as file:  # and all of them at the end
        assert sum(1 for _ in file) - header == len(history) == 200
