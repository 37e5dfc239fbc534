"""API.md §4 — Logs and History."""

from __future__ import annotations

import tracemalloc
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ciclo

# ------------------------------------------------------------------- Logs


def test_logs_is_a_dict_of_collections():
    logs = ciclo.logs()
    assert isinstance(logs, ciclo.Logs)
    assert isinstance(logs, Mapping)
    logs.add_entry("custom", "x", 1.5)
    assert logs["custom"]["x"] == 1.5


@pytest.mark.parametrize(
    "call, collection, entries",
    [
        (lambda lg: lg.add_entry("custom", "x", 1), "custom", {"x": 1}),
        (lambda lg: lg.add_entries("custom", a=1, b=2), "custom", {"a": 1, "b": 2}),
        (lambda lg: lg.add_metric("acc", 0.5), "metrics", {"acc": 0.5}),
        (lambda lg: lg.add_metrics(acc=0.5, f1=0.1), "metrics", {"acc": 0.5, "f1": 0.1}),
        (lambda lg: lg.add_loss("loss", 0.3), "losses", {"loss": 0.3}),
        (lambda lg: lg.add_losses(l1=0.3, l2=0.4), "losses", {"l1": 0.3, "l2": 0.4}),
        (lambda lg: lg.add_stateful_metric("m", 2.0), "stateful_metrics", {"m": 2.0}),
        (lambda lg: lg.add_stateful_metrics(m=2.0, n=3.0), "stateful_metrics", {"m": 2.0, "n": 3.0}),
        (lambda lg: lg.add_output("preds", 7), "outputs", {"preds": 7}),
        (lambda lg: lg.add_outputs(preds=7, feats=8), "outputs", {"preds": 7, "feats": 8}),
    ],
    ids=[
        "add_entry", "add_entries", "add_metric", "add_metrics", "add_loss",
        "add_losses", "add_stateful_metric", "add_stateful_metrics", "add_output",
        "add_outputs",
    ],
)  # fmt: skip
def test_add_methods_fill_the_right_collection(call, collection, entries):
    logs = ciclo.logs()
    call(logs)
    assert dict(logs[collection]) == entries


@pytest.mark.parametrize(
    "call",
    [
        lambda lg: lg.add_entry("custom", "x", 1),
        lambda lg: lg.add_entries("custom", a=1),
        lambda lg: lg.add_metric("acc", 0.5),
        lambda lg: lg.add_metrics(acc=0.5),
        lambda lg: lg.add_loss("loss", 0.3),
        lambda lg: lg.add_losses(l1=0.3),
        lambda lg: lg.add_stateful_metric("m", 2.0),
        lambda lg: lg.add_stateful_metrics(m=2.0),
        lambda lg: lg.add_output("preds", 7),
        lambda lg: lg.add_outputs(preds=7),
    ],
    ids=[
        "add_entry", "add_entries", "add_metric", "add_metrics", "add_loss",
        "add_losses", "add_stateful_metric", "add_stateful_metrics", "add_output",
        "add_outputs",
    ],
)  # fmt: skip
def test_each_add_method_returns_the_logs(call):
    logs = ciclo.logs()
    assert call(logs) is logs


def test_add_calls_chain():
    state = object()

    def step():
        return ciclo.logs().add_loss("loss", 1.0).add_metric("acc", 0.5), state

    logs, s = step()
    assert s is state
    assert logs["losses"]["loss"] == 1.0 and logs["metrics"]["acc"] == 0.5


def test_add_loss_with_add_metric_logs_both():
    logs = ciclo.logs()
    logs.add_loss("loss", 0.3, add_metric=True)
    assert logs["losses"]["loss"] == 0.3
    assert logs["metrics"]["loss"] == 0.3

    logs = ciclo.logs()
    logs.add_losses(l1=0.1, l2=0.2, add_metrics=True)
    assert dict(logs["losses"]) == {"l1": 0.1, "l2": 0.2}
    assert dict(logs["metrics"]) == {"l1": 0.1, "l2": 0.2}


def test_merge_and_write_only_updates():
    a = ciclo.logs()
    a.add_metric("x", 1)
    b = ciclo.logs()
    b.add_metric("y", 2)
    b.add_loss("l", 3)
    a.merge(b)
    assert dict(a["metrics"]) == {"x": 1, "y": 2}
    assert dict(a["losses"]) == {"l": 3}

    c = ciclo.logs()
    c.updates = b
    assert dict(c["metrics"]) == {"y": 2}
    c.updates = None  # merging nothing is allowed (a step may return no logs)
    assert dict(c["metrics"]) == {"y": 2}
    with pytest.raises(AttributeError):
        c.updates


