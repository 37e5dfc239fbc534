"""inner_loop aggregations: std, concat, the batch-size-weighted mean, per-entry
mappings, and the default of train_loop's test loop."""

from __future__ import annotations

import jax
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


# A step that logs its batch's total sample weight (`weights.sample_weight`) is
# weighted by it: zero-weight padding counts for nothing, even a fully padded
# batch whose own weighted mean is 0/0 = NaN (docs/predefined.md, the test loop).
@jax.jit
def padded_step(batch):
    values, weights = batch
    mean = jnp.sum(values * weights) / jnp.sum(weights)  # NaN when all padding
    logs = ciclo.logs().add_loss("loss", mean)
    logs.add_metric("vec", jnp.stack([mean, 2 * mean]))  # an array entry
    return logs.add_entry("weights", "sample_weight", jnp.sum(weights))


def padded(values, n_real, size=4):
    return (
        np.asarray(values + [0.0] * (size - len(values)), np.float32),
        np.asarray([1.0] * n_real + [0.0] * (size - n_real), np.float32),
    )


def aggregate_padded(batches):
    logs, _ = ciclo.inner_loop(
        "t",
        lambda s: ciclo.loop(s, batches, {ciclo.every(1): lambda s, b: padded_step(b)}),
        aggregation="weighted_mean",
    )(0)
    return float(logs.losses.loss_t), np.asarray(logs.metrics.vec_t)


def reference(batches):
    """numpy: the weighted mean of the samples, padding (weight 0) left out."""
    values = np.concatenate([v for v, _ in batches])
    weights = np.concatenate([w for _, w in batches])
    return np.average(values, weights=weights)


def test_a_fully_padded_batch_counts_for_nothing_in_the_weighted_mean():
    batches = [
        padded([3.0, 1.0, 2.0], 3),
        padded([], 0),  # all padding: its mean is NaN, its weight 0
        padded([5.0, 7.0], 2),
    ]
    assert np.isnan(float(padded_step(batches[1]).losses.loss))
    loss, vec = aggregate_padded(batches)
    assert loss == pytest.approx(reference(batches))  # (6 + 12) / 5
    np.testing.assert_allclose(vec, [reference(batches), 2 * reference(batches)], 1e-6)


def test_a_nan_of_a_batch_with_weight_still_propagates():
    batches = [padded([3.0, np.nan], 2), padded([], 0), padded([5.0], 1)]
    loss, vec = aggregate_padded(batches)
    assert np.isnan(loss) and np.isnan(vec).all()  # what nan_guard relies on


def test_when_no_batch_has_weight_the_weighted_mean_is_the_plain_mean():
    # nothing to weigh by: every value counts alike (all-padding batches: NaN)
    def step(state, batch):
        return padded_step(batch).add_entry("weights", "sample_weight", 0.0)

    batches = [padded([3.0, 1.0], 2), padded([5.0], 1)]
    logs, _ = ciclo.inner_loop(
        "t",
        lambda s: ciclo.loop(s, batches, {ciclo.every(1): step}),
        aggregation="weighted_mean",
    )(0)
    assert float(logs.losses.loss_t) == pytest.approx(np.mean([2.0, 5.0]))
    loss, _ = aggregate_padded([padded([], 0), padded([], 0)])
    assert np.isnan(loss)


def test_train_loops_test_loop_ignores_a_fully_padded_custom_batch():
    def test_step(state, batch):
        return padded_step(batch), state

    test_batches = [padded([3.0, 3.0, 3.0, 3.0], 4), padded([], 0)]
    _, history, _ = ciclo.train_loop(
        0,
        [np.zeros(2)],
        {ciclo.on_train_step: lambda state: state, ciclo.on_test_step: test_step},
        test_dataset=lambda: test_batches,
    )
    assert history.collect("loss_test") == [pytest.approx(reference(test_batches))]
