"""The loop must not wait for the device each step (API.md §9), on any backend.

Each test holds one step's device computation (`_gate.Gate`: a host callback in
the jitted step that waits until the loop is N steps further) and checks that the
loop dispatched those N steps without waiting: a per-step sync would leave the held
step's callback waiting for a release that never comes, and the test fails after
the gate's timeout instead of hanging. Timing-free, so it holds on a GPU as on the
CPU. The runs are also made under `jax.transfer_guard_device_to_host("disallow")`
(enforced on the CPU too, `_guard`): ciclo's own fetches are explicit, and it makes
no implicit transfer in the step path.
"""

from __future__ import annotations

import contextlib
import io

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _gate import Gate
from _guard import disallow_device_to_host

import ciclo

STEPS = 32  # hold (2) + tries (6) + ahead (8) + a margin: the loop gets that far


def gated_step(gate: Gate):
    """A jitted step whose step `batch` (the step's index) the gate can hold."""

    @jax.jit
    def step(state, batch):
        held = gate.value(batch)  # every later step depends on it through `state`
        logs = ciclo.logs()
        logs.add_loss("loss", (state + batch) / 10 + held)
        logs.add_metric("state", state + held)
        return logs, state + 1.0 + held

    return step


def run_loop(gate: Gate, *callbacks, history=None, steps: int = STEPS):
    data = [np.float32(i) for i in range(steps)]
    with disallow_device_to_host():
        return ciclo.loop(
            jnp.float32(0),
            data,
            {ciclo.every(1): [gate.delay, gated_step(gate), *callbacks, gate.tick]},
            history=history,
        )


@contextlib.contextmanager
def quiet():
    with contextlib.redirect_stdout(io.StringIO()) as out:
        yield out


def test_host_dispatches_step_n_plus_8_while_step_n_computes():
    # no drain: with the history and a bar on, the host dispatches step n + 8
    # while step n is still computing on the device
    with Gate(hold=2, ahead=8) as gate, quiet() as out:
        state, history, elapsed = run_loop(
            gate,
            ciclo.keras_bar(total=STEPS, interval=0.0, plain=False),
            history=ciclo.history(lag=4),  # lagged transfers started in the gap
        )
    gate.check()
    assert gate.dispatched_at_release >= gate.held + 8 + 1
    assert elapsed.steps == STEPS
    assert history.collect("state") == [float(i) for i in range(STEPS)]
    assert f"{STEPS}/{STEPS}" in out.getvalue()  # the bar's final line


def _writers(tmp_path):
    def tensorboard():
        pytest.importorskip("tensorboardX", reason="ciclo[tensorboard] not installed")
        return ciclo.tensorboard(tmp_path / "tb")

    return {
        # each bar redraws (or prints a plain line) at every step: it reads the
        # values every step, lagged
        "keras_bar": lambda: ciclo.keras_bar(total=STEPS, interval=0.0, plain=False),
        "keras_bar_plain": lambda: ciclo.keras_bar(
            total=STEPS, plain=True, plain_interval=0.0
        ),
        "tqdm_bar": lambda: ciclo.tqdm_bar(
            total=STEPS, interval=0.0, plain=False, file=io.StringIO()
        ),
        "tqdm_bar_plain": lambda: ciclo.tqdm_bar(
            total=STEPS, plain=True, plain_interval=0.0, file=io.StringIO()
        ),
        "csv_logger": lambda: ciclo.csv_logger(tmp_path / "log.csv"),
        "jsonl_logger": lambda: ciclo.jsonl_logger(tmp_path / "log.jsonl"),
        "tensorboard": tensorboard,
        "nan_guard": lambda: ciclo.nan_guard(max_lag=12),  # waits past max_lag
    }


@pytest.mark.parametrize(
    "name",
    [
        "keras_bar",
        "keras_bar_plain",
        "tqdm_bar",
        "tqdm_bar_plain",
        "csv_logger",
        "jsonl_logger",
        "tensorboard",
        "nan_guard",
    ],
)
def test_each_lagged_reader_lets_the_host_run_ahead(name, tmp_path):
    callback = _writers(tmp_path)[name]()
    with Gate(hold=2, ahead=8) as gate, quiet():
        _, history, elapsed = run_loop(gate, callback, history=ciclo.history(lag=4))
    gate.check()
    assert elapsed.steps == STEPS
    assert len(history.collect("loss")) == STEPS
    if hasattr(callback, "close"):
        callback.close()


def test_loop_returns_before_the_device_finishes():
    # the held step is released only after `loop` returned: had the loop (or its
    # history) waited for the last steps' values, it could not have returned
    with Gate(hold=STEPS - 4, ahead=None, timeout=10) as gate:
        state, history, elapsed = run_loop(gate, history=ciclo.history(lag=4))
        returned_pending = not state.is_ready()
        gate.release()
    state.block_until_ready()
    gate.check()
    assert returned_pending
    assert elapsed.steps == STEPS
    assert history.collect("state") == [float(i) for i in range(STEPS)]


