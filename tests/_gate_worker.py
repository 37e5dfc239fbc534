"""One no-sync gate configuration, run in a fresh process (see test_no_sync.py).

Usage: python _gate_worker.py CONFIG TMPDIR

Each configuration trains a managed state whose step `hold` the gate holds on the
device (`_gate.Gate`) until the loop has dispatched `ahead` more steps, under
`disallow_device_to_host` (`_guard`): the loop, with only that configuration's
observers, must get there without waiting for the device (no blocking read
between epoch ends). Prints `ok CONFIG` when it did; an `AssertionError` (exit
status 1) names the wait otherwise. Nothing ran before it in the process, so no
state learnt by an earlier test (a cached type, a compiled function) hides a
drain.

On the CPU, jax itself stops dispatching a few tens of unfused steps past a
held one (a raw jitted loop with no ciclo in it too), so the unfused
configurations hold a step late enough that the window after it spans one of
the history's transfers (every 64 commits), and look about 20 steps ahead.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax.numpy as jnp
import numpy as np
import optax
from _gate import Gate
from _guard import disallow_device_to_host

import ciclo
from ciclo import managed

_W = np.array([1.0, -2.0, 0.5], np.float32)


def batches(n: int) -> list:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 4, 3)).astype(np.float32)
    return [(x[i], x[i] @ _W, np.full((4,), i, np.float32)) for i in range(n)]


def steps(gate: Gate):
    @managed.train_step
    def train_step(state, batch):
        x, y, index = batch
        loss = jnp.mean((x @ state.params - y) ** 2) + gate.value(index[0])
        return ciclo.logs().add_loss("loss", loss).add_metric("index", index[0]), state

    @managed.step
    def test_step(state, batch):
        x, y, _ = batch
        mse = jnp.mean((x @ state.params - y) ** 2)
        return ciclo.logs().add_metric("mse", mse), state

    return train_step, test_step


def create(tx=None) -> managed.ManagedState:
    tx = optax.sgd(0.01) if tx is None else tx
    return managed.ManagedState.create(params=jnp.zeros(3), tx=tx, strategy="jit")


def train(gate: Gate, n: int, callbacks=(), state=None, **kwargs):
    train_step, test_step = steps(gate)
    with disallow_device_to_host():
        return ciclo.train_loop(
            create() if state is None else state,
            batches(n),
            {
                ciclo.on_train_batch_begin: gate.delay,
                ciclo.on_train_step: train_step,
                ciclo.on_test_step: test_step,
                ciclo.on_train_batch_end: gate.tick,
            },
            callbacks=list(callbacks),
            stop=n,
            **kwargs,
        )


def loop(gate: Gate, n: int, *callbacks):
    train_step, _ = steps(gate)
    with disallow_device_to_host():
        return ciclo.loop(
            create(),
            batches(n),
            {ciclo.every(1): [gate.delay, train_step, *callbacks, gate.tick]},
        )


def tensorboard(tmp: Path) -> list:
    try:
        import tensorboardX  # noqa: F401
    except ImportError:
        return []
    return [ciclo.tensorboard(tmp / "tb")]


def run(config: str, tmp: Path) -> None:
    test_dataset = None
    # the default history (lag 64): `ahead` stays below its bound (4 * lag rows)
    if config == "fused":
        # fused-only: 32 steps per call, no epoch end, nothing but the history;
        # the held step is released once 5 calls were dispatched after it
        n, gate = 512, Gate(hold=64, ahead=160)
        with gate:
            _, history, elapsed = train(gate, n, steps_per_call=32)
    elif config in ("writers", "bars"):
        # steps 110 to 130: the history reads a transfer and starts one at 128
        n, gate = 160, Gate(hold=110, ahead=20)
        if config == "writers":
            observers = [
                ciclo.csv_logger(tmp / "log.csv"),
                ciclo.jsonl_logger(tmp / "log.jsonl"),
                *tensorboard(tmp),
            ]
        else:
            observers = [
                ciclo.keras_bar(total=n, interval=0.0, plain=False),
                ciclo.keras_bar(total=n, plain=True, plain_interval=0.0),
                ciclo.tqdm_bar(total=n, interval=0.0, plain=False, file=io.StringIO()),
                ciclo.tqdm_bar(
                    total=n, plain=True, plain_interval=0.0, file=io.StringIO()
                ),
            ]
        with gate:
            _, history, elapsed = loop(gate, n, *observers)
    elif config == "nan_guard":
        # the guard waits for a value once `max_lag` (8) newer steps are unchecked
        n, gate = 80, Gate(hold=60, ahead=6)
        with gate:
            _, history, elapsed = loop(gate, n, ciclo.nan_guard())
    elif config == "lr_monitor":
        n, gate = 160, Gate(hold=110, ahead=20)
        schedule = optax.linear_schedule(0.1, 0.0, n)
        tx = optax.inject_hyperparams(optax.sgd)(learning_rate=schedule)
        with gate:
            _, history, elapsed = train(
                gate,
                n,
                [ciclo.lr_monitor(), ciclo.lr_monitor(schedule, name="scheduled")],
                state=create(tx),
            )
        assert len(history.collect("learning_rate", "scheduled")[0]) == n
    elif config in ("checkpoint", "test_loop"):
        # the epoch ends (a save; the test loop's aggregation) are after the gap
        n, gate = 200, Gate(hold=50, ahead=20)
        callbacks = []
        if config == "checkpoint":
            callbacks.append(ciclo.checkpoint(tmp / "ckpt"))
        else:
            test_dataset = lambda: batches(2)
        with gate:
            _, history, elapsed = train(
                gate, n, callbacks, epoch_duration=100, test_dataset=test_dataset
            )
        if config == "test_loop":
            assert len(history.collect("mse_test")) == 2
    else:
        raise ValueError(f"unknown configuration {config!r}")
    gate.check()
    assert elapsed.steps == n, elapsed.steps
    assert history.collect("index") == [float(i) for i in range(n)]
    print(f"ok {config}")


if __name__ == "__main__":
    with contextlib.redirect_stdout(io.StringIO()) as out:
        run(sys.argv[1], Path(sys.argv[2]))
    print(out.getvalue().splitlines()[-1])
