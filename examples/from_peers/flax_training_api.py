"""The Flax training-API proposal's headline workflow in ciclo: a training loop
that *yields* a checkpoint every `n_steps_per_checkpoint` steps, evaluated by the
caller (`for checkpoint in train_loop: summary = eval_loop(checkpoint)`), with a
regular checkpoint and a best-metric checkpoint extension saving the model
variables (not the optimizer state).

    python examples/from_peers/flax_training_api.py   # 600 steps, > 0.9 accuracy
    CICLO_EXAMPLE_STEPS=30 python examples/from_peers/flax_training_api.py

Flax proposal -> ciclo:
    TrainLoop(init, TrainTask(apply, optimizer, loss, data), n_steps)
                                -> ciclo.create_flax_state(...) + ciclo.iterate(stop=...)
    n_steps_per_checkpoint      -> epoch_duration
    for checkpoint in train_loop -> for state, logs, elapsed in ciclo.iterate(...)
    Checkpoint.n_completed_steps -> elapsed.steps
    eval_loop(checkpoint)        -> ciclo.test_loop(state, eval_data)
    Summary metrics (by label)   -> the test loop's history
    regular checkpoint extension -> ciclo.checkpoint(directory, items=["params"])
    best metric extension        -> ciclo.checkpoint(directory, monitor=..., mode="max")
"""

import os
import tempfile

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import optax
from sklearn.datasets import load_digits

import ciclo

STEPS = int(os.environ.get("CICLO_EXAMPLE_STEPS", "600"))
DIR = os.environ.get("CICLO_EXAMPLE_DIR") or tempfile.mkdtemp()
BATCH = 32

x, y = load_digits(return_X_y=True)
x, y = (x / 16.0).astype(np.float32), y.astype(np.int32)
x_train, y_train, x_eval, y_eval = x[:1400], y[:1400], x[1400:], y[1400:]


def train_datastream():  # the proposal's `data=train_datastream`
    rng = np.random.default_rng(0)
    while True:
        order = rng.permutation(len(x_train))
        for i in range(0, len(order) - BATCH + 1, BATCH):
            yield x_train[order[i : i + BATCH]], y_train[order[i : i + BATCH]]


def categorical_cross_entropy(preds, target):  # the proposal's `loss=`
    return optax.softmax_cross_entropy_with_integer_labels(preds, target).mean()


def accuracy(preds, target):
    return jnp.mean(jnp.argmax(preds, -1) == target)


model = nn.Sequential([nn.Dense(128), nn.relu, nn.Dense(10)])
initial = ciclo.create_flax_state(  # init=model.init, apply=model.apply
    model,
    inputs=x_train[:1],
    tx=optax.adam(3e-3),  # optimizer=
    losses={"loss": categorical_cross_entropy},
    metrics={"accuracy": accuracy},
)
regular = ciclo.checkpoint(f"{DIR}/regular", items=["params"], async_save=False)
best = ciclo.checkpoint(
    f"{DIR}/best", items=["params"], monitor="accuracy", mode="max", async_save=False
)

for state, logs, elapsed in ciclo.iterate(  # for checkpoint in train_loop:
    initial, train_datastream(), epoch_duration=max(STEPS // 4, 1), stop=STEPS
):
    _, summary, _ = ciclo.test_loop(state, [(x_eval, y_eval)])  # eval_loop(...)
    eval_logs = summary[-1]  # the eval batch's logs (one batch: the whole set)
    print(f"step {elapsed.steps}: loss {float(logs.losses.loss):.3f}, "
          f"eval accuracy {float(eval_logs.metrics.accuracy):.3f}")  # fmt: skip
    regular(elapsed, state, consumed=True)  # elapsed counts the trained batches
    best(elapsed, state, eval_logs, consumed=True)

restored, restored_elapsed = best.restore(state, best=True)
final = float(summary.collect("accuracy")[-1])
print(f"best checkpoint: step {restored_elapsed.steps}")
assert regular.latest_step() == STEPS
if STEPS >= 600:
    assert final > 0.9, final