def test_a_sync_lagged_less_than_the_gap_is_caught_fast():
    # the mechanism itself: a callback reading the value of 4 steps ago (an implicit
    # sync, lagged) makes the gate fail after its timeout, instead of hanging
    seen = []

    def lagged_sync(state):
        seen.append(state)
        if len(seen) > 4:
            jax.block_until_ready(seen.pop(0))

    with Gate(hold=2, ahead=8, timeout=1.0) as gate:
        run_loop(gate, lagged_sync)
    with pytest.raises(AssertionError, match="host sync"):
        gate.check()


# -- the predefined loops: managed steps, a test loop, fused steps -------------------

_W = np.array([1.0, -2.0, 0.5], np.float32)
_X = np.random.default_rng(0).normal(size=(STEPS, 4, 3)).astype(np.float32)


def managed_steps(gate: Gate):
    from ciclo import managed

    @managed.train_step
    def train_step(state, batch):
        x, y, index = batch
        loss = jnp.mean((x @ state.params - y) ** 2) + gate.value(index[0])
        return ciclo.logs().add_loss("loss", loss), state

    @managed.step
    def test_step(state, batch):
        x, y, _ = batch
        return ciclo.logs().add_metric(
            "mse", jnp.mean((x @ state.params - y) ** 2)
        ), state

    return train_step, test_step


def batches(n: int = STEPS):
    return [(x, x @ _W, np.full((4,), i, np.float32)) for i, x in enumerate(_X[:n])]


@pytest.mark.parametrize(
    ("steps_per_call", "plain"), [(None, False), (4, False), (None, True)]
)
def test_train_loop_with_test_loop_bar_writers_runs_ahead(
    steps_per_call, plain, tmp_path
):
    # the test loop's results are aggregated on the host at each epoch end (a sync
    # per epoch, by design): the epochs end after the gap
    from ciclo import managed

    with Gate(hold=2, ahead=6) as gate, quiet():
        train_step, test_step = managed_steps(gate)
        state = managed.ManagedState.create(
            params=jnp.zeros(3), tx=optax.sgd(0.05), strategy="jit"
        )
        kwargs = {} if steps_per_call is None else {"steps_per_call": steps_per_call}
        with disallow_device_to_host():
            state, history, elapsed = ciclo.train_loop(
                state,
                batches(),
                {
                    ciclo.on_train_batch_begin: gate.delay,
                    ciclo.on_train_step: train_step,
                    ciclo.on_test_step: test_step,
                    ciclo.on_train_batch_end: gate.tick,
                },
                callbacks=[
                    # plain: a line per epoch (its summary) and per interval
                    ciclo.keras_bar(
                        total=STEPS, interval=0.0, plain=plain, plain_interval=0.0
                    ),
                    ciclo.csv_logger(tmp_path / "log.csv"),
                ],
                test_dataset=lambda: batches(2),
                epoch_duration=STEPS // 2,
                stop=STEPS,
                **kwargs,
            )
    gate.check()
    assert elapsed.steps == STEPS
    assert len(history.collect("loss")) == STEPS
    assert len(history.collect("mse_test")) == 2


# -- the transfer guard: ciclo's fetches are explicit, the user's implicit ones not --


def test_a_users_implicit_read_in_the_loop_is_still_refused():
    # ciclo marks only its own deliberate fetches explicit: the guard still finds
    # the hidden sync a user's callback makes
    def peek(state, batch, elapsed, loop_state):
        float(loop_state.logs.losses.loss)  # an implicit device-to-host read

    with Gate(hold=0, ahead=None) as gate:
        gate.release()  # nothing held: only the guard is tested here
        with pytest.raises(Exception, match="Disallowed device-to-host transfer"):
            run_loop(gate, peek, history=ciclo.history(lag=2), steps=4)


def test_checkpoint_and_lagged_readers_work_under_the_guard(tmp_path):
    # the checkpoint's save (orbax copies the state to the host) and every lagged
    # reader are deliberate fetches: they pass a user's "disallow" guard
    from ciclo import managed

    with Gate(hold=0, ahead=None) as gate:
        gate.release()
        train_step, test_step = managed_steps(gate)
        state = managed.ManagedState.create(
            params=jnp.zeros(3), tx=optax.sgd(0.05), strategy="jit"
        )
        with disallow_device_to_host(), quiet():
            state, history, elapsed = ciclo.train_loop(
                state,
                batches(8),
                {ciclo.on_train_step: train_step, ciclo.on_test_step: test_step},
                callbacks=[
                    ciclo.checkpoint(tmp_path / "ckpt", monitor="mse_test"),
                    ciclo.early_stopping("mse_test", patience=10),
                    ciclo.nan_guard(),
                    ciclo.tqdm_bar(total=8, interval=0.0, plain=False),
                ],
                test_dataset=lambda: batches(2),
                epoch_duration=4,
                stop=8,
                history=ciclo.history(lag=2),
            )
    restored, restored_elapsed = ciclo.restore(tmp_path / "ckpt", state)
    assert restored_elapsed.steps == elapsed.steps == 8
    np.testing.assert_allclose(restored.params, state.params)
    assert len(history.collect("loss")) == 8


