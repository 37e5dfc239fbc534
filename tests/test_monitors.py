"""Monitors: lr_monitor, nan_guard, profiler."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.training.train_state import TrainState

import ciclo
from ciclo import managed

SCHEDULE = optax.cosine_decay_schedule(0.1, decay_steps=8)


def make_state(tx):
    params = {"w": jnp.ones(3)}
    return TrainState.create(apply_fn=None, params=params, tx=tx)


@jax.jit
def train_step(state, batch):
    loss, grads = jax.value_and_grad(lambda p: jnp.sum((p["w"] * batch) ** 2))(
        state.params
    )
    return ciclo.logs().add_loss("loss", loss), state.apply_gradients(grads=grads)


def data(n):
    return [np.ones(3, np.float32) for _ in range(n)]


# -- lr_monitor ----------------------------------------------------------------------


def test_lr_monitor_reads_inject_hyperparams_in_train_loop():
    tx = optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.inject_hyperparams(optax.adam)(learning_rate=SCHEDULE),
    )
    monitor = ciclo.lr_monitor()
    assert monitor.on_train_batch_end is monitor
    _, history, _ = ciclo.train_loop(
        make_state(tx), data(8), {ciclo.on_train_step: train_step},
        callbacks=[monitor], stop=8,
    )  # fmt: skip
    steps, lrs = history.collect("steps", "learning_rate")
    np.testing.assert_allclose(lrs, [SCHEDULE(s) for s in steps], rtol=1e-6)


LINEAR = optax.linear_schedule(0.1, 0.0, transition_steps=4)


@managed.train_step
def managed_train_step(state, batch):
    loss = jnp.sum((state.params["w"] * batch) ** 2)
    return ciclo.logs().add_loss("loss", loss), state


@pytest.mark.parametrize("form", ["on_train_step", "every(1)", "**managed"])
@pytest.mark.parametrize("schedule", [None, LINEAR], ids=["opt_state", "schedule"])
def test_lr_monitor_in_train_loop_logs_the_rate_each_step_used(form, schedule):
    # The rate used by step k is LINEAR(k) (optax counts updates from 0), however
    # the train step is scheduled: the monitor runs after it.
    tx = optax.inject_hyperparams(optax.sgd)(learning_rate=LINEAR)
    if form == "**managed":
        state = managed.ManagedState.create(params={"w": jnp.ones(3)}, tx=tx)
        tasks = {**managed_train_step}
    else:
        state = make_state(tx)
        key = ciclo.on_train_step if form == "on_train_step" else ciclo.every(1)
        tasks = {key: train_step}
    _, history, _ = ciclo.train_loop(
        state, data(4), tasks, callbacks=[ciclo.lr_monitor(schedule)]
    )
    steps, lrs = history.collect("steps", "learning_rate")
    assert steps == [0, 1, 2, 3]
    np.testing.assert_allclose(lrs, [0.1, 0.075, 0.05, 0.025], rtol=1e-6)


@pytest.mark.parametrize("writer_first", [True, False])
def test_lr_monitor_is_in_every_row_of_a_writer_beside_it(tmp_path, writer_first):
    import json

    tx = optax.inject_hyperparams(optax.sgd)(learning_rate=LINEAR)
    writer, monitor = ciclo.jsonl_logger(tmp_path / "log.jsonl"), ciclo.lr_monitor()
    callbacks = [writer, monitor] if writer_first else [monitor, writer]
    ciclo.train_loop(
        make_state(tx), data(4), {ciclo.on_train_step: train_step}, callbacks=callbacks
    )
    with open(tmp_path / "log.jsonl") as file:
        rows = [json.loads(line) for line in file]
    lrs = [row.get("learning_rate") for row in rows]
    np.testing.assert_allclose(lrs, [0.1, 0.075, 0.05, 0.025], rtol=1e-6)


def test_lr_monitor_from_a_schedule_in_loop_and_by_hand():
    _, history, _ = ciclo.loop(
        make_state(optax.sgd(SCHEDULE)),
        data(5),
        {ciclo.every(1): [train_step, ciclo.lr_monitor(SCHEDULE, name="lr")]},
    )
    np.testing.assert_allclose(history.collect("lr"), [SCHEDULE(s) for s in range(5)])
    logs = ciclo.lr_monitor(SCHEDULE)(None, ciclo.Elapsed.create(steps=3))
    assert float(logs.metrics.learning_rate) == pytest.approx(float(SCHEDULE(3)))


def test_lr_monitor_never_changes_the_logs_a_step_returned():
    # the step hands the loop one Logs object every step (its own); lr_monitor
    # beside it adds its entry to the step's row, not to that object
    shared = ciclo.logs().add_loss("loss", 1.0)
    seen = []

    def step(state, batch):
        seen.append(dict(shared))
        return shared, state

    for form in (ciclo.lr_monitor(SCHEDULE, name="lr"), ciclo.lr_monitor(name="lr")):
        shared_before = {c: dict(e) for c, e in shared.items()}
        _, history, _ = ciclo.loop(
            make_state(optax.inject_hyperparams(optax.sgd)(learning_rate=SCHEDULE)),
            data(4),
            {ciclo.every(1): [step, form]},
        )
        assert {c: dict(e) for c, e in shared.items()} == shared_before
        assert history.collect("loss") == [1.0] * 4
        np.testing.assert_allclose(
            history.collect("lr"),
            [SCHEDULE(0)] * 4
            if form.schedule is None
            else [SCHEDULE(s) for s in range(4)],
            rtol=1e-6,
        )
    assert all(set(row) == {"losses"} for row in seen)


def test_lr_monitor_beside_a_managed_step_and_a_second_logger():
    # lr_monitor's entry joins the managed step's row, and another callback's
    # logs after it are merged too; each row holds all three, per step
    state = managed.ManagedState.create(
        params={"w": jnp.ones(3)}, tx=optax.sgd(SCHEDULE), strategy="jit"
    )

    def fit(state, batch):
        return ciclo.logs().add_loss("loss", jnp.sum((state.params["w"] * batch) ** 2))

    def extra(state, batch, elapsed):
        return ciclo.logs().add_metric("step_seen", elapsed.steps), None

    _, history, _ = ciclo.loop(
        state,
        data(6),
        {
            ciclo.every(1): [
                managed.train_step(fit),
                ciclo.lr_monitor(SCHEDULE, name="lr"),
                extra,
            ]
        },
    )
    assert history.collect("steps") == list(range(6))
    assert history.collect("step_seen") == list(range(6))
    np.testing.assert_allclose(history.collect("lr"), [SCHEDULE(s) for s in range(6)])
    assert len(history.collect("loss")) == 6
    row = history[-1]
    assert set(row.metrics) == {"lr", "step_seen"} and set(row.losses) == {"loss"}


def test_lr_monitor_schedule_is_compiled_once_with_todays_values():
    # the schedule runs traced once (not op by op each step) and gives the values
    # of an op-by-op call, across the blocks it is computed in
    calls = []

    def schedule(count):
        calls.append(count)
        return optax.warmup_cosine_decay_schedule(0.0, 1e-3, 10, 3000)(count)

    monitor = ciclo.lr_monitor(schedule)
    _, history, _ = ciclo.loop(None, range(40), {ciclo.every(1): monitor})
    assert len(calls) <= 2  # one trace (+ one for the block computed ahead)
    expected = [float(schedule(s)) for s in range(40)]
    np.testing.assert_allclose(history.collect("learning_rate"), expected, rtol=1e-6)
    for step in [1023, 1024, 2500, 7]:  # by hand, out of order, across blocks
        logs = monitor(None, ciclo.Elapsed.create(steps=step))
        value = float(logs.metrics.learning_rate)
        assert value == pytest.approx(float(schedule(step)), rel=1e-6)
    # a schedule that branches on the step in Python is called as before
    steps = ciclo.lr_monitor(lambda count: 0.1 if count < 3 else 0.01)
    _, history, _ = ciclo.loop(None, range(5), {ciclo.every(1): steps})
    assert history.collect("learning_rate") == [0.1, 0.1, 0.1, 0.01, 0.01]


def test_lr_monitor_without_injected_hyperparams_says_how_to_fix():
    with pytest.raises(ValueError, match="inject_hyperparams"):
        ciclo.loop(
            make_state(optax.sgd(0.1)),
            data(2),
            {ciclo.every(1): [train_step, ciclo.lr_monitor()]},
        )


# -- nan_guard -----------------------------------------------------------------------


def nan_at(bad_step):
    @jax.jit
    def step(state, batch):
        loss = jnp.where(state == bad_step, jnp.nan, 1.0)
        return ciclo.logs().add_loss("loss", loss).add_metric("m", 2.0), state + 1

    return step


def test_nan_guard_raises_naming_entry_and_step_and_writers_flush(tmp_path):
    guard = ciclo.nan_guard(max_lag=0)  # synchronous: stops on the bad step
    log = ciclo.jsonl_logger(tmp_path / "log.jsonl")
    with pytest.raises(FloatingPointError, match=r"losses.loss is nan at step 4"):
        ciclo.loop(0, data(20), {ciclo.every(1): [nan_at(4), log, guard]})
    assert guard.found[:2] == (4, "losses.loss")
    with open(tmp_path / "log.jsonl") as file:
        assert len(file.readlines()) == 5  # steps 0..4, flushed despite the error


def test_nan_guard_lag_bound_and_good_state():
    guard = ciclo.nan_guard(action="warn", max_lag=3, keep_good_state=True)
    with pytest.warns(RuntimeWarning, match=r"losses.loss is nan at step 5"):
        state, history, elapsed = ciclo.train_loop(
            jnp.int32(0), data(50), {ciclo.on_train_step: nan_at(5)},
            callbacks=[guard],
        )  # fmt: skip
    # stops at most max_lag steps after the bad one; hands back the state after
    # the last good step (4), whose counter is 5
    assert 6 <= elapsed.steps <= 5 + 3 + 1
    assert int(state) == 5 and int(guard.good_state) == 5


def test_nan_guard_checks_every_step_of_a_fused_call():
    # the guard reads the history's rows: a NaN in a middle step of a fused call
    # (its logs hold only the call's last step) is found, named by its own step
    @managed.train_step
    def step(state, batch):
        x, index = batch
        loss = jnp.sum(state.params * x) ** 2
        return ciclo.logs().add_loss(
            "loss", jnp.where(index == 5, jnp.nan, loss)
        ), state

    state = managed.ManagedState.create(params=jnp.ones(3), tx=optax.sgd(0.0))
    batches = [(np.ones(3, np.float32), np.int32(i)) for i in range(16)]
    guard = ciclo.nan_guard(action="warn")
    with pytest.warns(RuntimeWarning, match=r"losses.loss is nan at step 5"):
        _, _, elapsed = ciclo.train_loop(
            state, batches, {ciclo.on_train_step: step}, callbacks=[guard],
            steps_per_call=4,
        )  # fmt: skip
    assert guard.found[:2] == (5, "losses.loss")
    assert elapsed.steps <= 5 + 8 + 4  # max_lag (8), and the call it is seen in


def test_nan_guard_max_lag_routes_to_the_historys_cadence():
    # one policy for how late a row is read, the history's: with the guard in the
    # loop, rows reach the host every few commits (not every `lag` = 64)
    def on_host(state, batch, elapsed, loop_state):
        seen.append(loop_state.history.on_host)

    for guard, expected in [(None, 0), (ciclo.nan_guard(max_lag=6), 6)]:
        seen: list[int] = []
        guarded = [] if guard is None else [guard]
        ciclo.loop(0, range(20), {ciclo.every(1): [host_step, *guarded, on_host]})
        assert max(seen) >= expected and (guard is not None or max(seen) == 0)


def host_step(state, batch):
    return ciclo.logs().add_loss("loss", 1.0), state + 1


def test_nan_guard_watches_grad_norm_and_only_what_is_asked():
    def step(state, batch):
        logs = ciclo.logs().add_loss("loss", 1.0)
        logs.add_entry("diagnostics", "grad_norm", jnp.inf if state == 2 else 1.0)
        logs.add_output("y", jnp.array([jnp.nan]))  # outputs are not watched
        return logs, state + 1

    with pytest.raises(FloatingPointError, match="diagnostics.grad_norm is inf"):
        ciclo.loop(0, data(6), {ciclo.every(1): [step, ciclo.nan_guard()]})
    guard = ciclo.nan_guard(watch="loss")
    _, _, elapsed = ciclo.loop(0, data(6), {ciclo.every(1): [step, guard]})
    assert elapsed.steps == 6 and guard.found is None


def test_nan_guard_watching_a_name_never_logged_is_an_error_naming_it():
    def step(state, batch):
        return ciclo.logs().add_loss("loss", 1.0).add_metric("mae", 2.0), state + 1

    # a typo: nothing would be guarded; said when the run ends, with what was logged
    with pytest.raises(ValueError, match=r"'acc' was never logged") as info:
        ciclo.loop(0, data(4), {ciclo.every(1): [step, ciclo.nan_guard(["acc"])]})
    assert "losses.loss" in str(info.value) and "metrics.mae" in str(info.value)
    # an entry logged only at some steps (a test metric at epoch ends) is fine
    _, history, _ = ciclo.train_loop(
        0,
        data(4),
        {ciclo.on_train_step: step, ciclo.on_test_step: step},
        callbacks=[ciclo.nan_guard(["losses.loss", "mae_test"])],
        test_dataset=lambda: data(1),
        epoch_duration=2,
    )
    assert history.collect("mae_test") == [2.0, 2.0]

    # a run cut short (Ctrl-C before the entry appeared) is not blamed for it
    def cut(state):
        if state == 2:
            raise KeyboardInterrupt
        return state

    _, _, elapsed = ciclo.loop(
        0,
        data(6),
        {ciclo.every(1): [step, cut], ciclo.every(3): [ciclo.nan_guard("x")]},
    )
    assert elapsed.steps == 2
    # by hand: `close()` says it
    guard = ciclo.nan_guard("acc")
    guard(ciclo.Elapsed.create(), ciclo.logs().add_loss("loss", 1.0))
    with pytest.raises(ValueError, match="'acc' was never logged"):
        guard.close()


def test_nan_guard_watch_must_be_names():
    for bad in (5, [1], [""], {"loss": 1}):
        with pytest.raises(TypeError, match="`watch` must be an entry name"):
            ciclo.nan_guard(bad)


def test_nan_guard_by_hand():
    guard = ciclo.nan_guard()
    assert guard(ciclo.Elapsed.create(), ciclo.logs().add_loss("loss", 1.0)) is False
    with pytest.raises(FloatingPointError, match="at step 1"):
        guard(ciclo.Elapsed.create(steps=1), ciclo.logs().add_metric("a", np.nan))


# -- profiler ------------------------------------------------------------------------


def test_profiler_traces_a_window_and_stops_at_loop_end(tmp_path):
    prof = ciclo.profiler(tmp_path, start=2, steps=2)
    assert prof.on_train_batch_begin is prof
    ciclo.train_loop(
        make_state(optax.sgd(0.1)), data(6), {ciclo.on_train_step: train_step},
        callbacks=[prof],
    )  # fmt: skip
    assert prof.traced == (2, 4) and not prof.tracing
    traces = [f for _, _, fs in os.walk(tmp_path) for f in fs if "trace" in f]
    assert traces
    # a loop ending inside the window stops the trace too
    prof = ciclo.profiler(tmp_path / "b", start=1, steps=100)
    ciclo.loop(0, data(3), {**prof, ciclo.every(1): lambda s: s + 1})
    assert prof.traced == (1, 3) and not prof.tracing


def test_monitor_public_names_and_arguments():
    for name in ["lr_monitor", "nan_guard", "profiler"]:
        assert name in ciclo.__all__ and name in ciclo.callbacks.__all__
    with pytest.raises(ValueError, match="action"):
        ciclo.nan_guard(action="ignore")
    with pytest.raises(ValueError, match="steps"):
        ciclo.profiler("x", steps=0)
