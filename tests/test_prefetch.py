"""The input path (API.md §9): batches read and placed ahead of the step.

Public API only. `prefetch=n` makes `train_loop` / `loop` (with a managed state)
read `n` batches (fused calls) ahead and place them with the state's strategy;
these tests check that it happens, that nothing else changes (order, counts,
results, data positions, errors, Ctrl-C), and that with it nothing but the batch
is transferred to the device per step. The 4-device placement runs in a
subprocess (`_prefetch_worker.py`).
"""

from __future__ import annotations

import threading

import _managed_model as m
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _workers import _results

import ciclo
from ciclo import managed

TOL = 1e-6


@managed.train_step
def plain_step(state, batch):  # (state, batch): `elapsed` is not sent to the device
    x, y = batch
    logits = m.apply(state.params, x)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    return ciclo.logs().add_loss("loss", loss), state


fused_plain = managed.train_step(plain_step.fn, steps_per_call=4)


class Source:
    """An iterator over `batches` that records how many were read, raises
    `error` (an exception instance) when batch `fail_at` is read, and, with
    `checkpointable`, has Grain's `get_state()` / `set_state()`."""

    def __init__(self, batches, fail_at=None, error=None, checkpointable=False):
        self.batches, self.index, self.read = batches, 0, 0
        self.fail_at, self.error = fail_at, error
        self.threads: set[int] = set()
        if checkpointable:
            self.get_state = lambda: {"next_index": self.index}
            self.set_state = self._set_state

    def __iter__(self):
        return self

    def __next__(self):
        self.threads.add(threading.get_ident())
        if self.index == self.fail_at:
            self.fail_at = None  # once
            raise self.error
        if self.index >= len(self.batches):
            raise StopIteration
        self.index += 1
        self.read += 1
        return self.batches[self.index - 1]

    def _set_state(self, state):
        self.index = state["next_index"]


def content(batch):
    return jax.tree.leaves(batch)[0].tobytes()


class Spy:
    """A callback recording, per batch: the batch's index in `data` (by content:
    a batch read ahead is a copy), `elapsed.steps`, and how many batches the
    source had read."""

    def __init__(self, data, source=None):
        self.ids = {content(b): i for i, b in enumerate(data)}
        assert len(self.ids) == len(data)
        self.source, self.rows = source, []

    def __call__(self, state, batch, elapsed, loop_state):
        read = None if self.source is None else self.source.read
        self.rows.append((self.ids.get(content(batch)), elapsed.steps, read))


def params_equal(a, b):
    for x, y in zip(
        jax.tree.leaves(m.host_params(a)), jax.tree.leaves(m.host_params(b))
    ):
        np.testing.assert_allclose(x, y, atol=TOL)


@pytest.mark.parametrize("loop", ["loop", "train_loop"])
def test_reads_ahead_in_order_and_counts_only_consumed_batches(loop):
    data = m.dataset(steps=8)
    results = {}
    for prefetch in (0, 2):
        source = Source(data)
        spy = Spy(data, source)
        if loop == "loop":
            out = ciclo.loop(
                m.create(), source, {ciclo.every(1): [plain_step, spy]},
                prefetch=prefetch,
            )  # fmt: skip
        else:
            out = ciclo.train_loop(
                m.create(), source, {ciclo.on_train_step: [plain_step, spy]},
                prefetch=prefetch,
            )  # fmt: skip
        results[prefetch] = (out, spy.rows)
    (state0, history0, elapsed0), rows0 = results[0]
    (state2, history2, elapsed2), rows2 = results[2]
    # the same batches, in order, each once; elapsed counts consumed ones only
    assert (
        [r[:2] for r in rows2] == [(i, i) for i in range(8)] == [r[:2] for r in rows0]
    )
    assert (elapsed2.steps, elapsed2.samples) == (8, 8 * m.BATCH)
    assert (elapsed0.steps, elapsed0.samples) == (8, 8 * m.BATCH)
    # without prefetch the source is read one batch at a time; with it, two ahead
    assert [r[2] for r in rows0][:-1] == [i + 1 for i in range(7)]
    assert [r[2] for r in rows2] == [min(i + 3, 8) for i in range(8)]
    params_equal(state0, state2)
    np.testing.assert_allclose(
        history2.collect("loss"), history0.collect("loss"), atol=TOL
    )
    assert history2.collect("steps") == list(range(8))


