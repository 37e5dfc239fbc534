"""Fused execution: K steps per compiled call equal K single steps.

Public API only. The 4-device checks (`data_parallel`, `sharded`) run once in a
subprocess (`_fused_worker.py`).
"""

from __future__ import annotations

import warnings

import _managed_model as m
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _workers import fused_results

import ciclo
from ciclo import managed

TOL = 1e-5
fused4 = managed.train_step(m.train_step.fn, steps_per_call=4)
fused4_mean = managed.train_step(m.train_step.fn, steps_per_call=4, fused_logs="mean")


def run(step, data, **kwargs):
    return ciclo.loop(m.create("jit"), data, {ciclo.every(1): step}, **kwargs)


def max_diff(a, b):
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


def test_fused_equals_single_steps_under_jit():
    data = m.dataset(steps=10)
    single, h1, e1 = run(m.train_step, data)
    fused, h2, e2 = run(fused4, data)
    assert max_diff(m.host_params(single), m.host_params(fused)) < TOL
    np.testing.assert_allclose(
        h1.collect("losses.loss"), h2.collect("losses.loss"), atol=TOL
    )
    assert h2.collect("steps_seen") == list(range(10))  # per-step elapsed inside
    assert int(fused.step) == 10


def test_elapsed_counts_real_steps_and_samples_with_uneven_tail():
    # 10 full batches of 16 and a last one of 8: calls of 4, 4, 2 and 1 steps
    data = m.dataset(steps=10) + m.dataset(steps=1, batch=8, seed=1)
    calls = []

    def spy(state, batch, elapsed, loop_state):
        calls.append((batch.n, elapsed.steps, loop_state.elapsed_after.steps))

    state, history, elapsed = ciclo.loop(
        m.create("jit"), data, {ciclo.every(1): [fused4, spy]}
    )
    assert (elapsed.steps, elapsed.samples) == (11, 168)
    assert int(state.step) == 11
    assert calls == [(4, 0, 4), (4, 4, 8), (2, 8, 10), (1, 10, 11)]
    assert history.collect("steps") == list(range(11))
    assert history.collect("samples") == [16 * i for i in range(11)]
    single, _, _ = run(m.train_step, data)
    assert max_diff(m.host_params(single), m.host_params(state)) < TOL


def test_fused_logs_all_gives_k_rows_and_mean_one_row_per_call():
    data = m.dataset(steps=8)
    _, all_rows, _ = run(fused4, data)
    _, mean_rows, elapsed = run(fused4_mean, data)
    assert elapsed.steps == 8
    assert len(all_rows) == 8 and len(mean_rows) == 2
    assert mean_rows.collect("steps") == [0, 4]
    losses = np.array(all_rows.collect("losses.loss"))
    np.testing.assert_allclose(
        mean_rows.collect("losses.loss"), losses.reshape(2, 4).mean(1), atol=TOL
    )
    # outputs: a row per step with its batch's rows; "mean" concatenates a call's
    assert all_rows.collect("logits")[0].shape == (16, 4)
    assert mean_rows.collect("logits")[0].shape == (64, 4)


def test_stop_in_steps_is_exact():
    _, history, elapsed = run(fused4, m.dataset(steps=10), stop=6)
    assert elapsed.steps == 6 and len(history) == 6


def test_fuse_groups_without_dropping():
    batches = [np.full((2, 3), i) for i in range(5)] + [np.zeros((1, 3))]
    fused = list(ciclo.fuse(batches, 2))
    assert [(s.n, s.samples) for s in fused] == [(2, 4), (2, 4), (1, 2), (1, 1)]
    np.testing.assert_array_equal(fused[1].batch[:, 0, 0], [2, 3])


def test_explicit_steps_per_call_on_the_loop_and_validation():
    _, history, elapsed = run(m.train_step, m.dataset(steps=5), steps_per_call=2)
    assert elapsed.steps == 5 and history.collect("steps") == list(range(5))
    with pytest.raises(TypeError, match="steps_per_call"):
        managed.train_step(m.train_step.fn, steps_per_call=0)
    with pytest.raises(ValueError, match="fused_logs"):
        managed.train_step(m.train_step.fn, fused_logs="last")


def _flax_state(**kwargs):
    import flax.linen as nn

    clu_metrics = pytest.importorskip("clu.metrics", reason="needs ciclo[flax] (clu)")

    return ciclo.create_flax_state(
        nn.Dense(4),
        jnp.ones((1, 8)),
        optax.adam(1e-2),
        losses={
            "loss": lambda preds, target: (
                optax.softmax_cross_entropy_with_integer_labels(preds, target).mean()
            )
        },
        metrics={"accuracy": clu_metrics.Accuracy},
        **kwargs,
    )


