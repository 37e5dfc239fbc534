"""inner_loop aggregations: std, concat, the batch-size-weighted mean, per-entry
mappings, and the default of train_loop's test loop."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import ciclo

# an uneven test set: 10 samples in batches of 4, 4 and 2
X = np.arange(10, dtype=np.float32)
TEST_BATCHES = [X[0:4], X[4:8], X[8:10]]


def eval_step(state, batch):
    logs = ciclo.logs()
    logs.add_loss("loss", jnp.mean(batch))  # the per-batch mean of the samples
    logs.add_metric("acc", jnp.mean(batch > 4.5))
    logs.add_stateful_metric("seen", state)  # pretend it accumulates
    logs.add_output("y", batch)
    return logs, state + batch.shape[0]


def run_inner(state=0, data=TEST_BATCHES):
    return ciclo.loop(state, data, {ciclo.every(1): eval_step})


def test_test_aggregation_is_weighted_mean_for_losses_and_metrics_last_for_stateful():
    # what train_loop's test loop uses; a plain inner_loop defaults to "last"
    mapping = {"losses": "weighted_mean", "metrics": "weighted_mean"}
    logs, _ = ciclo.inner_loop("test", run_inner, aggregation=mapping)(0)
    assert float(logs.losses.loss_test) == pytest.approx(X.mean())  # 4.5, not 4.33
    assert float(logs.metrics.acc_test) == pytest.approx(np.mean(X > 4.5))
    assert int(logs.stateful_metrics.seen_test) == 8  # the last value
    np.testing.assert_array_equal(logs.outputs.y_test, X[8:10])  # "last"
    last, _ = ciclo.inner_loop("test", run_inner)(0)
    assert float(last.losses.loss_test) == pytest.approx(X[8:10].mean())


def test_train_loop_loss_test_is_the_per_sample_mean_over_an_uneven_test_set():
    def train_step(state, batch):
        return ciclo.logs().add_loss("loss", 0.0), state

    _, history, _ = ciclo.train_loop(
        0,
        [np.zeros(3)] * 4,
        {ciclo.on_train_step: train_step, ciclo.on_test_step: eval_step},
        test_dataset=lambda: TEST_BATCHES,
        epoch_duration=2,
    )
    np.testing.assert_allclose(history.collect("loss_test"), [X.mean()] * 2)
    assert history.collect("steps", "loss_test")[0] == [1, 3]


def test_std_and_concat():
    logs, _ = ciclo.inner_loop(
        "t", run_inner, aggregation={"loss": "std", "outputs": "concat"}
    )(0)
    means = [b.mean() for b in TEST_BATCHES]
    assert float(logs.losses.loss_t) == pytest.approx(np.std(means))
    np.testing.assert_array_equal(logs.outputs.y_t, X)
    scalars, _ = ciclo.inner_loop("t", run_inner, aggregation="concat")(0)
    np.testing.assert_allclose(scalars.losses.loss_t, means)


def test_per_entry_keys_beat_collection_keys():
    aggregation = {"metrics": "max", "metrics.acc": "min", "loss": "sum"}
    logs, _ = ciclo.inner_loop("t", run_inner, aggregation=aggregation)(0)
    assert float(logs.metrics.acc_t) == 0.0  # "metrics.acc" beats "metrics"
    means = [b.mean() for b in TEST_BATCHES]
    assert float(logs.losses.loss_t) == pytest.approx(sum(means))
    assert int(logs.stateful_metrics.seen_t) == 8  # not covered: the default


def test_weighted_mean_skips_steps_that_logged_nothing():
    def sometimes(state, batch, elapsed):
        if elapsed.steps != 1:  # step 1 logs nothing
            return ciclo.logs().add_loss("loss", jnp.mean(batch))

    batches = [np.full(2, 1.0), np.full(6, 100.0), np.full(2, 3.0)]
    logs, _ = ciclo.inner_loop(
        "t",
        lambda s: ciclo.loop(s, batches, {ciclo.every(1): sometimes}),
        aggregation="weighted_mean",
    )(0)
    # the gap's samples are spread over its steps: weights (2+6)/2 and 2
    assert float(logs.losses.loss_t) == pytest.approx((1.0 * 4 + 3.0 * 2) / 6)


def test_unknown_aggregation_lists_the_new_ones():
    with pytest.raises(ValueError, match="'std', 'concat'"):
        ciclo.inner_loop("t", run_inner, aggregation="median")