def test_fused_calls_are_stacked_ahead_and_equal_unfused():
    data = m.dataset(steps=10)
    source = Source(data)
    calls = []

    def spy(state, batch, elapsed):
        calls.append((batch.n, elapsed.steps, source.read))

    fused, history, elapsed = ciclo.train_loop(
        m.create(), source, {ciclo.on_train_step: [fused_plain, spy]}, prefetch=1
    )
    single, reference, _ = ciclo.train_loop(
        m.create(), data, {ciclo.on_train_step: plain_step}, prefetch=0
    )
    # calls of 4, 4 and 2 steps; while a call runs the next one is already read
    assert calls == [(4, 0, 8), (4, 4, 10), (2, 8, 10)]
    assert (elapsed.steps, elapsed.samples) == (10, 10 * m.BATCH)
    params_equal(fused, single)
    assert history.collect("steps") == list(range(10))
    np.testing.assert_allclose(
        history.collect("loss"), reference.collect("loss"), atol=1e-5
    )


def test_elapsed_inside_the_step_is_exact_with_prefetch():
    data = m.dataset(steps=6)
    _, history, _ = ciclo.loop(
        m.create(), data, {ciclo.every(1): m.train_step}, prefetch=2
    )
    assert history.collect("steps_seen") == list(range(6))
    fused = managed.train_step(m.train_step.fn, steps_per_call=4)
    _, history, _ = ciclo.loop(m.create(), data, {ciclo.every(1): fused}, prefetch=2)
    assert history.collect("steps_seen") == list(range(6))


def test_read_ahead_never_passes_a_stop_in_steps():
    source = Source(m.dataset(steps=10))
    _, _, elapsed = ciclo.train_loop(
        m.create(), source, {ciclo.on_train_step: plain_step}, stop=5, prefetch=3
    )
    assert elapsed.steps == 5
    assert source.read == 5  # the generator can go on from batch 5
    source = Source(m.dataset(steps=10))
    ciclo.loop(m.create(), source, {ciclo.every(1): fused_plain}, stop=6, prefetch=3)
    assert source.read == 6


def test_data_position_counts_consumed_batches_and_is_restored_at_the_end():
    data = m.dataset(steps=10)
    source = Source(data, checkpointable=True)
    positions = []

    def record(state, batch, elapsed, loop_state):
        positions.append((loop_state.data_state()["next_index"], source.read))
        if elapsed.steps == 5:
            loop_state.stop_after_batch()  # early stopping: the end is unknown

    _, _, elapsed = ciclo.train_loop(
        m.create(), source, {ciclo.on_train_step: [plain_step, record]}, prefetch=3
    )
    assert elapsed.steps == 6
    # the position a checkpoint saves is after the current batch, not the read-ahead
    assert [p for p, _ in positions] == [1, 2, 3, 4, 5, 6]
    assert [r for _, r in positions] == [4, 5, 6, 7, 8, 9]
    # the batches read ahead are read again by whoever iterates next
    assert source.get_state() == {"next_index": 6}
    assert next(source) is data[6]


def test_exact_resume_from_a_checkpoint_with_prefetch(tmp_path):
    data = m.dataset(steps=9)
    straight, reference, _ = ciclo.train_loop(
        m.create(), data, {ciclo.on_train_step: plain_step}, prefetch=0
    )
    first = Source(data, checkpointable=True)
    kwargs = dict(epoch_duration=3, prefetch=2, resume=tmp_path)
    ciclo.train_loop(
        m.create(), first, {ciclo.on_train_step: plain_step}, stop=6, **kwargs
    )
    fresh = Source(data, checkpointable=True)
    resumed, history, elapsed = ciclo.train_loop(
        m.create(), fresh, {ciclo.on_train_step: plain_step}, stop=9, **kwargs
    )
    assert elapsed.steps == 9
    assert fresh.read == 3  # started at batch 6: nothing repeated or skipped
    params_equal(resumed, straight)
    assert history.collect("steps") == list(range(9))
    np.testing.assert_allclose(
        history.collect("loss"), reference.collect("loss"), atol=1e-5
    )


@pytest.mark.parametrize("loop", ["loop", "train_loop"])
def test_a_dataset_error_surfaces_in_the_callers_thread_at_its_batch(loop):
    data = m.dataset(steps=8)
    source = Source(data, fail_at=5, error=ValueError("corrupt record"))
    spy = Spy(data, source)
    run = ciclo.loop if loop == "loop" else ciclo.train_loop
    key = ciclo.every(1) if loop == "loop" else ciclo.on_train_step
    with pytest.raises(ValueError, match="corrupt record") as without:
        run(
            m.create(), Source(data, 5, ValueError("corrupt record")), {key: plain_step}
        )
    history = ciclo.history()
    with pytest.raises(ValueError, match="corrupt record") as info:
        run(m.create(), source, {key: [plain_step, spy]}, prefetch=3, history=history)
    # batches 0-4 trained (batch 5 was being read ahead during batch 2)
    assert [r[:2] for r in spy.rows] == [(i, i) for i in range(5)]
    assert spy.rows[2][2] == 5
    assert len(history) == 5
    assert info.value.__notes__ == without.value.__notes__  # as without prefetch
    assert source.threads == {threading.get_ident()}