def test_flax_state_fused_keeps_stateful_metrics_and_avg_loss():
    data = m.dataset(steps=8)
    test = m.dataset(steps=2, seed=3)
    kwargs = dict(test_dataset=lambda: test, epoch_duration=4)
    single, h1, e1 = ciclo.train_loop(_flax_state(), data, **kwargs)
    fused, h2, e2 = ciclo.train_loop(_flax_state(steps_per_call=4), data, **kwargs)
    assert (e2.steps, e2.samples) == (e1.steps, e1.samples) == (8, 128)
    p1, p2 = single.params["kernel"], fused.params["kernel"]
    np.testing.assert_allclose(np.asarray(p1), np.asarray(p2), atol=TOL)
    for key in ("losses.loss", "avg_loss", "accuracy"):
        np.testing.assert_allclose(h1.collect(key), h2.collect(key), atol=TOL)
    assert h1.collect("steps", "accuracy_test") == h2.collect("steps", "accuracy_test")


def test_train_loop_steps_per_call_with_a_bar(capsys):
    state, history, elapsed = ciclo.train_loop(
        _flax_state(fused_logs="mean"),
        m.dataset(steps=6),
        callbacks=[ciclo.keras_bar(total=6)],
        steps_per_call=3,
    )
    assert elapsed.steps == 6 and int(state.step) == 6
    assert history.collect("steps") == [0, 3]
    assert "6/6" in capsys.readouterr().out


def test_an_epoch_duration_not_a_multiple_of_steps_per_call_warns_where_epochs_end():
    # epochs end at call boundaries: with K=3 and epoch_duration=4 after steps 6,
    # 9 and 12 (the first call reaching each multiple of 4), said up front
    test = m.dataset(steps=1, seed=3)
    kwargs = dict(test_dataset=lambda: test, steps_per_call=3, stop=12)
    with pytest.warns(UserWarning, match="epoch_duration=4 is not a multiple") as w:
        _, history, _ = ciclo.train_loop(
            _flax_state(), m.dataset(steps=12), epoch_duration=4, **kwargs
        )
    assert "after steps 6, 9, 12" in str(w[0].message)
    assert w[0].filename == __file__  # the user's line
    assert history.collect("steps", "accuracy_test")[0] == [5, 8, 11]
    with warnings.catch_warnings():  # a multiple: nothing to say
        warnings.simplefilter("error")
        ciclo.train_loop(
            _flax_state(),
            m.dataset(steps=12),
            epoch_duration=ciclo.at(steps=6),
            **kwargs,
        )


@pytest.fixture(scope="module")
def four_devices() -> dict:
    return fused_results()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["jit", "data_parallel", "sharded"])
def test_fused_equals_single_steps_on_four_devices(four_devices, name):
    single, fused = four_devices[name]["single"], four_devices[name]["fused"]
    assert max_diff(single["params"], fused["params"]) < TOL
    np.testing.assert_allclose(single["loss"], fused["loss"], atol=TOL)
    assert fused["steps"] == list(range(10))
    assert fused["samples"] == [16 * i for i in range(10)]
    assert [int(s) for s in fused["steps_seen"]] == list(range(10))
    assert fused["logits_shape"] == single["logits_shape"]
    assert fused["elapsed"] == single["elapsed"] == (10, 160)


def test_train_loop_epochs_fuse_within_each_pass():
    # 5 batches per pass, 3 epochs, K=4: calls of 4+1 per pass, an epoch ends
    # after each pass (steps 5, 10, 15) and `stop` cuts the last pass exactly
    ends, calls = [], []

    def at_end(state, batch, elapsed, loop_state):
        ends.append(loop_state.elapsed_after.steps)

    def spy(state, batch):
        calls.append(batch.n)

    data = m.dataset(steps=5)
    state, history, elapsed = ciclo.train_loop(
        m.create("jit"), data,
        {ciclo.on_train_step: [fused4, spy], ciclo.on_epoch_end: at_end},
        epochs=3, stop=13,
    )  # fmt: skip
    assert calls == [4, 1, 4, 1, 3]
    assert ends == [5, 10, 13]
    assert elapsed.steps == 13 and int(state.step) == 13
    assert history.collect("steps") == list(range(13))
    single, _, _ = ciclo.train_loop(
        m.create("jit"), data, {ciclo.on_train_step: m.train_step}, epochs=3, stop=13
    )
    assert max_diff(m.host_params(single), m.host_params(state)) < TOL


