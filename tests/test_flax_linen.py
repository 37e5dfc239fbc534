"""`ciclo.create_flax_state` with Flax Linen modules (and the data-parallel check).

The 4-device comparison runs `tests/_flax_worker.py` in a subprocess (XLA_FLAGS
must be set before jax is imported); it covers the NNX state too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ciclo

pytest.importorskip(
    "sklearn", reason="the digits data needs scikit-learn (ciclo[test])"
)
cm = pytest.importorskip("clu.metrics", reason="needs ciclo[flax] (clu)")
from _flax_common import (  # noqa: E402  (after the skips: it imports sklearn)
    assert_flax_states_equal,
    checkpoint_round_trip,
    digits,
    eval_batches,
    running_means,
    train_batches,
)

XENT = optax.softmax_cross_entropy_with_integer_labels


@pytest.fixture(scope="module")
def data():
    return digits()


@pytest.fixture(scope="module")
def trained(data):
    """A Linen MLP trained on digits with the one-liner (shared by two tests)."""
    xt, yt, xe, ye = data
    model = nn.Sequential([nn.Dense(64), nn.relu, nn.Dense(10)])
    state = ciclo.create_flax_state(
        model,
        xt[:1],
        optax.adam(1e-2),
        losses={"loss": XENT},
        metrics={"accuracy": cm.Accuracy},
    )
    return ciclo.train_loop(
        state,
        train_batches(xt, yt),
        test_dataset=lambda: eval_batches(xe, ye),
        epoch_duration=50,
        stop=150,
    )


def test_linen_mlp_reaches_95_percent_on_digits(trained):
    state, history, elapsed = trained
    steps, accuracy = history.collect("steps", "accuracy_test")
    assert steps == [49, 99, 149]
    assert accuracy[-1] >= 0.95
    assert {"losses.loss", "losses.loss_test", "stateful_metrics.accuracy"} <= set(
        history.keys()
    )
    assert int(state.step) == elapsed.steps == 150


def test_predict_loop_returns_outputs_for_every_sample(trained, data):
    state = trained[0]
    _, _, xe, ye = data
    inputs_only = [x for x, _ in eval_batches(xe, ye)]  # a bare array batch works
    _, history, _ = ciclo.predict_loop(state, inputs_only)
    preds = np.concatenate(history.collect("preds"))
    assert preds.shape == (len(xe), 10)
    assert np.mean(preds.argmax(-1) == ye) >= 0.95
    np.testing.assert_allclose(preds[:5], state.model(xe[:5]), rtol=1e-5, atol=1e-5)


class Affine(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(1)(x)


def test_stateful_metrics_reset_every_epoch():
    # batch i holds the value i: the accumulated mean since the last reset is known
    train = [
        (np.full((4, 2), i, np.float32), np.zeros((4, 1), np.float32)) for i in range(9)
    ]
    test = [
        (np.full((4, 2), v, np.float32), np.zeros((4, 1), np.float32))
        for v in (100, 200)
    ]
    state = ciclo.create_flax_state(
        Affine(),
        train[0][0],
        optax.sgd(0.0),
        losses={"mse": lambda preds, target: (preds - target) ** 2},
        metrics={"seen": cm.Average.from_fun(lambda inputs, **_: inputs[:, 0])},
    )
    _, history, _ = ciclo.train_loop(
        state, train, test_dataset=lambda: test, epoch_duration=3, stop=9
    )
    steps, seen = history.collect("steps", "seen")
    assert steps == list(range(9))
    np.testing.assert_allclose(seen, [0, 0.5, 1, 3, 3.5, 4, 6, 6.5, 7])
    steps, seen_test = history.collect("steps", "seen_test")
    assert steps == [2, 5, 8]
    np.testing.assert_allclose(seen_test, [150, 150, 150])


def test_batch_forms_sample_weight_and_dict_extras():
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    y = np.ones((4, 1), np.float32)
    w = np.array([1.0, 1.0, 0.0, 0.0], np.float32)
    state = ciclo.create_flax_state(
        Affine(),
        x,
        optax.sgd(0.0),
        losses={"mse": lambda preds, target: (preds - target) ** 2},
        metrics={
            "err": lambda preds, target: jnp.abs(preds - target)[:, 0],
            "offset": lambda preds, shift=0.0: jnp.mean(preds + shift),
            "with_loss": lambda mse: 2 * mse,
        },
    )
    preds = np.asarray(state.model(x))
    err = np.abs(preds - y)[:, 0]
    logs, _ = state.test_step((x, y, w))  # per-sample values are weighted
    np.testing.assert_allclose(logs.metrics.err, err[:2].mean(), rtol=1e-6)
    np.testing.assert_allclose(logs.losses.mse, (err[:2] ** 2).mean(), rtol=1e-6)
    np.testing.assert_allclose(logs.metrics.with_loss, 2 * logs.losses.mse, rtol=1e-6)
    logs, _ = state.test_step({"inputs": x, "labels": y, "shift": np.float32(10.0)})
    np.testing.assert_allclose(logs.metrics.offset, preds.mean() + 10, rtol=1e-6)
    np.testing.assert_allclose(logs.metrics.err, err.mean(), rtol=1e-6)


def test_test_averages_weight_each_batch_by_its_sample_weight(data):
    """Issue 31 7c: 11 real test samples, the last batch padded to 8 rows with
    sample_weight 0: `loss_test` and a per-sample `acc_test` are the means over
    the 11 real samples (each batch weighted by its total weight, not its rows)."""
    xt, yt, xe, ye = data
    x, y, pad = xe[:11], ye[:11], 5
    xp = np.concatenate([x, np.zeros((pad, x.shape[1]), x.dtype)])
    yp = np.concatenate([y, np.zeros(pad, y.dtype)])
    wp = np.concatenate([np.ones(11, np.float32), np.zeros(pad, np.float32)])
    batches = [(xp[i : i + 8], yp[i : i + 8], wp[i : i + 8]) for i in (0, 8)]
    model = nn.Sequential([nn.Dense(16), nn.relu, nn.Dense(10)])
    state = ciclo.create_flax_state(
        model,
        xt[:1],
        optax.sgd(0.0),  # the evaluated params are the initial ones
        losses={"loss": XENT},
        metrics={
            "acc": lambda preds, target: (preds.argmax(-1) == target).astype(
                jnp.float32
            ),
            "accuracy": cm.Accuracy,
        },
    )
    logits = np.asarray(state.model(x))
    reference_loss = float(np.mean(np.asarray(XENT(logits, y))))
    reference_acc = float(np.mean(logits.argmax(-1) == y))
    _, history, _ = ciclo.train_loop(
        state, [(xt[:8], yt[:8])], test_dataset=lambda: batches,
        epoch_duration=1, stop=1,
    )  # fmt: skip
    assert history.collect("loss_test") == [pytest.approx(reference_loss, rel=1e-5)]
    assert history.collect("acc_test") == [pytest.approx(reference_acc, rel=1e-6)]
    assert history.collect("accuracy_test") == [pytest.approx(reference_acc)]
    # a standalone test loop aggregated as train_loop's evaluation: the same
    inner = ciclo.inner_loop(
        "test",
        lambda s: ciclo.test_loop(s, batches),
        aggregation=ciclo.callbacks.TEST_AGGREGATION,
    )
    logs, _ = inner(state)
    assert float(logs.losses.loss_test) == pytest.approx(reference_loss, rel=1e-5)
    assert float(logs.metrics.acc_test) == pytest.approx(reference_acc, rel=1e-6)


def test_missing_keyword_is_an_error_naming_loss_and_argument():
    x = np.ones((2, 3), np.float32)
    state = ciclo.create_flax_state(
        Affine(), x, optax.sgd(0.1), losses={"weighted": lambda preds, weights: preds}
    )
    with pytest.raises(TypeError, match=r"loss 'weighted'.*'weights'.*preds"):
        state.train_step((x, np.ones((2, 1), np.float32)))


def test_bad_options_are_clear_errors():
    x = np.ones((2, 3), np.float32)
    with pytest.raises(TypeError, match="sample `inputs`"):
        ciclo.create_flax_state(Affine(), tx=optax.sgd(0.1))
    with pytest.raises(TypeError, match="flax.linen.Module or a flax.nnx.Module"):
        ciclo.create_flax_state(lambda x: x, x, optax.sgd(0.1))
    with pytest.raises(ValueError, match="reserved"):
        ciclo.create_flax_state(Affine(), x, optax.sgd(0.1), losses={"preds": abs})
    with pytest.raises(ValueError, match="mutable_train.*'cache'"):
        ciclo.create_flax_state(Affine(), x, optax.sgd(0.1), mutable_train=["cache"])
    with pytest.raises(TypeError, match="pass its class"):
        ciclo.create_flax_state(
            Affine(), x, optax.sgd(0.1), metrics={"acc": cm.Accuracy.empty()}
        )


class Sower(nn.Module):
    @nn.compact
    def __call__(self, x):
        y = nn.Dense(4)(x)
        self.sow("losses", "penalty", jnp.mean(y**2))
        self.sow("metrics", "mean_out", jnp.mean(y))
        return y


def test_sown_losses_and_metrics_are_logged_and_minimised():
    x = np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32)
    state = ciclo.create_flax_state(Sower(), x, optax.sgd(0.1))  # no configured loss
    _, history, _ = ciclo.train_loop(state, [(x,)] * 20, stop=20)
    penalty, mean_out = history.collect("penalty", "mean_out")
    assert len(penalty) == len(mean_out) == 20
    assert penalty[-1] < 0.5 * penalty[0]  # the sown loss is what was minimised


class TrainSower(nn.Module):
    """Sows a loss only in training (not while `init` runs, in evaluation mode)."""

    @nn.compact
    def __call__(self, x, train: bool = False):
        y = nn.Dense(1)(x)
        if train:
            self.sow("losses", "reg", 0.1 * jnp.mean(y**2))
        return y


@pytest.mark.parametrize("steps_per_call", [1, 3])
def test_loss_sown_only_in_training_gets_a_running_mean(steps_per_call):
    rng = np.random.default_rng(3)
    train = [
        (rng.normal(size=(4, 2)).astype(np.float32), np.zeros((4, 1), np.float32))
        for _ in range(7)
    ]
    test = train[:2]
    state = ciclo.create_flax_state(
        TrainSower(),
        train[0][0],
        optax.sgd(0.1),
        losses={"mse": lambda preds, target: (preds - target) ** 2},
        steps_per_call=steps_per_call,
    )
    _, history, _ = ciclo.train_loop(
        state, train, test_dataset=lambda: test, epoch_duration=3, stop=7
    )
    steps, reg, avg_reg = history.collect("steps", "reg", "avg_reg")
    assert steps == list(range(7))
    # reset at every epoch end (after steps 2 and 5), like the other stateful metrics
    np.testing.assert_allclose(avg_reg, running_means(reg, steps, 3), rtol=1e-5)
    steps, mse, avg_mse = history.collect("steps", "mse", "avg_mse")
    np.testing.assert_allclose(avg_mse, running_means(mse, steps, 3), rtol=1e-5)
    # the module sows nothing in evaluation: no reg / avg_reg in the test rows
    assert history.collect("mse_test")
    with pytest.raises(KeyError, match="'avg_reg_test' was never logged"):
        history.collect("avg_reg_test")


class BNDropout(nn.Module):
    @nn.compact
    def __call__(self, x, training: bool):
        x = nn.Dense(16)(x)
        x = nn.BatchNorm(use_running_average=not training)(x)
        x = nn.Dropout(0.5, deterministic=not training)(x)
        return nn.Dense(1)(x)


def test_dropout_key_is_fresh_each_step_and_batchnorm_modes():
    # BNDropout takes `training`: ciclo passes True in train_step, False in test_step
    x = np.random.default_rng(1).normal(size=(16, 3)).astype(np.float32)
    batch = (x, np.zeros((16, 1), np.float32))
    state = ciclo.create_flax_state(
        BNDropout(), x, optax.sgd(0.1), key=7, losses={"mse": lambda preds: preds**2}
    )
    first, after = state.train_step(batch)
    again, _ = state.train_step(batch)
    later, _ = state.replace(step=state.step + 1).train_step(batch)
    assert float(first.losses.mse) == float(again.losses.mse)  # reproducible
    assert float(first.losses.mse) != float(later.losses.mse)  # a fresh mask
    # training updates the running averages; evaluation uses and keeps them
    mean0 = state.batch_stats["BatchNorm_0"]["mean"]
    assert not np.allclose(after.batch_stats["BatchNorm_0"]["mean"], mean0)
    logs_a, evaluated = after.test_step(batch)
    logs_b, _ = after.replace(step=after.step + 5).test_step(batch)
    assert float(logs_a.losses.mse) == float(logs_b.losses.mse)  # no dropout
    jax.tree.map(
        np.testing.assert_array_equal, evaluated.batch_stats, after.batch_stats
    )


@pytest.mark.slow
def test_data_parallel_equals_jit_on_4_devices():
    """Linen CNN (BatchNorm + Dropout) and an NNX net under `jit` vs `data_parallel`.

    Without dropout and with BatchNorm reduced over the device axis the params
    match to float tolerance; with dropout (different masks per device by design)
    both reach a comparable train accuracy. The same BatchNorm module without
    `axis_name` under `sharded` matches `jit` too. See docs/flax.md, "Data parallelism
    and BatchNorm".
    """
    # 4 CPU devices; optimisation level 0 makes XLA compile ~3x faster (the run is
    # compile-bound) and does not change what is compared. Single-threaded Eigen
    # avoids rare all-reduce stalls when there are fewer cores than devices.
    flags = (
        "--xla_force_host_platform_device_count=4 --xla_backend_optimization_level=0"
        " --xla_cpu_multi_thread_eigen=false"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    # the worker imports the ciclo of this checkout, not an installed one
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu", PYTHONPATH=path)
    worker = os.path.join(os.path.dirname(__file__), "_flax_worker.py")
    done = subprocess.run(
        [sys.executable, worker], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["devices"] == 4
    for name in (
        "linen_params",
        "linen_batch_stats",
        "sharded_params",
        "sharded_batch_stats",
        "nnx_params",
        "nnx_batch_stats",
    ):
        assert out[f"{name}_diff"] < 1e-5, (name, out)
    jit, dp = (
        out["dropout_train_accuracy_jit"],
        out["dropout_train_accuracy_data_parallel"],
    )
    assert min(jit, dp) >= 0.85 and abs(jit - dp) <= 0.05, out
    # test averages over a padded last batch: the real samples' means everywhere
    for strategy in ("jit", "data_parallel", "sharded"):
        np.testing.assert_allclose(
            out[f"padded_{strategy}"], out["padded_reference"], rtol=1e-5,
            err_msg=strategy,
        )  # fmt: skip
    # training on a padded batch: the same loss and parameters as `jit`
    for strategy in ("data_parallel", "sharded"):
        assert out[f"padded_train_{strategy}_diff"] < 1e-6, (strategy, out)
        np.testing.assert_allclose(
            out[f"padded_train_loss_{strategy}"], out["padded_train_loss_jit"],
            rtol=1e-6, err_msg=strategy,
        )  # fmt: skip
        np.testing.assert_allclose(
            out[f"padded_train_avg_{strategy}"], out["padded_train_avg_jit"],
            rtol=1e-6, err_msg=strategy,
        )  # fmt: skip


def make_bn_dropout(key, strategy="jit"):
    x = np.random.default_rng(1).normal(size=(8, 3)).astype(np.float32)
    return ciclo.create_flax_state(
        BNDropout(),
        x,
        optax.adam(1e-2),
        key=key,
        losses={"mse": lambda preds: preds**2},
        strategy=strategy,
    )


def test_checkpoint_round_trip(tmp_path):
    x = np.random.default_rng(2).normal(size=(8, 3)).astype(np.float32)
    batches = [(x, np.zeros((8, 1), np.float32))] * 3
    trained, restored, elapsed = checkpoint_round_trip(
        make_bn_dropout, batches, tmp_path
    )
    assert elapsed.steps == 3 and int(restored.step) == 3
    assert_flax_states_equal(restored, trained)
    # the restored state trains on exactly like the saved one
    batch = batches[0]
    (a, _), (b, _) = trained.train_step(batch), restored.train_step(batch)
    assert float(a.losses.mse) == float(b.losses.mse)


def test_with_strategy_round_trip():
    state = make_bn_dropout(7)
    x = np.random.default_rng(2).normal(size=(8, 3)).astype(np.float32)
    batch = (x, np.zeros((8, 1), np.float32))
    eager = state.with_strategy("eager")
    assert eager.strategy == "eager" and isinstance(eager, ciclo.FlaxState)
    assert_flax_states_equal(eager.with_strategy("jit"), state)
    # the same step under both strategies: same loss, same new state
    logs_jit, after_jit = state.train_step(batch)
    logs_eager, after_eager = eager.train_step(batch)
    np.testing.assert_allclose(logs_eager.losses.mse, logs_jit.losses.mse, rtol=1e-5)
    # (not Dense_0's bias: its gradient is exactly zero before BatchNorm, and Adam
    # turns float noise in it into +-lr steps)
    eager_params = dict(after_eager.with_strategy("jit").params)
    jit_params = dict(after_jit.params)
    for params in (eager_params, jit_params):
        params["Dense_0"] = {"kernel": params["Dense_0"]["kernel"]}
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
        eager_params,
        jit_params,
    )
