"""Digits classification with a Flax NNX model and `ciclo.create_flax_state`.

The NNX module is built as usual; `create_flax_state` splits it into a functional
state (graphdef + variables), so every strategy works with it. In `train_step` the
model runs in `train()` mode (BatchNorm uses batch statistics, Dropout gets a fresh
key every step); in `test_step` / `predict_step` it runs in `eval()` mode. The
module also sows an auxiliary loss (a tiny activity penalty): it is logged and added
to the loss whose gradient is taken, but with its weight of 1e-4 the
classification loss dominates, so the penalty is not driven down (the activations
grow while the model learns; the printout shows its first and last values).

    python examples/07_nnx.py                  # 1,000 steps, >= 95% test accuracy
    python examples/07_nnx.py --strategy eager
    CICLO_EXAMPLE_STEPS=30 python examples/07_nnx.py
"""

import argparse
import os

import jax.numpy as jnp
import numpy as np
import optax
from clu import metrics
from flax import nnx
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import ciclo

BATCH = 32
TEST_BATCH = 60  # 360 test samples; divisible by 4 devices for data_parallel


def load():
    x, y = load_digits(return_X_y=True)  # 1,797 8x8 images, 10 classes
    x = (x / 16.0).astype(np.float32)
    return train_test_split(x, y.astype(np.int32), test_size=360, random_state=0)


def train_batches(x, y, seed=0):
    """An endless stream of shuffled `(images, labels)` batches."""
    rng = np.random.default_rng(seed)
    while True:
        order = rng.permutation(len(x))
        for i in range(0, len(x) - BATCH + 1, BATCH):
            index = order[i : i + BATCH]
            yield x[index], y[index]


def test_batches(x, y):
    return [
        (x[i : i + TEST_BATCH], y[i : i + TEST_BATCH])
        for i in range(0, len(x), TEST_BATCH)
    ]


class MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(64, 128, rngs=rngs)
        self.norm = nnx.BatchNorm(128, rngs=rngs)
        self.dropout = nnx.Dropout(0.1, rngs=rngs)
        self.out = nnx.Linear(128, 10, rngs=rngs)

    def __call__(self, x):
        h = self.dropout(nnx.relu(self.norm(self.hidden(x))))
        self.sow("losses", "activity", 1e-4 * jnp.mean(h**2))  # summed into the loss
        return self.out(h)


def main(steps: int, strategy: str) -> float:
    x_train, x_test, y_train, y_test = load()
    steps_per_epoch = min(len(x_train) // BATCH, steps)  # short runs: one epoch
    state = ciclo.create_flax_state(
        MLP(nnx.Rngs(0)),
        tx=optax.adamw(1e-3),
        losses={"loss": optax.softmax_cross_entropy_with_integer_labels},
        metrics={"accuracy": metrics.Accuracy},
        strategy=strategy,
    )
    state, history, elapsed = ciclo.train_loop(
        state,
        train_batches(x_train, y_train),
        callbacks=[ciclo.keras_bar(total=steps)],
        test_dataset=lambda: test_batches(x_test, y_test),
        epoch_duration=steps_per_epoch,
        stop=steps,
    )
    _, accuracy = history.collect("steps", "accuracy_test")
    print(f"test accuracy by epoch: {np.round(accuracy, 4).tolist()}")
    activity = history.collect("activity")
    print(f"auxiliary loss: {activity[0]:.2e} -> {activity[-1]:.2e}")
    # predictions for every test sample, with the loop or by hand
    _, predictions, _ = ciclo.predict_loop(state, test_batches(x_test, y_test))
    preds = np.concatenate(predictions.collect("preds"))
    logs, _ = state.predict_step(x_test[:TEST_BATCH])  # a batch may be inputs only
    same = np.allclose(preds[:TEST_BATCH], logs.outputs.preds, atol=1e-5)
    print(f"{len(preds)} predictions; by hand the same: {same}")
    print(f"trained {elapsed.steps} steps under {strategy!r} in {elapsed.time:.1f}s")
    return float(accuracy[-1])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--steps", type=int, default=int(os.environ.get("CICLO_EXAMPLE_STEPS", "1000"))
    )
    parser.add_argument(
        "--strategy", default="jit", help="e.g. eager, jit, data_parallel"
    )
    args = parser.parse_args()
    accuracy = main(args.steps, args.strategy)
    if args.steps >= 1_000 and accuracy < 0.95:
        raise SystemExit(f"test accuracy {accuracy:.4f} < 0.95")