@pytest.mark.parametrize("form", ["tuple", "list", "dict", "nested"])
def test_fuse_stacks_every_batch_form_and_splits_where_shapes_change(form):
    rng = np.random.default_rng(0)
    sizes = [4, 4, 4, 3, 3, 4]  # a shape change splits the group
    xs = [rng.normal(size=(n, 2)).astype(np.float32) for n in sizes]
    ys = [np.arange(n, dtype=np.int32) + i for i, n in enumerate(sizes)]
    make = {
        "tuple": lambda x, y: (x, y),
        "list": lambda x, y: [x, y],
        "dict": lambda x, y: {"x": x, "y": y},
        "nested": lambda x, y: {"x": (x,), "y": y},  # not a flat batch
    }[form]
    fused = list(ciclo.fuse([make(x, y) for x, y in zip(xs, ys)], 2))
    assert [(s.n, s.samples) for s in fused] == [(2, 8), (1, 4), (2, 6), (1, 4)]
    first = fused[0].batch
    assert type(first) is type(make(xs[0], ys[0]))
    x = (
        first["x"][0]
        if form == "nested"
        else first[0]
        if form != "dict"
        else first["x"]
    )
    y = first["y"] if form in ("dict", "nested") else first[1]
    np.testing.assert_array_equal(x, np.stack(xs[:2]))
    np.testing.assert_array_equal(y, np.stack(ys[:2]))
    # a custom batch size (from the shapes) is counted per batch
    fused = list(ciclo.fuse([make(x, y) for x, y in zip(xs, ys)], 3, lambda s: 10))
    assert [(s.n, s.samples) for s in fused] == [(3, 30), (2, 20), (1, 10)]


def test_a_resumed_fused_run_keeps_every_row(tmp_path):
    # the last fused call before a save (steps 3-5) is saved as its 3 rows, each
    # with its own values: the resumed history equals an uninterrupted one
    fused3 = managed.train_step(m.train_step.fn, steps_per_call=3)
    data = m.dataset(steps=12)

    def run(stop, resume=None):
        return ciclo.train_loop(
            m.create("jit"),
            lambda start_step: data[start_step:],
            {ciclo.on_train_step: fused3},
            epoch_duration=3,
            steps_per_call=3,
            stop=stop,
            resume=resume,
        )

    run(6, tmp_path)
    _, resumed, elapsed = run(12, tmp_path)
    _, straight, _ = run(12)
    assert elapsed.steps == 12
    keys = ("steps", "samples", "losses.loss", "steps_seen")
    assert resumed.collect(*keys) == straight.collect(*keys)
    assert resumed.collect("steps") == list(range(12))


MATRIX = [
    "eager",
    "jit",
    "jit_donate",
    "data_parallel",
    "data_parallel_donate",
    "sharded",
    "sharded(2x2 mesh, rules)",
]


@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("name", MATRIX)
def test_every_strategy_fused_or_not_equals_jit_on_four_devices(four_devices, name, k):
    matrix = four_devices["matrix"]
    reference, _ = matrix[("train_loop", "jit", 1, None)]
    result = matrix[("train_loop", name, k, None)]
    assert not isinstance(result, str), result  # the error it raised
    params, steps = result
    assert steps == 8 and max_diff(params, reference) < TOL


@pytest.mark.parametrize("prefetch", [0, 1])
@pytest.mark.parametrize(
    "name", ["data_parallel", "sharded", "sharded(2x2 mesh, rules)"]
)
def test_loop_fused_with_and_without_read_ahead_equals_jit(
    four_devices, name, prefetch
):
    matrix = four_devices["matrix"]
    reference, _ = matrix[("train_loop", "jit", 1, None)]
    result = matrix[("loop", name, 4, prefetch)]
    assert not isinstance(result, str), result
    params, steps = result
    assert steps == 8 and max_diff(params, reference) < TOL


@pytest.mark.parametrize("what", ["batch", "steps"])
@pytest.mark.parametrize("name", ["data_parallel", "sharded"])
def test_a_batch_reaches_the_devices_from_the_callers_memory(four_devices, name, what):
    placed = four_devices["placement"][(name, what)]
    # one batched transfer per leaf (x, y) at most, never one per device
    assert 1 <= placed["transfers"] <= 2
    # what the transfers get are views of the batch: no host copy, no transpose
    # (a fused batch of 3 steps reaches each device steps-major)
    assert placed["views"], placed["handed_shapes"]
    if what == "steps":
        assert all(shape[0] == 3 for shape in placed["handed_shapes"])
        assert all(shape[0] == 3 for shape in placed["shapes"])