def test_ctrl_c_while_reading_ahead_ends_cleanly_and_loses_nothing():
    data = m.dataset(steps=10)
    source = Source(data, fail_at=6, error=KeyboardInterrupt(), checkpointable=True)
    threads = threading.active_count()
    state, history, elapsed = ciclo.train_loop(
        m.create(), source, {ciclo.on_train_step: plain_step}, prefetch=2
    )
    # Ctrl-C came while batch 6 was read, ahead of batch 4: batches 0-3 trained
    assert elapsed.steps == 4 == len(history) == int(state.step)
    assert threading.active_count() == threads  # no reader left behind
    assert source.get_state() == {"next_index": 4}  # batches 4, 5 are read again
    rest, _, elapsed = ciclo.train_loop(
        state, source, {ciclo.on_train_step: plain_step}, elapsed=elapsed, prefetch=2
    )
    assert elapsed.steps == 10
    straight, _, _ = ciclo.train_loop(
        m.create(), data, {ciclo.on_train_step: plain_step}, prefetch=0
    )
    params_equal(rest, straight)


def test_ctrl_c_in_a_step_with_batches_read_ahead():
    data = m.dataset(steps=10)
    source = Source(data, checkpointable=True)

    def interrupt(state, batch, elapsed):
        if elapsed.steps == 3:
            raise KeyboardInterrupt

    state, history, elapsed = ciclo.loop(
        m.create(), source, {ciclo.every(1): [interrupt, plain_step]}, prefetch=3
    )
    assert elapsed.steps == 3 == len(history) == int(state.step)
    assert source.get_state() == {"next_index": 3}
    assert next(source) is data[3]
    with pytest.raises(KeyboardInterrupt):
        ciclo.loop(
            m.create(), Source(data), {ciclo.every(1): [interrupt, plain_step]},
            prefetch=3, catch_keyboard_interrupt=False,
        )  # fmt: skip


@pytest.mark.parametrize("fused", [False, True], ids=["unfused", "fused"])
def test_nothing_but_the_batch_goes_to_the_device_per_step(fused):
    data = m.dataset(steps=8)
    step = fused_plain if fused else plain_step
    state = m.create()
    tasks = {ciclo.on_train_step: step}
    ciclo.train_loop(state, data[:4], tasks, prefetch=1)  # compiled outside the guard
    with jax.transfer_guard_host_to_device("disallow"):
        # the batches are placed ahead explicitly; any implicit transfer (a
        # Python scalar or numpy array passed into a compiled call) would raise
        trained, history, elapsed = ciclo.train_loop(
            state, data, tasks, callbacks=[ciclo.keras_bar(total=8, verbose=0)],
            prefetch=1,
        )  # fmt: skip
        assert elapsed.steps == 8
        # the guard does catch implicit transfers on CPU: without prefetch the
        # numpy batches go in implicitly
        with pytest.raises(Exception, match="Disallowed host-to-device"):
            ciclo.train_loop(state, data, tasks, prefetch=0)
    assert len(history.collect("loss")) == 8


def test_prefetch_is_validated():
    with pytest.raises(ValueError, match="`prefetch` must be None"):
        ciclo.train_loop(m.create(), m.dataset(2), {ciclo.on_train_step: plain_step},
                         prefetch=-1)  # fmt: skip
    with pytest.raises(ValueError, match="got True"):
        ciclo.loop(
            m.create(), m.dataset(2), {ciclo.every(1): plain_step}, prefetch=True
        )


def test_a_state_without_strategy_reads_nothing_ahead():
    source = Source(list(range(5)))
    seen = []

    def step(state, batch):
        seen.append(source.read)
        return state + batch

    state, _, _ = ciclo.loop(0, source, {ciclo.every(1): step}, prefetch=3)
    assert state == 10 and seen == [1, 2, 3, 4, 5]


def test_flax_state_with_prefetch_matches_without():
    import flax.linen as nn

    data = [(x.astype(np.float32), y) for x, y in m.dataset(steps=6)]

    def make():
        return ciclo.create_flax_state(
            nn.Dense(4), jnp.zeros((1, 8)), optax.sgd(0.1),
            losses={"loss": optax.softmax_cross_entropy_with_integer_labels},
            key=jax.random.key(0),
        )  # fmt: skip

    a, ha, _ = ciclo.train_loop(make(), data, prefetch=0)
    state = make()
    with jax.transfer_guard_host_to_device("disallow"):
        b, hb, _ = ciclo.train_loop(state, data, prefetch=2)
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=TOL)
    np.testing.assert_allclose(ha.collect("loss"), hb.collect("loss"), atol=TOL)


