"""`train_loop(epoch_logs=spec)`: per-entry aggregation of the train logs over
each epoch, on the device, and the modes a step declares with `aggregation=`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ciclo
from ciclo import managed

# batches of three sizes on purpose: the jitted steps recompile, and the loop's
# warning about it (issue 28) is not what these tests check
pytestmark = pytest.mark.filterwarnings("ignore:ciclo. the batches reaching")

# two epochs of three batches; batch sizes 1, 2, 3 (for the weighted mean)
VALUES = [[3.0, 1.0, 2.0], [5.0, 4.0, 9.0]]
SIZES = [1, 2, 3]
BATCHES = [np.full((n,), v, np.float32) for epoch in VALUES for v, n in
           zip(epoch, SIZES)]  # fmt: skip


@jax.jit
def step(state, batch):
    v = batch[0]
    logs = ciclo.logs().add_loss("loss", v).add_metric("acc", v / 10)
    logs.add_metric("vec", jnp.stack([v, -v]))
    return logs, state


def run(spec, tasks=None, batches=BATCHES, step_fn=step):
    return ciclo.train_loop(
        jnp.float32(0), batches, {ciclo.on_train_step: step_fn, **(tasks or {})},
        epoch_duration=3, epoch_logs=spec,
    )[1]  # fmt: skip


def expected(mode, scale=1.0):
    values = [[np.float32(v * scale) for v in epoch] for epoch in VALUES]
    if mode == "weighted_mean":
        return [np.average(epoch, weights=SIZES) for epoch in values]
    reduce = {
        "mean": np.mean, "sum": np.sum, "min": np.min, "max": np.max, "std": np.std,
        "first": lambda e: e[0], "last": lambda e: e[-1],
    }[mode]  # fmt: skip
    return [reduce(epoch) for epoch in values]


@pytest.mark.parametrize(
    "mode", ["mean", "weighted_mean", "sum", "min", "max", "std", "first", "last"]
)
def test_each_mode_is_inner_loops_mode_over_the_epochs_batches(mode):
    history = run(mode)  # a single mode: every loss and metric
    np.testing.assert_allclose(history.collect("loss_epoch"), expected(mode), 1e-5)
    np.testing.assert_allclose(history.collect("acc_epoch"), expected(mode, 0.1), 1e-5)
    # element-wise for arrays, as inner_loop's modes
    vec = np.stack(history.collect("vec_epoch"))
    np.testing.assert_allclose(vec[:, 0], expected(mode), 1e-5)
    # and the same as ciclo.inner_loop's aggregation of the same batches
    inner = ciclo.inner_loop(
        "x", lambda s: ciclo.loop(s, BATCHES[:3], {ciclo.every(1): step}),
        aggregation=mode,
    )  # fmt: skip
    logs, _ = inner(jnp.float32(0))
    assert float(logs.losses.loss_x) == pytest.approx(
        float(history.collect("loss_epoch")[0]), rel=1e-5
    )


def test_concat_and_a_function_get_the_epochs_values():
    history = run({"loss": "concat", "acc": lambda values: len(values)})
    concat = history.collect("loss_epoch")
    np.testing.assert_array_equal(concat[1], VALUES[1])
    assert history.collect("acc_epoch") == [3, 3]
    # entries the dict does not name keep the default: batch-weighted means
    assert history.collect("vec_epoch")[0][0] == pytest.approx(expected(
        "weighted_mean")[0])  # fmt: skip


def test_true_is_still_the_batch_weighted_mean_of_losses_and_metrics_only():
    def step_with_more(state, batch):
        logs, state = step(state, batch)
        logs.add_stateful_metric("count", batch.shape[0])
        return logs.add_output("y", batch), state

    history = run(True, step_fn=step_with_more)
    np.testing.assert_allclose(
        history.collect("loss_epoch"), expected("weighted_mean"), 1e-6
    )
    logged = {k.split(".")[1] for k in history.keys()}  # noqa: SIM118 (a list)
    assert not {"count_epoch", "y_epoch"} & logged
    # a dict naming another collection adds it
    history = run({"stateful_metrics": "sum"}, step_fn=step_with_more)
    assert history.collect("count_epoch") == [6, 6]


def test_a_step_declares_the_mode_of_an_entry():
    @jax.jit
    def declaring(state, batch):
        logs, state = step(state, batch)
        logs.add_metric("best", batch[0], aggregation="max")
        logs.add_loss("total", batch[0], aggregation="sum")
        logs.add_entry("custom", "seen", batch.shape[0], aggregation="sum")
        return logs, state

    history = run(True, step_fn=declaring)
    assert history.collect("best_epoch") == expected("max")
    assert history.collect("total_epoch") == expected("sum")
    assert history.collect("seen_epoch") == [6, 6]  # any collection, if declared
    # a declaration beats a mode for the whole collection or all entries, not a
    # key naming the entry
    history = run({"metrics": "min", "best": "first"}, step_fn=declaring)
    assert history.collect("best_epoch") == expected("first")
    assert history.collect("acc_epoch") == pytest.approx(expected("min", 0.1))
    history = run("min", step_fn=declaring)
    assert history.collect("best_epoch") == expected("max")


def test_declared_modes_survive_jit_merge_and_a_managed_step():
    @jax.jit
    def f(x):
        return ciclo.logs().add_metric("acc", x, aggregation="max").add_loss("l", x)

    logs = f(1.0)
    assert logs.aggregations == {("metrics", "acc"): "max"}
    assert ciclo.logs().merge(logs).aggregations == logs.aggregations
    assert jax.tree.map(lambda x: x + 1, logs).aggregations == logs.aggregations
    plain = ciclo.logs().add_metric("acc", 1.0).add_loss("l", 1.0)
    assert plain.aggregations == {}
    assert jax.tree.structure(plain) != jax.tree.structure(logs)
    assert jax.tree.leaves(plain) == [1.0, 1.0]
    with pytest.raises(ValueError, match="aggregation.*'median'"):
        ciclo.logs().add_metric("acc", 1.0, aggregation="median")

    @managed.train_step
    def train_step(state, batch):
        loss = (state.params - batch) ** 2
        return ciclo.logs().add_loss("loss", loss, aggregation="max")

    state = managed.ManagedState.create(
        params=jnp.float32(0.0), tx=optax.sgd(0.0), strategy="jit"
    )
    _, history, _ = ciclo.train_loop(
        state, [np.float32(v) for v in (1, 3, 2)], {ciclo.on_train_step: train_step},
        epoch_logs=True,
    )  # fmt: skip
    assert history.collect("loss_epoch") == [9.0]


def test_epoch_aggregates_stay_on_the_device_until_the_history_reads_them():
    seen = []

    def check(state, batch, elapsed, loop_state):
        seen.extend(type(v) for _, v in loop_state.logs["losses"].items())

    # no implicit device-to-host transfer anywhere (a float(x) or np.minimum(x)
    # per step would raise)
    with jax.transfer_guard_device_to_host("disallow"):
        for mode in ("mean", "min", "max", "std", "sum", "concat"):
            history = run(mode, {ciclo.on_epoch_end: check})
            assert len(history.collect("loss_epoch")) == 2
    assert seen and all(issubclass(t, jax.Array) for t in seen)


def test_bad_specs_are_clear_errors():
    with pytest.raises(ValueError, match=r"epoch_logs\['loss'\].*'median'"):
        run({"loss": "median"})
    with pytest.raises(TypeError, match="epoch_logs"):
        run({1: "mean"})


def test_train_loops_test_aggregation_honours_declared_modes():
    def test_step(state, batch):
        logs = ciclo.logs().add_loss("loss", batch[0])  # default: weighted mean
        return logs.add_metric("worst", batch[0], aggregation="max")

    _, history, _ = ciclo.train_loop(
        jnp.float32(0),
        BATCHES[:3],
        {ciclo.on_train_step: step, ciclo.on_test_step: test_step},
        test_dataset=lambda: BATCHES[3:],
        inner_loop_kwargs={"aggregation": {"metrics": "min"}},
    )
    assert history.collect("worst_test") == [9.0]  # declared beats "metrics"
    assert history.collect("loss_test") == pytest.approx(expected("weighted_mean")[1:])


@pytest.mark.parametrize(
    "mode", ["mean", "weighted_mean", "max", "std", "first", "concat"]
)
def test_fused_steps_aggregate_step_by_step_as_unfused(mode):
    @managed.train_step
    def fused_step(state, batch):
        loss = (state.params - batch.mean()) ** 2
        return ciclo.logs().add_loss("loss", loss).add_metric("m", batch.mean())

    state = managed.ManagedState.create(
        params=jnp.float32(0.0), tx=optax.sgd(0.0), strategy="jit"
    )
    data = [np.full((2,), v, np.float32) for v in (1, 3, 2, 0, 5, 4, 1, 1)]
    results = []
    for steps_per_call in (1, 2):
        _, history, _ = ciclo.train_loop(
            state, data, {ciclo.on_train_step: fused_step}, epoch_duration=4,
            epoch_logs=mode, steps_per_call=steps_per_call,
        )  # fmt: skip
        results.append(history.collect("loss_epoch"))
    unfused, fused = results
    assert len(unfused) == len(fused) == 2
    for a, b in zip(unfused, fused):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)


_STRATEGIES_SCRIPT = """
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
import jax.numpy as jnp, numpy as np, optax, ciclo
from ciclo import managed

