"""Ctrl-C at every point of the commit path never duplicates nor drops a row.

A `sys.settrace` hook delivers SIGINT (runs the installed handler) at the k-th line executed inside
the loop's per-batch path (the interpreter, `History.commit` and its lagged flush
and device transfer, `Logs.merge`, `Elapsed.update`/`update_time`, `batch_size`),
for every k. After each interrupted run: the history's steps are exactly the
batches `elapsed` counts, the state holds exactly those batches, and resuming
from what was returned ends with the history of an uninterrupted run.
"""

from __future__ import annotations

import inspect
import signal
import sys

import jax.numpy as jnp
import pytest

import ciclo
from ciclo import _interrupts, _shapes, _time
from ciclo._history import columns as _columns
from ciclo._history import history as _history
from ciclo._history import transfer as _transfer
from ciclo._input import batch as _batch
from ciclo._logs import Logs
from ciclo._loop.run import Run
from ciclo._loop.state import Apply, LoopState

ALWAYS = ciclo.every(1)
BATCHES = 6


@pytest.fixture(autouse=True)
def _ctrl_c_as_in_a_terminal():
    """Python's own SIGINT handler, as in a terminal: a run started as a
    background job of a non-interactive shell inherits SIGINT ignored, and ciclo
    (rightly) leaves a disposition that is not Python's default alone."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


WATCHED = {
    f.__code__
    for f in (
        _history.History.commit,
        _history.History._append,
        _history.History._append_row,
        _history.History._append_steps,
        _history.History._flush,
        _history.History._fetch_below,
        _history.History._column,
        _history.History._advance,
        _history.History._take,
        _history.History._start,
        _history.History._complete,
        _columns.Column.append,
        _columns._scalar,
        _transfer.get,
        _transfer._begin,
        _transfer.fetch,
        _transfer.start,
        _transfer.Transfer.__init__,
        _transfer.Transfer.ready,
        _transfer.Transfer.result,
        _transfer._scalars,
        _transfer.Stacked.__init__,
        _transfer.Stacked.ready,
        _transfer.Stacked.result,
        _transfer.InPlace.__init__,
        _transfer.InPlace.ready,
        _transfer.InPlace.result,
        _transfer._on_one_cpu,
        _interrupts.Scope.hold,
        _interrupts.Scope.release,
        _shapes.signature,
        _columns.Column.extend,
        Run.batches,
        Apply.__call__,
        LoopState.accumulated_logs.fget,
        Logs.merge,
        Logs.add_entry,
        _time.Elapsed.update,
        _time.Elapsed.update_time,
        _time.new_elapsed,
        _batch.batch_size,
        _batch._leaves,
    )
}


class _Interrupt:
    """A trace hook delivering SIGINT at the `at`-th watched line (the installed
    handler runs there, as for a real signal)."""

    def __init__(self, at: int | None, within: object = None):
        self.at, self.lines, self.where, self.within = at, 0, None, within

    def __enter__(self):
        sys.settrace(self._global)
        return self

    def __exit__(self, *exc):
        sys.settrace(None)

    def _global(self, frame, event, arg):
        if frame.f_code not in WATCHED:
            return None
        if self.within is not None:  # only below a frame running `within`
            outer = frame
            while outer is not None and outer.f_code is not self.within:
                outer = outer.f_back
            if outer is None:
                return None
        return self._local

    def _local(self, frame, event, arg):
        if event == "line":
            self.lines += 1
            if self.lines == self.at:
                self.where = f"{frame.f_code.co_qualname}:{frame.f_lineno}"
                sys.settrace(None)
                frame.f_trace = None
                # what a SIGINT arriving here does: Python runs the installed
                # handler between two bytecodes (ciclo's holds it in a deferred
                # block and raises it as the block ends)
                handler = signal.getsignal(signal.SIGINT)
                if callable(handler):
                    handler(signal.SIGINT, frame)
                else:  # pragma: no cover - no Python handler
                    raise KeyboardInterrupt
        return self._local


def _tasks(value):
    def train(state, batch):  # the state counts the batches it was trained on
        logs = ciclo.logs().add_metric("x", value(batch))
        if batch % 3 == 0:
            logs.add_loss("y", value(-batch))
        return logs, state + 1

    def extra(state, batch):  # a logs-only callback after the step, every other
        return ciclo.logs().add_metric("z", value(10 * batch))

    return {ALWAYS: train, ciclo.every(2): extra}


def _run(value, at, history=None, elapsed=None):
    start = 0 if elapsed is None else elapsed.steps
    with _Interrupt(at, Run.batches.__code__) as trace:
        state, history, elapsed = ciclo.loop(
            start,
            list(range(start, BATCHES)),
            _tasks(value),
            history=history if history is not None else ciclo.history(lag=2),
            elapsed=elapsed,
        )
    return state, history, elapsed, trace


def _rows(history):
    """(step, x, z or None) per row, read through the public API."""
    return [
        (
            int(row["elapsed"]["steps"]),
            float(row["metrics"]["x"]),
            float(row["metrics"]["z"]) if "z" in row["metrics"] else None,
        )
        for row in history
    ]


@pytest.mark.parametrize(
    "value",
    [int, lambda b: jnp.float32(b), "stacked"],
    ids=["python", "device", "device_stacked"],
)
@pytest.mark.slow
def test_ctrl_c_at_every_line_of_the_commit_path(value, monkeypatch):
    stacked = value == "stacked"
    if stacked:  # an accelerator's path: the scalars stacked on the device
        monkeypatch.setattr(_transfer, "_on_one_cpu", lambda first, last: False)
        value = lambda b: jnp.float32(b)
    ready = _transfer.Transfer.ready

    def computed(transfer):  # every run takes the same path: transfers are computed
        for array in transfer._device:
            array.block_until_ready()
        return ready(transfer)

    stacked_ready = _transfer.Stacked.ready

    def stacked_computed(transfer):  # likewise for the one-stack path
        transfer._stacked.block_until_ready()
        return stacked_ready(transfer)

    in_place_ready = _transfer.InPlace.ready

    def in_place_computed(transfer):  # and for the CPU's read in place
        transfer._values[-1].block_until_ready()
        return in_place_ready(transfer)

    monkeypatch.setattr(_transfer.Transfer, "ready", computed)
    monkeypatch.setattr(_transfer.Stacked, "ready", stacked_computed)
    monkeypatch.setattr(_transfer.InPlace, "ready", in_place_computed)
    _run(value, None)  # a first transfer finds jax's array type: a line more
    _, reference, _, trace = _run(value, None)
    total = trace.lines
    expected = _rows(reference)
    assert [s for s, _, _ in expected] == list(range(BATCHES))
    assert total > 100
    points, wheres = set(), set()
    for at in range(1, total + 1):
        state, history, elapsed, trace = _run(value, at)
        assert trace.where is not None
        points.add(trace.where.split(":")[0])
        wheres.add(trace.where)
        n = elapsed.steps
        where = f"interrupted at {trace.where} (line event {at})"
        assert state == n, where  # exactly the counted batches reached the state
        steps = history.collect("steps")
        assert steps == list(range(n)), where  # no duplicate, no gap
        rows = _rows(history)
        assert rows[:-1] == expected[: max(n - 1, 0)], where
        if n:  # the interrupted batch may count without its later callbacks
            assert rows[-1] in (expected[n - 1], (*expected[n - 1][:2], None)), where
        expected_y = [s for s in range(n) if s % 3 == 0]
        if not any(k.endswith(".y") for k in history.keys()):  # noqa: SIM118
            assert expected_y == [], where  # never logged (a KeyError to collect)
        else:
            assert history.collect("steps", "y") == (
                expected_y,
                [float(-s) for s in expected_y],
            ), where
        # resuming from what was returned completes the uninterrupted history
        state, history, elapsed, _ = _run(value, None, history, elapsed)
        assert (state, elapsed.steps) == (BATCHES, BATCHES), where
        rows = _rows(history)
        assert [r[:2] for r in rows] == [r[:2] for r in expected], where
        assert all(r == e or r[2] is None for r, e in zip(rows, expected)), where
    assert {
        "HistoryStore._append_row",
        "HistoryStore._advance",
        "Logs.merge",
        "batch_size",
    } <= points
    if value is not int:  # device scalars of one dtype: read in place on a CPU
        read = "Stacked.result" if stacked else "InPlace.result"
        assert {"start", "_scalars", read, "Column.extend"} <= points
    # written out in `Run.batches` (every line of it is watched): the next
    # batch's clock and the commit's deferral (the scope's hold and release)
    source, first = inspect.getsourcelines(Run.batches)
    clock = "steps, samples, date = steps_after, samples_after, now()"
    for text in (clock, "scope.busy += 1", "scope.busy -= 1"):
        line = first + next(i for i, code in enumerate(source) if text in code)
        assert f"Run.batches:{line}" in wheres, text


@pytest.mark.parametrize("value", [int, jnp.float32], ids=["python", "device"])
def test_a_cut_short_commit_or_read_is_healed(value):
    def fresh():
        history = ciclo.history(lag=1)  # every commit flushes
        history.commit(ciclo.Elapsed.create(), ciclo.logs().add_metric("a", value(1)))
        return history

    def second():
        return ciclo.logs().add_metric("a", value(2)).add_metric("b", value(3))

    elapsed = ciclo.Elapsed.create(steps=1)
    commit = ciclo.History.commit.__code__
    history, row = fresh(), second()
    with _Interrupt(None, commit) as trace:
        history.commit(elapsed, row)
    assert trace.lines > 10
    for at in range(1, trace.lines + 1):
        history, row = fresh(), second()
        with _Interrupt(at, commit) as trace, pytest.raises(KeyboardInterrupt):
            history.commit(elapsed, row)
        where = trace.where
        published = len(history) == 2
        assert history.collect("steps", "a") == (
            ([0, 1], [1, 2]) if published else ([0], [1])
        ), where
        if published:
            assert history.collect("b") == [3], where
        else:  # the cut-short row's entry was never logged
            with pytest.raises(KeyError):
                history.collect("b")
        keys = history.keys()
        assert ("metrics.b" in keys) == published, where
        if not published:  # the caller commits the row again: once
            history.commit(elapsed, row)
        assert history.collect("steps", "a", "b") == ([1], [2], [3]), where
        history.commit(elapsed.update(1), ciclo.logs().add_metric("a", value(4)))
        assert history.collect("steps", "a") == ([0, 1, 2], [1, 2, 4]), where

    # Ctrl-C in a read's flush (the transfer) loses nothing
    def pending():
        history = ciclo.history(lag=100)
        for step in range(3):
            history.commit(
                ciclo.Elapsed.create(steps=step),
                ciclo.logs().add_metric("a", value(step)),
            )
        return history

    collect = ciclo.History.collect.__code__
    history = pending()
    with _Interrupt(None, collect) as trace:
        history.collect("a")
    assert trace.lines > 5
    for at in range(1, trace.lines + 1):
        history = pending()
        with _Interrupt(at, collect), pytest.raises(KeyboardInterrupt):
            history.collect("a")
        assert history.collect("steps", "a") == ([0, 1, 2], [0, 1, 2])


def test_interrupted_batch_that_did_not_reach_the_state_leaves_no_row():
    def train(state, batch):
        return ciclo.logs().add_metric("x", batch), state + 1

    def log(state, batch):
        return ciclo.logs().add_metric("x", batch)

    def interrupt(batch):
        if batch == 3:
            raise KeyboardInterrupt

    # batch 3 logged before the step but never reached the state: it is redone
    state, history, elapsed = ciclo.loop(
        0, range(10), {ALWAYS: [log, interrupt, train]}
    )
    assert (state, elapsed.steps) == (3, 3)
    assert history.collect("steps") == [0, 1, 2]
