"""Digits classification with `ciclo.train_loop`: named schedules, a test loop each
epoch, a checkpoint that keeps the best model by test accuracy, and early stopping.

    python examples/02_train_loop.py            # 1,500 steps
    CICLO_EXAMPLE_STEPS=30 python examples/02_train_loop.py
"""

import os
import tempfile

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training.train_state import TrainState
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import ciclo

STEPS = int(os.environ.get("CICLO_EXAMPLE_STEPS", "1500"))
LOGDIR = os.environ.get("CICLO_EXAMPLE_DIR") or tempfile.mkdtemp()
BATCH = 32
TEST_BATCH = 90  # 360 test images -> 4 equal batches, so "mean" is exact
EPOCH = max(min(100, STEPS // 3), 1)  # steps per epoch


def load():
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    return train_test_split(x, y, test_size=360, random_state=0, stratify=y)


def train_batches(x, y, seed=0):
    """An endless stream of shuffled `(images, labels)` batches."""
    rng = np.random.default_rng(seed)
    while True:
        order = rng.permutation(len(x))
        for i in range(0, len(x) - BATCH + 1, BATCH):
            index = order[i : i + BATCH]
            yield x[index], y[index]


def test_batches(x, y):
    for i in range(0, len(x), TEST_BATCH):
        yield x[i : i + TEST_BATCH], y[i : i + TEST_BATCH]


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(128)(x))
        return nn.Dense(10)(x)


def loss_and_accuracy(params, apply_fn, batch):
    images, labels = batch
    logits = apply_fn({"params": params}, images)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    accuracy = jnp.mean(jnp.argmax(logits, -1) == labels)
    return loss, accuracy


@jax.jit
def train_step(state: TrainState, batch):
    def loss_fn(params):
        return loss_and_accuracy(params, state.apply_fn, batch)

    (loss, accuracy), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    logs = ciclo.logs()
    logs.add_loss("loss", loss, add_metric=True)
    logs.add_metric("accuracy", accuracy)
    return logs, state.apply_gradients(grads=grads)


@jax.jit
def test_step(state: TrainState, batch):
    loss, accuracy = loss_and_accuracy(state.params, state.apply_fn, batch)
    logs = ciclo.logs()
    logs.add_metrics(loss=loss, accuracy=accuracy)
    return logs


def main() -> float:
    x_train, x_test, y_train, y_test = load()
    model = MLP()
    params = model.init(jax.random.key(0), x_train[:1])["params"]
    state = TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(1e-3))

    checkpoint = ciclo.checkpoint(
        os.path.join(LOGDIR, "02_train_loop"), monitor="accuracy_test", mode="max"
    )
    state, history, elapsed = ciclo.train_loop(
        state,
        train_batches(x_train, y_train),
        {
            ciclo.on_train_step: [train_step],  # named schedules
            ciclo.on_test_step: [test_step],
        },
        test_dataset=lambda: test_batches(x_test, y_test),  # fresh each epoch
        epoch_duration=EPOCH,
        inner_loop_kwargs={"aggregation": "mean"},  # average the 4 test batches
        callbacks=[
            ciclo.keras_bar(total=STEPS),  # on_train_batch_end
            checkpoint,  # on_epoch_end, before early stopping so its epoch is saved
            ciclo.early_stopping("loss_test", patience=5 * EPOCH),  # on_epoch_end
        ],
        stop=STEPS,
    )

    steps, accuracy = history.collect("steps", "accuracy_test")
    for s, a in zip(steps, accuracy):
        print(f"step {s + 1:5d}  test accuracy {a:.4f}")
    best, best_elapsed = checkpoint.restore(state, best=True)
    _, best_accuracy = loss_and_accuracy(best.params, best.apply_fn, (x_test, y_test))
    print(
        f"trained {elapsed.steps} steps in {elapsed.time:.1f}s; best checkpoint at "
        f"step {best_elapsed.steps}: test accuracy {float(best_accuracy):.4f}"
    )
    return float(best_accuracy)


if __name__ == "__main__":
    accuracy = main()
    if STEPS >= 1_000 and accuracy < 0.95:
        raise SystemExit(f"test accuracy {accuracy:.4f} < 0.95")
