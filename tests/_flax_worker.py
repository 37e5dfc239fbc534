"""Subprocess worker for test_flax_linen.py: `jit` vs `data_parallel` / `sharded`
on 4 CPU devices.

Run with XLA_FLAGS=--xla_force_host_platform_device_count=4. Prints one JSON line.

Decision (see docs/flax.md, "Data parallelism and BatchNorm"): with dropout, each
device draws its own masks, so a data-parallel run cannot match the single-device
run bit for bit. "Equal results" is therefore checked three ways:
- without dropout (rate 0) and with BatchNorm reducing its batch statistics over the
  device axis (`axis_name="device"` under data_parallel), 8 SGD steps give the
  same params and batch_stats as `jit` (max abs difference reported; SGD because
  Adam turns float noise in the exactly-zero gradient of a bias before BatchNorm
  into +-lr steps);
- the same BatchNorm module without `axis_name` under `sharded` (one logical
  computation over the global batch) gives the `jit` numbers too;
- with dropout on, both runs reach the same train accuracy within a few points.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

import flax.linen as nn
import jax
import numpy as np
import optax
from _flax_common import digits, train_batches
from flax import nnx

import ciclo

LOSS = {"loss": optax.softmax_cross_entropy_with_integer_labels}


class CNN(nn.Module):
    dropout: float
    axis_name: str | None

    @nn.compact
    def __call__(self, x, training: bool):
        x = x.reshape((x.shape[0], 8, 8, 1))
        x = nn.Conv(16, (3, 3))(x)
        x = nn.BatchNorm(use_running_average=not training, axis_name=self.axis_name)(x)
        x = nn.relu(x)
        x = nn.Dropout(self.dropout, deterministic=not training)(x)
        x = nn.max_pool(x, (2, 2), (2, 2)).reshape((x.shape[0], -1))
        return nn.Dense(10)(x)


class NNXNet(nnx.Module):
    def __init__(self, axis_name, rngs):
        self.l1 = nnx.Linear(64, 32, rngs=rngs)
        self.bn = nnx.BatchNorm(32, axis_name=axis_name, rngs=rngs)
        self.l2 = nnx.Linear(32, 10, rngs=rngs)

    def __call__(self, x):
        return self.l2(nnx.relu(self.bn(self.l1(x))))


def max_diff(a, b) -> float:
    return max(
        float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
    )


def run(state, data, steps):
    for batch in itertools.islice(data, steps):
        _, state = state.train_step(batch)
    return state.with_strategy("jit")


def main() -> None:
    t = time.time()
    xt, yt, xe, ye = digits()
    out = {"devices": jax.local_device_count()}
    # 1. Linen CNN, BatchNorm over devices, no dropout: same numbers as jit.
    finals = {}
    for strategy in ("jit", "data_parallel"):
        axis = "device" if strategy == "data_parallel" else None
        state = ciclo.create_flax_state(
            CNN(0.0, axis), xt[:1], optax.sgd(0.1), losses=LOSS, strategy=strategy
        )
        finals[strategy] = run(state, train_batches(xt, yt), 8)
    out["linen_params_diff"] = max_diff(
        finals["jit"].params, finals["data_parallel"].params
    )
    out["linen_batch_stats_diff"] = max_diff(
        finals["jit"].batch_stats, finals["data_parallel"].batch_stats
    )
    # 1b. The jit module itself (BatchNorm without axis_name) under sharded.
    state = ciclo.create_flax_state(
        CNN(0.0, None), xt[:1], optax.sgd(0.1), losses=LOSS, strategy="sharded"
    )
    sharded = run(state, train_batches(xt, yt), 8)
    out["sharded_params_diff"] = max_diff(finals["jit"].params, sharded.params)
    out["sharded_batch_stats_diff"] = max_diff(
        finals["jit"].batch_stats, sharded.batch_stats
    )
    # 2. The same CNN with dropout 0.2: each device draws its own masks, so only
    # comparable training curves are expected (mean train accuracy, last 25 steps).
    for strategy in ("jit", "data_parallel"):
        axis = "device" if strategy == "data_parallel" else None
        state = ciclo.create_flax_state(
            CNN(0.2, axis),
            xt[:1],
            optax.adam(1e-2),
            losses=LOSS,
            metrics={"accuracy": lambda preds, target: preds.argmax(-1) == target},
            strategy=strategy,
        )
        _, history, _ = ciclo.train_loop(state, train_batches(xt, yt), stop=100)
        accuracy = np.mean(history.collect("accuracy")[-25:])
        out[f"dropout_train_accuracy_{strategy}"] = float(accuracy)
    # 3. NNX with BatchNorm over devices: same numbers as jit.
    finals = {}
    for strategy in ("jit", "data_parallel"):
        axis = "device" if strategy == "data_parallel" else None
        model = NNXNet(axis, nnx.Rngs(0))
        state = ciclo.create_flax_state(
            model, tx=optax.sgd(0.1), losses=LOSS, strategy=strategy
        )
        finals[strategy] = run(state, train_batches(xt, yt), 8)
    out["nnx_params_diff"] = max_diff(
        finals["jit"].params, finals["data_parallel"].params
    )
    out["nnx_batch_stats_diff"] = max_diff(
        finals["jit"].batch_stats, finals["data_parallel"].batch_stats
    )
    # 4. Test averages over a padded last batch (sample_weight 0 on the padding,
    # as docs/managed.md suggests for data_parallel): the means over the real
    # samples under every strategy, against a numpy reference (issue 31 7c).
    x, y, pad = xe[:11], ye[:11], 5
    xp = np.concatenate([x, np.zeros((pad, x.shape[1]), x.dtype)])
    yp = np.concatenate([y, np.zeros(pad, y.dtype)])
    wp = np.concatenate([np.ones(11, np.float32), np.zeros(pad, np.float32)])
    padded = [(xp[i : i + 8], yp[i : i + 8], wp[i : i + 8]) for i in (0, 8)]
    model = nn.Sequential([nn.Dense(16), nn.relu, nn.Dense(10)])
    for strategy in ("jit", "data_parallel", "sharded"):
        state = ciclo.create_flax_state(
            model,
            xt[:1],
            optax.sgd(0.0),
            losses=LOSS,
            metrics={"acc": lambda preds, target: preds.argmax(-1) == target},
            strategy=strategy,
        )
        if strategy == "jit":
            logits = np.asarray(state.model(x))
            xent = LOSS["loss"](logits, y)
            out["padded_reference"] = [
                float(np.mean(xent)),
                float(np.mean(logits.argmax(-1) == y)),
            ]
        _, history, _ = ciclo.train_loop(
            state,
            [(xt[:8], yt[:8])],
            test_dataset=lambda: padded,
            epoch_duration=1,
            stop=1,
        )
        out[f"padded_{strategy}"] = [
            float(history.collect("loss_test")[0]),
            float(history.collect("acc_test")[0]),
        ]
    # 5. Training on a padded batch (sample_weight 0 on the padding, unevenly
    # spread over the devices: 3 real rows of 16): each device's gradient and
    # loss count by its slice's weight, so every strategy trains as `jit`.
    xw, yw = xe[:16], ye[:16]
    ww = np.concatenate([np.ones(3, np.float32), np.zeros(13, np.float32)])
    trained = {}
    for strategy in ("jit", "data_parallel", "sharded"):
        state = ciclo.create_flax_state(
            model, xt[:1], optax.sgd(0.1), losses=LOSS, strategy=strategy, key=0
        )
        logs, state = state.train_step((xw, yw, ww))
        trained[strategy] = state.with_strategy("jit").params
        out[f"padded_train_loss_{strategy}"] = float(logs.losses.loss)
        # the running mean `avg_loss` counts the batch once, combined as the loss
        out[f"padded_train_avg_{strategy}"] = float(logs.stateful_metrics.avg_loss)
    for strategy in ("data_parallel", "sharded"):
        out[f"padded_train_{strategy}_diff"] = max_diff(
            trained["jit"], trained[strategy]
        )
    out["seconds"] = time.time() - t
    print(json.dumps(out))


if __name__ == "__main__":
    main()
