"""Writers across interruptions (API.md §6): a run killed (SIGKILL, or Ctrl-C) and
resumed in one line holds each committed step exactly once in every writer — the
rows up to the restored checkpoint kept, the rows logged after it replaced — and
equals an uninterrupted run. Real subprocesses, killed at several moments,
including while a checkpoint is being saved."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import subprocess
import sys

import pytest


def _installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

pytestmark = pytest.mark.slow


def run(ckpts, out, kill=0, how="kill"):
    env = dict(
        os.environ, JAX_PLATFORMS="cpu", WANDB_SILENT="true", WANDB_MODE="offline"
    )
    env.pop("XLA_FLAGS", None)
    # each run starts its own wandb service, as a restarted job does: a service
    # this test process started (an in-process wandb test before) would be shared
    # by the killed run and its rerun, and still hold the killed run's id
    env.pop("WANDB_SERVICE", None)
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, os.path.join(HERE, "_writers_resume_worker.py"),
         str(ckpts), str(out), str(kill), how],
        capture_output=True, text=True, timeout=240, env=env, cwd=ROOT,
    )  # fmt: skip


def jsonl_rows(out):
    with open(out / "log.jsonl") as file:
        rows = [json.loads(line) for line in file]
    return [{k: v for k, v in r.items() if k != "time"} for r in rows]


def csv_rows(out):
    with open(out / "log.csv", newline="") as file:
        return [
            {k: v for k, v in r.items() if k != "time"} for r in csv.DictReader(file)
        ]


def tb_scalars(out):
    from tensorboard.backend.event_processing.event_accumulator import (
        EventAccumulator,
    )

    events = EventAccumulator(str(out / "tb"))  # purges as TensorBoard does
    events.Reload()
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)]
        for tag in events.Tags()["scalars"]
    }


def wandb_runs(out):
    """{run directory: [(step, loss)]} of the offline runs under `out`."""
    from test_writers import wandb_history_steps

    return {
        d: wandb_history_steps(d, "loss")
        for d in sorted((out / "wandb").glob("offline-run-*"))
    }


def complete_steps(ckpts):
    if not ckpts.exists():
        return []
    return sorted(int(n) for n in os.listdir(ckpts) if n.isdigit())


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    base = tmp_path_factory.mktemp("straight")
    proc = run(base / "ckpts", base / "out")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return base / "out"


@pytest.mark.parametrize(
    ("kill", "how"),
    [
        (2, "kill"),  # before any checkpoint: the resumed run starts fresh
        (5, "kill"),  # mid-epoch, two steps after the step-3 checkpoint
        (6, "kill"),  # right after the step-6 save started (in flight)
        (7, "int"),  # Ctrl-C: the loop returns; the rerun resumes at step 6
    ],
)
def test_killed_and_resumed_writers_hold_each_step_once(tmp_path, reference, kill, how):
    ckpts, out = tmp_path / "ckpts", tmp_path / "out"
    killed = run(ckpts, out, kill, how)
    assert killed.returncode == (-9 if how == "kill" else 0), killed.stderr[-3000:]
    restored = (complete_steps(ckpts) or [0])[-1]
    written = (
        [r["steps"] for r in jsonl_rows(out)] if (out / "log.jsonl").exists() else []
    )
    # nothing below the restored checkpoint's step is lost (writers write rows in
    # batches, so a SIGKILL loses at most those since the last one, never a row
    # the checkpoint saved)
    assert set(range(restored)) <= set(written), (written, restored)
    if how == "int":  # the file holds rows from the restored step on: replaced
        assert max(written, default=-1) >= restored, (written, restored)
    resumed = run(ckpts, out)
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    # every step once, equal to the uninterrupted run (bit-identical resume)
    expected = jsonl_rows(reference)
    assert [r["steps"] for r in expected] == list(range(12))
    assert jsonl_rows(out) == expected
    assert csv_rows(out) == csv_rows(reference)
    if _installed("tensorboardX") and _installed("tensorboard"):  # else not written
        scalars, straight = tb_scalars(out), tb_scalars(reference)
        assert set(scalars) == set(straight) >= {"loss", "mse_test"}
        for tag, values in straight.items():
            assert [s for s, _ in scalars[tag]] == [s for s, _ in values], tag
            assert [v for _, v in scalars[tag]] == pytest.approx([v for _, v in values])

    runs = wandb_runs(out) if (out / "wandb").exists() else {}
    if runs:  # W&B: the resumed run continues the crashed one's run (same id)
        last_dir, last = list(runs.items())[-1]
        first_id = next(iter(runs)).name.rsplit("-", 1)[-1]
        if restored:  # resumed: the same W&B run, from the checkpoint on
            assert len(runs) == 2 and last_dir.name.endswith(first_id), runs
        steps = [s for s, _ in last]
        assert steps == list(range(restored + 1, 13))
        ref = dict(next(iter(wandb_runs(reference).values())))
        assert [v for _, v in last] == pytest.approx([ref[s] for s in steps])
