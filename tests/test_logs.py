import jax
import jax.numpy as jnp
import numpy as np
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


# `Logs.add_*(..., aggregation=)` declares an entry's default mode (API.md §5): the
# plural adders declare it for every entry they add, in every call form.
def test_plural_adders_declare_aggregation_for_every_entry():
    logs = ciclo.logs()
    logs.add_entries("custom", {"a": 1}, b=2, aggregation="sum")
    logs.add_metrics({"acc": 0.5}, f1=0.1, aggregation="max")
    logs.add_losses({"l1": 1.0}, l2=2.0, add_metrics=True, aggregation="min")
    logs.add_stateful_metrics(avg=4.0, aggregation="last")
    logs.add_outputs({"preds": [1, 2]}, aggregation="concat")
    logs.add_output("emb", [0], aggregation="concat")
    assert logs == {
        "custom": {"a": 1, "b": 2},
        "metrics": {"acc": 0.5, "f1": 0.1, "l1": 1.0, "l2": 2.0},
        "losses": {"l1": 1.0, "l2": 2.0},
        "stateful_metrics": {"avg": 4.0},
        "outputs": {"preds": [1, 2], "emb": [0]},
    }
    assert logs.aggregations == {
        ("custom", "a"): "sum",
        ("custom", "b"): "sum",
        ("metrics", "acc"): "max",
        ("metrics", "f1"): "max",
        ("losses", "l1"): "min",
        ("metrics", "l1"): "min",
        ("losses", "l2"): "min",
        ("metrics", "l2"): "min",
        ("stateful_metrics", "avg"): "last",
        ("outputs", "preds"): "concat",
        ("outputs", "emb"): "concat",
    }


def test_plural_adders_without_aggregation_declare_nothing():
    logs = ciclo.logs().add_metrics({"a": 1.0}, b=2.0, aggregation=None)
    logs.add_losses(c=3.0, add_metrics=True).add_outputs(d=4.0).add_output("e", 5)
    assert logs.aggregations == {}
    # an entry literally named "aggregation" is passed in the dict form
    logs.add_metrics({"aggregation": 0.5}).add_entries("x", {"aggregation": 1})
    assert logs.metrics["aggregation"] == 0.5 and logs.x["aggregation"] == 1
    assert logs.aggregations == {}


@pytest.mark.parametrize(
    "add",
    [
        lambda logs: logs.add_entries("custom", {"a": 1}, aggregation="median"),
        lambda logs: logs.add_metrics(a=1.0, aggregation="median"),
        lambda logs: logs.add_losses(
            {"a": 1.0}, add_metrics=True, aggregation="median"
        ),
        lambda logs: logs.add_stateful_metrics(a=1.0, aggregation="median"),
        lambda logs: logs.add_outputs(a=1.0, aggregation="median"),
        lambda logs: logs.add_output("a", 1.0, aggregation="median"),
        lambda logs: logs.add_metric("a", 1.0, aggregation="median"),
        lambda logs: logs.add_loss("a", 1.0, add_metric=True, aggregation="median"),
        lambda logs: logs.add_entry("custom", "a", 1.0, aggregation="median"),
        lambda logs: logs.add_stateful_metric("a", 1.0, aggregation="median"),
        lambda logs: logs.add_metrics(aggregation="median"),  # nothing to add
    ],
)
def test_an_unknown_aggregation_is_the_singular_adders_error_and_adds_nothing(add):
    with pytest.raises(ValueError, match="must be one of .*got 'median'") as singular:
        ciclo.logs().add_metric("a", 1.0, aggregation="median")
    logs = ciclo.logs().add_metric("kept", 1.0)
    with pytest.raises(ValueError, match="must be one of .*got 'median'") as plural:
        add(logs)
    assert type(plural.value) is type(singular.value)
    assert logs == {"metrics": {"kept": 1.0}} and logs.aggregations == {}


def test_plural_adders_hint_at_the_dict_form_for_an_entry_named_aggregation():
    with pytest.raises(ValueError, match=r"add_metrics\(\{'aggregation': value\}\)"):
        ciclo.logs().add_metrics(aggregation=0.5)  # once an entry, now the mode


def test_plural_declarations_are_honoured_by_the_test_loop_and_epochs():
    def train_step(state, batch):
        logs = ciclo.logs().add_metrics({"seen": float(len(batch))}, aggregation="sum")
        return logs.add_losses(worst=float(batch[0]), aggregation="max"), state

    def test_step(state, batch):
        return ciclo.logs().add_metrics({"count": float(len(batch))}, aggregation="sum")

    data = [np.full((n,), float(n)) for n in (1, 3, 2)]
    _, history, _ = ciclo.train_loop(
        0,
        data,
        {ciclo.on_train_step: train_step, ciclo.on_test_step: test_step},
        test_dataset=lambda: [np.ones(4), np.ones(3)],
        epoch_logs=True,
    )
    assert float(history.collect("count_test")[0]) == 7.0  # summed, not averaged
    assert float(history.collect("seen_epoch")[0]) == 6.0
    assert float(history.collect("worst_epoch")[0]) == 3.0
