import jax
import jax.numpy as jnp
import pytest

import ciclo


def test_add_methods_fill_collections():
    logs = ciclo.logs()
    logs.add_entry("custom", "a", 1)
    logs.add_entries("custom", {"b": 2}, c=3)
    logs.add_metric("acc", 0.5)
    logs.add_metrics(f1=0.1)
    logs.add_loss("mse", 2.0)
    logs.add_losses({"l1": 1.0}, add_metrics=True)
    logs.add_loss("ce", 3.0, add_metric=True)
    logs.add_stateful_metric("avg", 4.0)
    logs.add_stateful_metrics(mx=5.0)
    logs.add_output("preds", [1, 2])
    logs.add_outputs(emb=[0])
    assert logs == {
        "custom": {"a": 1, "b": 2, "c": 3},
        "metrics": {"acc": 0.5, "f1": 0.1, "l1": 1.0, "ce": 3.0},
        "losses": {"mse": 2.0, "l1": 1.0, "ce": 3.0},
        "stateful_metrics": {"avg": 4.0, "mx": 5.0},
        "outputs": {"preds": [1, 2], "emb": [0]},
    }
    assert logs.losses.mse == 2.0 and logs.metrics.acc == 0.5


def test_attribute_errors_name_what_exists():
    logs = ciclo.logs()
    logs.add_metric("acc", 1.0)
    with pytest.raises(AttributeError, match="collections: \\['metrics'\\]"):
        logs.losses
    with pytest.raises(AttributeError, match="entries: \\['acc'\\]"):
        logs.metrics.loss


def test_merge_and_updates():
    a = ciclo.logs({"metrics": {"x": 1, "y": 2}})
    b = ciclo.logs({"metrics": {"y": 3}, "losses": {"l": 4}})
    assert a.merge(b) is a
    assert a == {"metrics": {"x": 1, "y": 3}, "losses": {"l": 4}}
    c = ciclo.logs()
    c.updates = b
    c.updates = None
    assert c == b
    with pytest.raises(AttributeError, match="write-only"):
        c.updates
    with pytest.raises(TypeError, match="Collection 'metrics'"):
        c.merge({"metrics": 1.0})
    assert c == b  # nothing half-applied


def test_entry_value_bare_qualified_missing_ambiguous():
    logs = ciclo.logs()
    logs.add_loss("loss", 1.0, add_metric=True)
    logs.add_metric("acc", 0.9)
    assert logs.entry_value("acc") == 0.9
    assert logs.entry_value("metrics.loss") == 1.0
    with pytest.raises(
        ValueError, match="'losses.loss'.*'metrics.loss'|losses.*metrics"
    ):
        logs.entry_value("loss")
    with pytest.raises(KeyError, match="metrics.acc"):
        logs.entry_value("f1")
    with pytest.raises(KeyError):
        logs.entry_value("losses.acc")


def test_logs_is_a_pytree_returned_from_jit():
    @jax.jit
    def f(x):
        logs = ciclo.logs()
        logs.add_loss("loss", x * 2)
        logs.add_metric("acc", x + 1)
        return logs

    out = f(jnp.float32(1.0))
    assert isinstance(out, ciclo.Logs)
    assert out.losses.loss == 2.0 and out.metrics.acc == 2.0
    assert list(out) == ["losses", "metrics"]  # insertion order kept
    doubled = jax.tree.map(lambda v: v * 2, out)
    assert isinstance(doubled, ciclo.Logs) and doubled.metrics.acc == 4.0
    paths = [
        jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(out)
    ]
    assert paths == ["['losses']['loss']", "['metrics']['acc']"]
