"""Digits classification with `ciclo.create_flax_state` (Flax Linen): the one-liner.

Give a Linen model, an optimizer, losses and metrics; the state's `train_step`,
`test_step` and `reset_step` register themselves in `ciclo.train_loop`, which
trains, evaluates on the test set every epoch and shows a Keras-style bar.

    python examples/05_flax_state.py                  # 1,000 steps, >= 95% test accuracy
    python examples/05_flax_state.py --strategy data_parallel
    CICLO_EXAMPLE_STEPS=30 python examples/05_flax_state.py
"""

import argparse
import os

import flax.linen as nn
import numpy as np
import optax
from clu import metrics
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


def cross_entropy_loss(preds, target):  # called with the arguments it names
    return optax.softmax_cross_entropy_with_integer_labels(preds, target).mean()


Accuracy = metrics.Accuracy  # stateful: accumulated over the epoch
AverageLoss = metrics.Average.from_output("loss")  # the epoch mean of "loss"


def main(steps: int, strategy: str) -> float:
    x_train, x_test, y_train, y_test = load()
    steps_per_epoch = min(len(x_train) // BATCH, steps)  # short runs: one epoch
    model = nn.Sequential([nn.Dense(128), nn.relu, nn.Dense(10)])
    state = ciclo.create_flax_state(
        model,
        inputs=x_train[:1],
        tx=optax.adamw(1e-3),
        losses={"loss": cross_entropy_loss},
        metrics={"accuracy": Accuracy, "avg_loss": AverageLoss},
        strategy=strategy,
    )
    state, history, elapsed = ciclo.train_loop(
        state,  # methods are automatically registered
        train_batches(x_train, y_train),
        callbacks=[ciclo.keras_bar(total=steps)],
        test_dataset=lambda: test_batches(x_test, y_test),
        epoch_duration=steps_per_epoch,
        stop=steps,
    )
    epochs, accuracy = history.collect("steps", "accuracy_test")
    print(f"test accuracy by epoch: {np.round(accuracy, 4).tolist()}")
    # by hand: a step is `logs, state = state.test_step(batch)`
    logs, _ = state.reset_step().test_step((x_test[:TEST_BATCH], y_test[:TEST_BATCH]))
    print(f"first test batch: {float(logs.stateful_metrics.accuracy):.4f} accuracy")
    print(
        f"trained {elapsed.steps} steps ({len(epochs)} epochs) in {elapsed.time:.1f}s"
    )
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
