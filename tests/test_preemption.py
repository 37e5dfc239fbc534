"""Interrupts around checkpoints (API.md §11): Ctrl-C as a save starts finishes it;
SIGTERM under `jax.distributed` saves one agreed step on every process; an
interrupt while `resume=` reads the data back is clean and releases the
directory's lock; the signal handlers are the loop's only while it runs.

SIGTERM of a single process (the step saved, status 143, the exact resume) is in
test_resume.py, beside the SIGKILL tests it shares a worker with."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import warnings

import jax.numpy as jnp
import pytest

import ciclo

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _workers import _env, free_port  # noqa: E402

TASKS = {ciclo.on_train_step: lambda state, batch: state + batch}
NOISE = ("Traceback", "Exception ignored", "cannot schedule new futures", "Error")


# -- Ctrl-C as a save starts --------------------------------------------------------
@pytest.mark.slow
def test_ctrl_c_as_a_save_starts_finishes_the_save_and_exits_promptly(tmp_path):
    tries = 26  # 20 as the save starts, then 6 as the loop's end waits for it
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, os.path.join(HERE, "_sigint_save_worker.py"),
         str(tmp_path), str(tries)],
        capture_output=True, text=True, timeout=180, env=_env(),
    )  # fmt: skip
    took = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr
    assert not [n for n in NOISE if n in proc.stderr], proc.stderr
    results = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(results) == tries
    for result in results:  # every save finished, and the loop returned
        assert result["folder"] == ["1"], result
        assert result["restored"] == 1 and result["exact"], result
        if result["try"] < 20:  # early: Ctrl-C ended it
            assert 1 <= result["returned"] < 200, result
        else:  # Ctrl-C at its end: the save is waited for, the loop returns
            assert result["returned"] == 200, result
    assert took < 120  # no try waited on orbax's threads at exit


# -- an interrupt while resume= reads the data back ----------------------------------
class Loader:
    """A re-iterable loader without a position API (resume reads it back) that
    raises KeyboardInterrupt (as Ctrl-C would) when its `fail_at`-th batch of a
    pass is read."""

    def __init__(self, n, fail_at=None):
        self.n, self.fail_at, self.read = n, fail_at, 0

    def __iter__(self):
        for i in range(self.n):
            if i == self.fail_at:
                raise KeyboardInterrupt
            self.read += 1
            yield jnp.float32(i + 1)


def heartbeats(known: set | frozenset = frozenset()) -> set[threading.Thread]:
    """The lock's heartbeat threads still running, but those `known` (a released
    one ends at once; waited for, up to 5 s each)."""
    for thread in threading.enumerate():
        if "_heartbeat" in thread.name and thread not in known:
            thread.join(timeout=5)
    return {t for t in threading.enumerate() if "_heartbeat" in t.name} - set(known)


@pytest.mark.parametrize("kind", ["iterator", "epochs"])
@pytest.mark.parametrize("catch", [True, False])
def test_an_interrupt_during_read_back_is_clean_and_frees_the_lock(
    tmp_path, kind, catch
):
    def data(fail_at=None):
        loader = Loader(4, fail_at)
        return iter(loader) if kind == "iterator" else loader

    def run(dataset, stop, **kwargs):
        epochs = None if kind == "iterator" else 4
        return ciclo.train_loop(
            jnp.float32(0), dataset, TASKS, stop=stop, epochs=epochs,
            epoch_duration=2 if kind == "iterator" else None, resume=tmp_path,
            **kwargs,
        )  # fmt: skip

    # heartbeats of by-hand checkpoints other tests of this process left open
    before = {t for t in threading.enumerate() if "_heartbeat" in t.name}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the iterator's skip-forward warning
        run(data(), stop=3)  # saved at step 3 (its stop)
    # read back: 3 batches (the 3rd raises); said in one line with the count
    with pytest.warns(UserWarning, match="the first 3 batches"):
        if catch:  # ends as in training: returns what was reached (restored)
            state, history, elapsed = run(data(fail_at=2), stop=8)
            assert (float(state), elapsed.steps) == (1 + 2 + 3, 3)
            assert history.collect("steps") == []  # no step logged anything
        else:
            with pytest.raises(KeyboardInterrupt):
                run(data(fail_at=2), stop=8, catch_keyboard_interrupt=False)
    assert not (tmp_path / "ciclo.lock").exists()
    assert not heartbeats(before)
    with warnings.catch_warnings():  # the directory is free for the next run
        warnings.simplefilter("ignore")
        state, _, elapsed = run(data(), stop=4)
    assert elapsed.steps == 4 and float(state) == 1 + 2 + 3 + 4
    assert not (tmp_path / "ciclo.lock").exists()


def test_querying_a_checkpoint_after_its_loop_does_not_claim_its_directory(
    tmp_path,
):
    ckpt = ciclo.checkpoint(tmp_path)
    ciclo.train_loop(jnp.float32(0), [1.0, 2.0], TASKS, callbacks=[ckpt])
    assert ckpt.steps() == [2] and ckpt.latest_step() == 2
    assert not (tmp_path / "ciclo.lock").exists()
    state, _, elapsed = ciclo.train_loop(  # another checkpoint of that directory
        jnp.float32(0), lambda start: [1.0, 2.0, 3.0, 4.0][start:], TASKS,
        resume=tmp_path,
    )  # fmt: skip
    assert (float(state), elapsed.steps) == (10.0, 4)
    assert ckpt.steps() == [4]


# -- the handlers ------------------------------------------------------------------
def test_the_loop_handles_sigterm_only_while_it_runs_in_the_main_thread():
    seen = {}

    def look(state, batch):
        seen[threading.current_thread().name] = signal.getsignal(signal.SIGTERM)

    ciclo.loop(0, [1], {ciclo.every(1): look})
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # put back
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert callable(seen.pop("MainThread"))  # the loop's, while it ran

    worker = threading.Thread(
        target=ciclo.loop, args=(0, [1], {ciclo.every(1): look}), name="worker"
    )
    worker.start()
    worker.join()
    assert seen.pop("worker") is signal.SIG_DFL  # never from another thread

    def mine(signum, frame):
        pass

    previous = signal.signal(signal.SIGTERM, mine)
    try:  # a handler of the user's is left alone
        ciclo.loop(0, [1], {ciclo.every(1): look})
        assert seen.pop("MainThread") is mine
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, previous)


# -- SIGTERM under jax.distributed ------------------------------------------------
@pytest.mark.slow
def test_sigterm_under_jax_distributed_saves_one_step_on_every_process(tmp_path):
    directory = tmp_path / "ckpts"
    group = ["2", str(free_port())]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                os.path.join(HERE, "_preempt_multihost_worker.py"),
                str(i),
                *group,
                str(directory),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=_env(),
        )
        for i in range(2)
    ]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=240)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    codes = [proc.returncode for proc in procs]
    assert codes == [-signal.SIGTERM] * 2, "\n".join(outputs)
    last = [re.findall(r"^STEP (\d+)$", out, re.M)[-1] for out in outputs]
    assert last[0] == last[1], "\n".join(outputs)  # both stopped after one step
    stop = int(last[0])
    assert 10 < stop < 400  # after the signal, before the end
    assert sorted(os.listdir(directory)) == [str(stop)]  # saved there; lock gone
    state, elapsed = ciclo.restore(directory, {"w": jnp.zeros(8)})
    assert elapsed.steps == stop  # the state trained on batches 0 .. stop - 1
    assert (state["w"] == sum(range(stop))).all(), state