@managed.train_step
def train_step(state, batch):
    loss = jnp.mean((state.params - batch) ** 2)
    logs = ciclo.logs().add_loss("loss", loss, aggregation="max")
    # a count declared "sum": summed across devices, not averaged (issue 31)
    logs.add_metric("count", jnp.sum(jnp.ones_like(batch)), aggregation="sum")
    logs.add_metric("top", batch.max(), aggregation="max")
    return logs.add_metric("m", batch.mean(), aggregation="min")

for strategy in ("jit", "data_parallel", "sharded"):
    state = managed.ManagedState.create(
        params=jnp.float32(0.0), tx=optax.sgd(0.0), strategy=strategy)
    data = [np.full((4,), v, np.float32) for v in (1, 3, 2, 0)]
    _, h, _ = ciclo.train_loop(
        state, data, {ciclo.on_train_step: train_step}, epoch_logs=True)
    assert h.collect("loss_epoch") == [9.0], (strategy, h.collect("loss_epoch"))
    assert h.collect("m_epoch") == [0.0], (strategy, h.collect("m_epoch"))
    assert h.collect("count") == [4.0] * 4, (strategy, h.collect("count"))
    assert h.collect("count_epoch") == [16.0], (strategy, h.collect("count_epoch"))
    # each batch holds 4 rows of one value: a row-dependent max checks pmax
    state = managed.ManagedState.create(
        params=jnp.float32(0.0), tx=optax.sgd(0.0), strategy=strategy)
    ramp = [np.arange(4, dtype=np.float32) + v for v in (0, 10)]
    _, h, _ = ciclo.train_loop(state, ramp, {ciclo.on_train_step: train_step})
    assert h.collect("top") == [3.0, 13.0], (strategy, h.collect("top"))