def test_attribute_access():
    logs = ciclo.logs()
    logs.add_loss("loss", 0.25)
    logs.add_metric("accuracy", 0.75)
    assert logs.losses.loss == 0.25
    assert logs.metrics.accuracy == 0.75


def test_entry_value_bare_qualified_and_ambiguous():
    logs = ciclo.logs()
    logs.add_loss("loss", 0.3, add_metric=True)
    logs.add_metric("accuracy", 0.9)
    assert logs.entry_value("accuracy") == 0.9
    assert logs.entry_value("metrics.accuracy") == 0.9
    assert logs.entry_value("losses.loss") == 0.3
    assert logs.entry_value("metrics.loss") == 0.3
    with pytest.raises(Exception) as info:
        logs.entry_value("loss")
    msg = str(info.value)
    assert "losses" in msg and "metrics" in msg


def test_logs_is_a_pytree_returned_from_jit():
    @jax.jit
    def step(x):
        logs = ciclo.logs()
        logs.add_loss("loss", jnp.sum(x))
        logs.add_metric("mean", jnp.mean(x))
        return logs

    logs = step(jnp.arange(4.0))
    assert isinstance(logs, ciclo.Logs)
    assert float(logs.losses.loss) == 6.0
    assert float(logs.entry_value("mean")) == 1.5


# ------------------------------------------------------------------- History


def _row(**metrics):
    logs = ciclo.logs()
    for k, v in metrics.items():
        logs.add_metric(k, v)
    return logs


def test_history_commit_by_hand_and_collect_aligned():
    history = ciclo.history()
    assert isinstance(history, ciclo.History)
    assert len(history) == 0
    rows = [
        dict(loss=3.0, accuracy_test=0.1),
        dict(loss=2.0),
        dict(loss=1.0, accuracy_test=0.3),
    ]
    for (elapsed, _), row in zip(ciclo.elapse(range(3)), rows):
        history.commit(elapsed, _row(**row))
    assert len(history) == 3
    steps, loss, acc = history.collect("steps", "loss", "accuracy_test")
    assert list(steps) == [0, 2]
    assert list(loss) == [3.0, 1.0]
    assert list(acc) == pytest.approx([0.1, 0.3])
    # one key -> one list (not a tuple of one)
    assert list(history.collect("loss")) == [3.0, 2.0, 1.0]


def test_history_collect_key_never_logged_is_a_key_error_with_a_did_you_mean():
    # issue 28: a typo (`"los"`) must not look like "not logged yet"
    history = ciclo.history()
    for elapsed, _ in ciclo.elapse(range(3)):
        history.commit(elapsed, _row(loss=1.0))
    with pytest.raises(KeyError, match="never_logged"):
        history.collect("steps", "never_logged")
    with pytest.raises(KeyError, match="Did you mean 'loss'"):
        history.collect("los")
    assert list(history.collect("steps")) == [0, 1, 2]


def test_history_values_come_back_on_the_host():
    history = ciclo.history()
    for elapsed, i in ciclo.elapse(range(3)):
        logs = _row(loss=jnp.asarray(float(i)))
        logs.add_output("preds", jnp.arange(3.0) + i)
        history.commit(elapsed, logs)
    loss, preds = history.collect("loss", "preds")
    assert all(not isinstance(v, jax.Array) for v in loss)
    assert all(isinstance(v, (int, float, np.generic, np.ndarray)) for v in loss)
    assert [float(v) for v in loss] == [0.0, 1.0, 2.0]
    assert all(
        isinstance(p, np.ndarray) and not isinstance(p, jax.Array) for p in preds
    )
    np.testing.assert_array_equal(preds[2], np.arange(3.0) + 2)


def test_history_commit_does_not_sync_device_to_host():
    history = ciclo.history()
    f = jax.jit(lambda x: x * 2.0)
    x = jnp.asarray(1.0)
    with jax.transfer_guard_device_to_host("disallow"):
        for elapsed, _ in ciclo.elapse(range(20)):
            x = f(x)
            history.commit(elapsed, _row(v=x))
    assert len(history.collect("v")) == 20


def test_history_memory_per_logged_scalar_is_small():
    n = 4000
    history = ciclo.history()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for e, i in ciclo.elapse(range(n)):
            history.commit(e, _row(loss=float(i)))  # the Logs is dropped by the caller
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    per_row = (after - before) / n
    # one scalar entry plus the 4 elapsed fields per row; keeping a dict-of-dicts per
    # row costs well over 1 KB
    assert per_row < 400, f"{per_row:.0f} bytes per committed row"
    assert len(history.collect("loss")) == n