@pytest.mark.slow
def test_sharded_and_data_parallel_placement_on_four_devices():
    results = _results("_prefetch_worker.py", "4-device prefetch worker")
    for name, runs in results.items():
        off, on = runs[0], runs[2]
        assert on["rows"] == off["rows"] == [(i, i) for i in range(10)], name
        if name.endswith("_fused"):  # calls of 4, 4, 2: two calls read ahead
            assert on["read"] == [10, 10, 10] and off["read"] == [4, 8, 10], name
        else:
            assert on["read"] == [min(i + 3, 10) for i in range(10)], name
        for x, y in zip(off["params"], on["params"]):
            np.testing.assert_allclose(x, y, atol=1e-5, err_msg=name)
        assert on["placed"], name  # every batch arrived placed for its strategy


@managed.step
def eval_step(state, batch):
    x, y = batch
    logits = m.apply(state.params, x)
    return ciclo.logs().add_metric("accuracy", jnp.mean(jnp.argmax(logits, -1) == y))


def test_passes_epochs_and_test_loops_are_unchanged_by_prefetch():
    data = m.dataset(steps=5)
    runs = {}
    for prefetch in (0, 2):
        ends = []

        def on_epoch_end(state, batch, elapsed, loop_state, ends=ends):
            ends.append(loop_state.elapsed_after.steps)

        runs[prefetch] = ciclo.train_loop(
            m.create(), data,
            {ciclo.on_train_step: plain_step, ciclo.on_test_step: eval_step,
             ciclo.on_epoch_end: on_epoch_end},
            test_dataset=lambda: data[:3], epochs=3, prefetch=prefetch,
        ), ends  # fmt: skip
    (s0, h0, e0), ends0 = runs[0]
    (s2, h2, e2), ends2 = runs[2]
    assert ends0 == ends2 == [5, 10, 15] and e0.steps == e2.steps == 15
    params_equal(s0, s2)
    assert h0.collect("steps", "accuracy_test") == h2.collect("steps", "accuracy_test")
    # a test loop of its own reads ahead too, in order
    source = Source(data)
    spy = Spy(data, source)
    _, history, elapsed = ciclo.test_loop(
        s2, source, {ciclo.on_test_step: [eval_step, spy]}, prefetch=2
    )
    assert [r[:2] for r in spy.rows] == [(i, i) for i in range(5)]
    assert [r[2] for r in spy.rows] == [3, 4, 5, 5, 5]
    assert elapsed.steps == 5 and len(history.collect("accuracy")) == 5


def test_iterate_with_prefetch_stops_cleanly_and_counts_consumed_batches():
    data = m.dataset(steps=9)
    source = Source(data, checkpointable=True)
    seen = []
    for _state, _logs, elapsed in ciclo.iterate(
        m.create(), source, {ciclo.on_train_step: plain_step},
        epoch_duration=3, prefetch=2,
    ):  # fmt: skip
        seen.append(elapsed.steps)
        if elapsed.steps == 6:
            break
    assert seen == [3, 6]
    assert source.get_state() == {"next_index": 6}  # read-ahead put back


@managed.train_step
def mean_step(state, batch):  # any batch shape: fits the batch's mean
    loss = (state.params["w"] - batch.mean()) ** 2
    return ciclo.logs().add_loss("loss", loss), state


@pytest.mark.parametrize(
    ("rows", "steps_per_call", "ahead"),
    [
        (8, 1, False),  # 8 KiB a step: off
        (8, 4, False),  # a fused call of 8 KiB steps (32 KiB stacked): off
        (256, 1, True),  # 256 KiB a step: one ahead
        (256, 4, True),  # fused, 256 KiB a step: one call ahead
    ],
)
def test_automatic_read_ahead_on_an_accelerator_goes_by_one_steps_batch(
    monkeypatch, rows, steps_per_call, ahead
):
    """`prefetch=None` on an accelerator (docs/performance.md: measured on an
    H200): one batch (fused call) ahead when one step's batch holds 256 KiB or
    more, fused or not; off below. The backend is made to read as a GPU."""
    from ciclo._input import prefetch as automatic

    monkeypatch.setattr(automatic, "_ACCELERATOR", [True])
    source = Source([np.full((rows, 256), i, np.float32) for i in range(12)])
    calls = []

    def spy(state, batch, elapsed):
        calls.append((elapsed.steps, source.read))

    step = (
        mean_step
        if steps_per_call == 1
        else managed.train_step(mean_step.fn, steps_per_call=steps_per_call)
    )
    state = managed.ManagedState.create(
        params={"w": jnp.zeros(())}, tx=optax.sgd(0.1), strategy="jit"
    )
    ciclo.train_loop(state, source, {ciclo.on_train_step: [step, spy]})
    first = calls[:2]  # before any pass end is looked for
    k = steps_per_call
    if ahead:
        assert first == [(0, 2 * k), (k, 3 * k)]
    else:
        assert first == [(0, k), (k, 2 * k)]