print("ok")
"""


@pytest.mark.slow
def test_declared_modes_survive_the_multi_device_strategies():
    import os
    import pathlib
    import subprocess
    import sys

    root = str(pathlib.Path(__file__).resolve().parents[1])
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-c", _STRATEGIES_SCRIPT],
        env=dict(os.environ, PYTHONPATH=path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-3000:]


def test_a_batch_of_no_samples_counts_for_nothing_in_the_weighted_mean():
    # an empty batch's mean is NaN; its weight (its samples) is 0, so it counts for
    # nothing, as in inner_loop's weighted mean; a NaN of a batch with samples
    # still propagates, and with no samples at all it is the plain mean
    def mean_step(state, batch):
        return ciclo.logs().add_loss("loss", jnp.mean(batch)), state

    def epoch_mean(batches):
        history = ciclo.train_loop(
            0, batches, {ciclo.on_train_step: mean_step}, epoch_logs=True,
            batch_size_fn=lambda shapes: shapes[0][0],
        )[1]  # fmt: skip
        return float(history.collect("loss_epoch")[0])

    def inner_mean(batches):
        logs, _ = ciclo.inner_loop(
            "x", lambda s: ciclo.loop(s, batches, {ciclo.every(1): mean_step},
            batch_size_fn=lambda shapes: shapes[0][0]),
            aggregation="weighted_mean",
        )(0)  # fmt: skip
        return float(logs.losses.loss_x)

    empty = np.zeros((0,), np.float32)
    batches = [np.full((2,), 1.0, np.float32), empty, np.full((3,), 6.0, np.float32)]
    reference = np.average([1.0, 6.0], weights=[2, 3])
    assert epoch_mean(batches) == pytest.approx(reference)
    assert inner_mean(batches) == pytest.approx(reference)
    with_nan = [np.array([1.0, np.nan], np.float32), empty]
    assert np.isnan(epoch_mean(with_nan)) and np.isnan(inner_mean(with_nan))
    assert np.isnan(epoch_mean([empty, empty]))