def test_the_guard_refuses_implicit_reads_only():
    # the helper the tests above rely on: on an accelerator JAX's guard, on the CPU
    # its rule enforced by `_guard` (where JAX's own guard lets everything through)
    value = jnp.arange(3.0) + 1
    with disallow_device_to_host():
        for implicit in (float, bool, lambda x: x.copy_to_host_async()):
            with pytest.raises(Exception, match="Disallowed device-to-host transfer"):
                implicit(value[0] + 1)
        np.testing.assert_array_equal(jax.device_get(value), [1.0, 2.0, 3.0])
    assert float(value[0]) == 1.0  # outside: allowed again


# -- each configuration in a fresh process -------------------------------------------
# In one process an earlier test can leave state behind that hides a drain (a type
# learnt from a first value, a compiled function): each configuration here runs
# alone in its own interpreter (`_gate_worker.py`), with the loop's default
# history, and the gate holds a step until the loop is far past it.

GATE_CONFIGS = [
    "fused",  # train_loop(..., steps_per_call=32), nothing else
    "writers",  # csv, jsonl (and TensorBoard when installed)
    "bars",  # keras_bar and tqdm_bar, redrawn in place and plain, every step
    "nan_guard",
    "lr_monitor",  # from the optimizer state and from a schedule
    "checkpoint",  # saving at the epoch ends, after the gap
    "test_loop",  # a test loop at the epoch ends, after the gap
]


@pytest.mark.slow
@pytest.mark.parametrize("config", GATE_CONFIGS)
def test_each_configuration_runs_ahead_in_a_fresh_process(config, tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).parent
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(here.parent), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    proc = subprocess.run(
        [sys.executable, str(here / "_gate_worker.py"), config, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=here,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.strip().endswith(f"ok {config}"), proc.stdout


# -- one stream: only the history's transfer moves values to the host -----------------


@pytest.mark.parametrize("steps_per_call", [None, 4])
def test_observers_make_no_transfer_of_their_own(steps_per_call, tmp_path, monkeypatch):
    # bars, nan_guard, writers and lr_monitor read the loop's History: every
    # device-to-host copy ciclo makes during the run comes from its one transfer
    # module (`ciclo/_history/transfer.py`)
    import pathlib
    import sys

    from ciclo import managed

    package = pathlib.Path(ciclo.__file__).parent
    callers: list[str] = []

    def caller() -> None:
        frame = sys._getframe(2)
        while frame is not None:
            path = pathlib.Path(frame.f_code.co_filename)
            if package in path.parents:
                callers.append(path.relative_to(package.parent).as_posix())
                return
            frame = frame.f_back

    device_get, array_type = jax.device_get, type(jnp.zeros(()))
    copy = array_type.copy_to_host_async

    def counted_get(*args, **kwargs):
        caller()
        return device_get(*args, **kwargs)

    def counted_copy(self):
        caller()
        return copy(self)

    schedule = optax.linear_schedule(0.1, 0.0, STEPS)
    tx = optax.inject_hyperparams(optax.sgd)(learning_rate=schedule)
    state = managed.ManagedState.create(params=jnp.zeros(3), tx=tx, strategy="jit")
    with Gate(hold=0, ahead=None) as gate, quiet():
        gate.release()  # nothing held
        train_step, test_step = managed_steps(gate)
        monkeypatch.setattr(jax, "device_get", counted_get)
        monkeypatch.setattr(array_type, "copy_to_host_async", counted_copy)
        kwargs = {} if steps_per_call is None else {"steps_per_call": steps_per_call}
        _, history, elapsed = ciclo.train_loop(
            state,
            batches(),
            {ciclo.on_train_step: train_step, ciclo.on_test_step: test_step},
            callbacks=[
                ciclo.keras_bar(total=STEPS, interval=0.0, plain=False),
                ciclo.tqdm_bar(plain=True, plain_interval=0.0, file=io.StringIO()),
                ciclo.nan_guard(),
                ciclo.csv_logger(tmp_path / "log.csv"),
                ciclo.jsonl_logger(tmp_path / "log.jsonl"),
                ciclo.lr_monitor(),
                ciclo.lr_monitor(schedule, name="scheduled"),
            ],
            test_dataset=lambda: batches(2),
            epoch_duration=STEPS // 2,
            stop=STEPS,
            **kwargs,
        )
    assert elapsed.steps == STEPS and len(history.collect("loss")) == STEPS
    assert callers, "no transfer seen: the counting is broken"
    assert set(callers) == {"ciclo/_history/transfer.py"}, sorted(set(callers))
