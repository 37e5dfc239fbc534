"""API.md §8 — Flax state factories (Linen and NNX)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import ciclo

clu_metrics = pytest.importorskip("clu.metrics")

N_FEATURES, N_CLASSES, BS = 4, 3, 8
_rng = np.random.default_rng(0)
_W = _rng.normal(size=(N_FEATURES, N_CLASSES)).astype(np.float32)


def _batches(n, seed):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.normal(size=(BS, N_FEATURES)).astype(np.float32)
        out.append((x, (x @ _W).argmax(-1).astype(np.int32)))
    return out


TRAIN = _batches(4, 1)
TEST = _batches(2, 2)
CE = optax.softmax_cross_entropy_with_integer_labels


def _mlp():
    return nn.Sequential([nn.Dense(8), nn.relu, nn.Dense(N_CLASSES)])


class NNXMLP(nnx.Module):
    def __init__(self, rngs):
        self.l1 = nnx.Linear(N_FEATURES, 8, rngs=rngs)
        self.l2 = nnx.Linear(8, N_CLASSES, rngs=rngs)

    def __call__(self, x):
        return self.l2(jax.nn.relu(self.l1(x)))


def _linen_state(**kwargs):
    kwargs.setdefault("losses", {"loss": CE})
    kwargs.setdefault(
        "metrics",
        {
            "accuracy": clu_metrics.Accuracy,
            "avg": clu_metrics.Average.from_output("loss"),
        },
    )
    return ciclo.create_flax_state(
        _mlp(), inputs=TRAIN[0][0][:1], tx=optax.adam(1e-2), **kwargs
    )


@pytest.fixture(scope="module")
def linen_state():
    """One Linen state shared by the tests (states are immutable), so steps compile once."""
    return _linen_state()


def _nnx_state(**kwargs):
    kwargs.setdefault("losses", {"loss": CE})
    kwargs.setdefault("metrics", {"accuracy": clu_metrics.Accuracy})
    return ciclo.create_flax_state(NNXMLP(nnx.Rngs(0)), tx=optax.adam(1e-2), **kwargs)


def _reset(state):
    out = state.reset_step()
    return out[1] if isinstance(out, tuple) else out


@pytest.mark.parametrize("kind", ["linen", "nnx"])
def test_train_loop_one_liner_with_test_dataset(kind, linen_state):
    state = linen_state if kind == "linen" else _nnx_state()
    assert isinstance(state, ciclo.FlaxState)
    state, history, elapsed = ciclo.train_loop(
        state, TRAIN, test_dataset=lambda: TEST, epoch_duration=2, stop=4
    )
    assert elapsed.steps == 4
    assert int(state.step) == 4
    steps, loss_test, acc_test = history.collect("steps", "loss_test", "accuracy_test")
    assert len(steps) == 2
    assert all(0.0 <= float(a) <= 1.0 for a in acc_test)
    assert all(np.isfinite(float(v)) for v in loss_test)
    train_loss = history.collect("loss")
    assert len(train_loss) == 4


def test_train_step_by_hand_learns_and_test_step_does_not_change_params(linen_state):
    state = linen_state
    losses = []
    for _ in range(15):
        logs, state = state.train_step(TRAIN[0])
        losses.append(float(logs.losses.loss))
    assert losses[-1] < losses[0]
    params_before = jax.tree_util.tree_leaves(state.params)
    logs, state2 = state.test_step(TEST[0])
    for a, b in zip(params_before, jax.tree_util.tree_leaves(state2.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert "loss" in logs["losses"] and "accuracy" in logs["stateful_metrics"]


def test_reset_step_resets_clu_stateful_metrics(linen_state):
    state = linen_state
    l1, state = state.train_step(TRAIN[0])
    l2, state = state.train_step(TRAIN[1])
    expected = (float(l1.losses.loss) + float(l2.losses.loss)) / 2
    assert float(l2["stateful_metrics"]["avg"]) == pytest.approx(expected, rel=1e-5)
    state = _reset(state)
    l3, state = state.train_step(TRAIN[2])
    assert float(l3["stateful_metrics"]["avg"]) == pytest.approx(
        float(l3.losses.loss), rel=1e-5
    )


def test_avg_loss_entries_are_logged_for_each_loss(linen_state):
    state = linen_state  # losses={"loss": ...}; no avg_loss metric given by the user
    l1, state = state.train_step(TRAIN[0])
    l2, state = state.train_step(TRAIN[1])
    expected = (float(l1.losses.loss) + float(l2.losses.loss)) / 2
    assert float(l2.entry_value("avg_loss")) == pytest.approx(expected, rel=1e-5)
    state = _reset(state)
    _, history, _ = ciclo.train_loop(
        state, TRAIN, test_dataset=lambda: TEST, epoch_duration=2, stop=4
    )
    assert len(history.collect("avg_loss")) == 4
    assert len(history.collect("avg_loss_test")) == 2


def test_callables_receive_keyword_arguments_by_name_and_batch_forms():
    def weight_decay(params):
        return 1e-3 * sum(jnp.sum(p**2) for p in jax.tree_util.tree_leaves(params))

    state = _linen_state(
        losses={"ce": CE, "wd": weight_decay},
        metrics={
            "twice_ce": lambda ce: 2.0 * ce,
            "acc": lambda preds, target: jnp.mean(preds.argmax(-1) == target),
            "n_inputs": lambda inputs: jnp.asarray(inputs.shape[0], jnp.float32),
            "w_sum": lambda sample_weight: jnp.sum(sample_weight),
        },
    )
    expected_wd = float(weight_decay(state.params))
    x, y = TRAIN[0]
    w = np.zeros(BS, np.float32)
    w[:3] = 1.0
    logs, _ = state.train_step((x, y, w))  # (inputs, labels, sample_weight)
    assert float(logs.losses.wd) == pytest.approx(expected_wd, rel=1e-5)
    assert float(logs.metrics.twice_ce) == pytest.approx(
        2 * float(logs.losses.ce), rel=1e-5
    )
    assert 0.0 <= float(logs.metrics.acc) <= 1.0
    assert float(logs.metrics.n_inputs) == BS
    assert float(logs.metrics.w_sum) == 3.0

    logs_d, _ = state.train_step({"inputs": x, "target": y, "sample_weight": w})  # dict
    assert float(logs_d.losses.ce) == pytest.approx(float(logs.losses.ce), rel=1e-6)
    assert float(logs_d.metrics.w_sum) == 3.0


def test_two_tuple_batches(linen_state):
    x, y = TRAIN[0]
    logs, _ = linen_state.train_step((x, y))
    expected = float(jnp.mean(CE(_mlp().apply({"params": linen_state.params}, x), y)))
    assert float(logs.losses.loss) == pytest.approx(expected, rel=1e-5)


class _BNDropSow(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = False):
        x = nn.Dense(8)(x)
        x = nn.BatchNorm(use_running_average=not train)(x)
        x = nn.Dropout(0.5, deterministic=not train)(x)
        self.sow("losses", "aux", 0.01 * jnp.mean(x**2))
        return nn.Dense(N_CLASSES)(x)


def test_batchnorm_dropout_and_sown_losses():
    state = ciclo.create_flax_state(
        _BNDropSow(), inputs=TRAIN[0][0][:1], tx=optax.sgd(0.01), losses={"loss": CE}
    )
    bs0 = [np.asarray(v) for v in jax.tree_util.tree_leaves(state.batch_stats)]
    assert bs0, "the model's BatchNorm statistics live in the state"
    logs1, s1 = state.train_step(TRAIN[0])
    assert "aux" in logs1["losses"]
    bs1 = [np.asarray(v) for v in jax.tree_util.tree_leaves(s1.batch_stats)]
    assert any(not np.allclose(a, b) for a, b in zip(bs0, bs1)), (
        "train step updates batch stats"
    )

    # evaluation: deterministic and does not update the running averages
    e1, s2 = s1.test_step(TEST[0])
    e2, _ = s2.test_step(TEST[0])
    assert float(e1.losses.loss) == float(e2.losses.loss)
    for a, b in zip(bs1, jax.tree_util.tree_leaves(s2.batch_stats)):
        np.testing.assert_array_equal(a, np.asarray(b))

    # dropout: a fresh key per step, so the same batch and params give different losses
    _, sa = s1.train_step(TRAIN[1])
    la, _ = sa.train_step(TRAIN[1])
    lb, _ = sa.replace(step=sa.step + 1).train_step(TRAIN[1])
    assert float(la.losses.loss) != float(lb.losses.loss)
