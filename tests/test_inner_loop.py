"""inner_loop: aggregations, per-collection mapping, output_state, loop use."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import ciclo

VALUES = [3.0, 1.0, 4.0, 2.0]


def _inner_run(state):
    """An inner loop over VALUES logging a metric, an output array and a loss."""

    def step(state, batch):
        logs = ciclo.logs()
        logs.add_metric("x", jnp.asarray(batch))  # device values are fine
        logs.add_output("v", np.array([batch, -batch]))
        logs.add_loss("l", batch)
        return logs, state + 1

    return ciclo.loop(state, VALUES, {ciclo.every(1): step})


@pytest.mark.parametrize(
    ("aggregation", "expected"),
    [
        ("last", 2.0),
        ("first", 3.0),
        ("mean", 2.5),
        ("sum", 10.0),
        ("min", 1.0),
        ("max", 4.0),
        (lambda values: len(values), 4),
    ],
)
def test_aggregations(aggregation, expected):
    logs, state = ciclo.inner_loop("t", _inner_run, aggregation=aggregation)(0)
    assert float(logs.metrics.x_t) == expected
    assert state == 0  # output_state=False: the state is left as it was
    assert "elapsed" not in logs  # the inner elapsed collection is skipped


def test_sum_vs_last_and_arrays_reduce_elementwise():
    last, _ = ciclo.inner_loop("t", _inner_run, aggregation="last")(0)
    total, _ = ciclo.inner_loop("t", _inner_run, aggregation="sum")(0)
    assert float(last.metrics.x_t) == 2.0 and float(total.metrics.x_t) == 10.0
    np.testing.assert_array_equal(total.outputs.v_t, [10.0, -10.0])


def test_per_collection_mapping_and_output_state():
    inner = ciclo.inner_loop(
        "t",
        _inner_run,
        aggregation={"metrics": "max", "losses": "sum"},
        output_state=True,
    )
    logs, state = inner(10)
    assert float(logs.metrics.x_t) == 4.0
    assert float(logs.losses.l_t) == 10.0
    np.testing.assert_array_equal(logs.outputs.v_t, [2.0, -2.0])  # default "last"
    assert state == 14


def test_in_a_loop_logs_merge_into_the_step():
    def after(state, batch, elapsed, loop_state):
        seen.append(float(loop_state.logs.entry_value("x_t")))

    seen = []
    state, history, _ = ciclo.loop(
        100,
        range(2),
        {
            ciclo.every(1): [
                ciclo.inner_loop("t", _inner_run, aggregation="mean"),
                after,
            ]
        },
    )
    assert state == 100 and seen == [2.5, 2.5]
    assert history.collect("x_t") == [2.5, 2.5]

    state, _, _ = ciclo.loop(
        0,
        range(2),
        {ciclo.every(1): ciclo.inner_loop("t", _inner_run, output_state=True)},
    )
    assert state == 8


def test_uneven_shapes_name_the_entry():
    def ragged_run(state):  # the last batch is smaller: outputs of uneven shapes
        def step(state, batch):
            logs = ciclo.logs()
            logs.add_metric("x", batch.sum())
            logs.add_output("o", batch)
            return logs

        return ciclo.loop(state, [np.ones(3), np.ones(1)], {ciclo.every(1): step})

    with pytest.raises(ValueError, match=r"'mean' of `outputs\.o`") as info:
        ciclo.inner_loop("t", ragged_run, aggregation="mean")(0)
    assert "'outputs': np.concatenate" in str(info.value)
    mapping = {"metrics": "mean", "outputs": np.concatenate}
    logs, _ = ciclo.inner_loop("t", ragged_run, aggregation=mapping)(0)
    assert float(logs.metrics.x_t) == 2.0 and logs.outputs.o_t.shape == (4,)


def test_errors():
    with pytest.raises(ValueError, match="'median'"):
        ciclo.inner_loop("t", _inner_run, aggregation="median")
    with pytest.raises(ValueError, match=r"aggregation\['metrics'\]"):
        ciclo.inner_loop("t", _inner_run, aggregation={"metrics": "avg"})
    with pytest.raises(TypeError, match="loop_fn"):
        ciclo.inner_loop("t", None)
    with pytest.raises(TypeError, match="non-empty string"):
        ciclo.inner_loop("", _inner_run)
    with pytest.raises(TypeError, match=r"must return \(state, history"):
        ciclo.inner_loop("t", lambda state: state)(0)


def test_a_test_loop_in_a_standalone_inner_loop_honours_declared_modes():
    """Issue 31 7b: `aggregation="sum"` declared by the step wins over the inner
    loop's default ("last"), as in train_loop's own evaluation."""

    def test_step(state, batch):
        logs = ciclo.logs().add_metric("count", float(batch), aggregation="sum")
        return logs.add_metric("plain", float(batch)), state

    inner = ciclo.inner_loop(
        "test",
        lambda s: ciclo.test_loop(s, [1, 2, 3], {ciclo.on_test_step: test_step}),
    )
    logs, _ = inner(None)
    assert logs.metrics.count_test == 6.0  # declared "sum"
    assert logs.metrics.plain_test == 3.0  # the default, "last"
    # and the same step under train_loop's evaluation
    _, history, _ = ciclo.train_loop(
        None, [0, 0], {ciclo.on_test_step: test_step, ciclo.on_train_step: ciclo.noop},
        test_dataset=lambda: [1, 2, 3], epoch_duration=2,
    )  # fmt: skip
    assert history.collect("count_test") == [6.0]


def test_the_test_aggregation_is_exported_and_is_train_loops_default():
    spec = ciclo.callbacks.TEST_AGGREGATION
    assert dict(spec) == {
        "stateful_metrics": "last",
        "losses": "weighted_mean",
        "metrics": "weighted_mean",
    }
    with pytest.raises(TypeError):
        spec["losses"] = "last"  # read-only: train_loop's default cannot drift

    def test_step(state, batch):  # batches of 2, 2 and 1 samples
        logs = ciclo.logs().add_loss("loss", float(batch.mean()))
        return logs.add_metric("acc", float(batch.mean())), state

    data = [np.array([1.0, 1.0]), np.array([1.0, 1.0]), np.array([4.0])]
    inner = ciclo.inner_loop(
        "test",
        lambda s: ciclo.test_loop(s, data, {ciclo.on_test_step: test_step}),
        aggregation=spec,
    )
    logs, _ = inner(None)
    assert logs.losses.loss_test == pytest.approx(1.6)  # (1+1+1+1+4) / 5
    _, history, _ = ciclo.train_loop(
        None, [0, 0], {ciclo.on_test_step: test_step, ciclo.on_train_step: ciclo.noop},
        test_dataset=lambda: data, epoch_duration=2,
    )  # fmt: skip
    assert history.collect("loss_test") == [pytest.approx(1.6)]
    assert history.collect("acc_test") == [pytest.approx(1.6)]
