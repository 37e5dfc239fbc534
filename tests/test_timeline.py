"""The loop's timeline (API.md §3): elapsed / elapsed_after, the two stop forms,
end-of-loop hooks, schedules that hold unpicklable state, import cost."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import ciclo


def _events_with(stopper):
    """Runs the same three callbacks per batch in `loop` and in `train_loop`."""

    def record(name):
        def callback(state, batch, elapsed, loop_state):
            events.append((name, elapsed.steps))

        return callback

    runs = {}
    for kind in ("loop", "train_loop"):
        events = []
        first, after = record("first"), record("after")
        if kind == "loop":
            _, history, elapsed = ciclo.loop(
                None, range(10), {ciclo.every(1): [first, stopper, after]}
            )
        else:
            _, history, elapsed = ciclo.train_loop(
                None, range(10), {ciclo.on_train_step: [first, stopper, after]}
            )
        runs[kind] = (events, elapsed.steps)
    return runs


def test_stop_iteration_ends_after_the_current_callback_in_every_loop():
    def stopper(state, batch, elapsed, loop_state):
        if elapsed.steps == 2:
            loop_state.stop_iteration = True

    runs = _events_with(stopper)
    assert runs["loop"] == runs["train_loop"]
    events, steps = runs["loop"]
    assert events[-1] == ("first", 2)  # "after" did not run in the stopping batch
    assert steps == 3  # the batch reached the state, so it counts


def test_stop_after_batch_ends_at_the_end_of_the_batch_in_every_loop():
    def stopper(state, batch, elapsed, loop_state):
        if elapsed.steps == 2:
            loop_state.stop_after_batch()

    runs = _events_with(stopper)
    assert runs["loop"] == runs["train_loop"]
    events, steps = runs["loop"]
    assert events[-2:] == [("first", 2), ("after", 2)]
    assert steps == 3


def test_stop_after_batch_in_on_start_runs_no_batch():
    ran = []
    _, _, elapsed = ciclo.loop(
        None,
        range(5),
        {ciclo.every(1): lambda: ran.append(1)},
        on_start=lambda state, batch, elapsed, ls: ls.stop_after_batch(),
    )
    assert ran == [] and elapsed.steps == 0


def test_elapsed_after_counts_the_batch_with_uneven_batches():
    batches = [np.zeros((4, 2)), np.zeros((4, 2)), np.zeros((3, 2))]  # uneven tail
    seen = []

    def record(state, batch, elapsed, loop_state):
        assert loop_state.elapsed is elapsed
        after = loop_state.elapsed_after
        seen.append((elapsed.steps, elapsed.samples, after.steps, after.samples))

    _, _, elapsed = ciclo.loop(None, batches, {ciclo.every(1): record})
    assert seen == [(0, 0, 1, 4), (1, 4, 2, 8), (2, 8, 3, 11)]
    assert (elapsed.steps, elapsed.samples) == (3, 11)


def test_the_largest_first_axis_is_the_batch_size():
    batch = {"x": np.zeros((3, 2)), "y": np.zeros((4, 1))}
    _, _, elapsed = ciclo.loop(None, [batch, batch], {ciclo.every(1): ciclo.noop})
    assert elapsed.samples == 8
    _, _, elapsed = ciclo.loop(
        None, [batch], {ciclo.every(1): ciclo.noop}, batch_size_fn=lambda s: 3
    )
    assert elapsed.samples == 3


def test_epoch_end_reads_elapsed_after_with_uneven_batches():
    batches = [np.zeros((4, 1))] * 2 + [np.zeros((2, 1))] * 3  # samples 4,8,10,12,14
    ends = []
    ciclo.train_loop(
        None,
        batches,
        {
            ciclo.on_train_step: ciclo.noop,
            ciclo.on_epoch_end: lambda s, b, e, ls: ends.append(
                ls.elapsed_after.samples
            ),
        },
        epoch_duration=ciclo.at(samples=6),
    )
    # crossings of 6 and 12, then the last batch (exhausted data) ends an epoch too
    assert ends == [8, 12, 14]


def test_end_hooks_run_once_for_self_registered_callback_objects():
    class Writer:
        def __init__(self):
            self.ended = 0

        def on_train_batch_end(self, state, batch):
            pass

        def on_epoch_end(self, state, batch):
            pass

        def __loop_end__(self, loop_state):
            self.ended += 1

    writer = Writer()
    ciclo.train_loop(
        None, range(3), {ciclo.on_train_step: ciclo.noop}, callbacks=[writer]
    )
    assert writer.ended == 1

    def boom(state, batch):
        raise RuntimeError("boom")

    writer = Writer()
    with pytest.raises(RuntimeError, match="boom"):
        ciclo.train_loop(
            None, range(3), {ciclo.on_train_step: boom}, callbacks=[writer]
        )
    assert writer.ended == 1


def test_a_schedule_holding_a_lock_works_in_several_loops():
    class Locked(ciclo.Schedule):
        def __init__(self):
            self.lock = threading.Lock()
            self.calls = 0

        def __call__(self, elapsed):
            with self.lock:
                self.calls += 1
            return elapsed.steps % 2 == 0

    schedule = Locked()
    fired = []
    for _ in range(2):
        ciclo.loop(None, range(4), {schedule: lambda s, b, e: fired.append(e.steps)})
    assert fired == [0, 2, 0, 2] and schedule.calls == 8


def test_stateful_schedules_still_share_nothing_between_loops():
    schedule = ciclo.every(samples=4)
    data = [np.zeros((2,))] * 4
    fired = []
    for _ in range(2):
        ciclo.loop(None, data, {schedule: lambda s, b, e: fired.append(e.samples)})
    assert fired == [0, 4, 0, 4]


def test_unreadable_signature_is_an_error_naming_the_callback():
    class NoSignature:
        __signature__ = "not a signature"

        def __call__(self, *args):
            return None

    with pytest.raises(TypeError, match="cannot read its signature"):
        ciclo.loop(None, range(2), {ciclo.every(1): NoSignature()})


def test_test_loop_without_a_test_step_is_an_error():
    with pytest.raises(ValueError, match="nothing runs on `on_test_step`"):
        ciclo.test_loop(None, range(2))
    with pytest.raises(ValueError, match="nothing runs on `on_predict_step`"):
        ciclo.predict_loop(None, range(2))


def test_uncalled_factory_in_callbacks_names_the_fix():
    with pytest.raises(
        TypeError, match=r"class keras_bar, not a callback.*keras_bar\(\.\.\.\)"
    ):
        ciclo.train_loop(
            None,
            range(2),
            {ciclo.on_train_step: ciclo.noop},
            callbacks=[ciclo.keras_bar],
        )


def test_module_names_do_not_shadow_public_functions():
    import ciclo.callbacks

    assert callable(ciclo.logs) and callable(ciclo.history) and callable(ciclo.loop)
    assert callable(ciclo.callbacks.inner_loop)
    assert set(ciclo.__all__) <= set(dir(ciclo))
    for name in ciclo.__all__:
        assert getattr(ciclo, name) is not None


def _run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_loop_language_imports_without_orbax_flax_or_bars():
    result = _run_python(
        """
        import sys
        for name in ("orbax", "flax", "pkbar", "tqdm", "einop", "clu"):
            sys.modules[name] = None  # blocked: importing it raises ImportError
        import ciclo
        def step(state, batch):
            return ciclo.logs().add_metric("x", batch), state + batch
        state, history, _ = ciclo.train_loop(0, range(4), {ciclo.on_train_step: step})
        assert state == 6 and history.collect("x") == [0, 1, 2, 3]
        try:
            ciclo.checkpoint
        except ImportError as error:
            assert "ciclo[checkpoint]" in str(error), error
        else:
            raise AssertionError("no ImportError without orbax")
        try:
            ciclo.keras_bar
        except ImportError as error:
            assert "ciclo[bars]" in str(error), error
        else:
            raise AssertionError("no ImportError without pkbar")
        print("ok")
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_importing_ciclo_does_not_start_the_jax_backend():
    # multi-host users import ciclo (and its managed API) before
    # jax.distributed.initialize, which must come before any JAX computation
    result = _run_python(
        """
        import socket
        import ciclo, ciclo.callbacks
        from ciclo import managed
        import jax
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=1, process_id=0)
        _, history, _ = ciclo.loop(0, range(3), {ciclo.every(1): lambda s, b: (
            ciclo.logs().add_metric("x", jax.numpy.float32(b)), s)})
        assert history.collect("x") == [0.0, 1.0, 2.0]
        print("ok")
        """
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "ok"
