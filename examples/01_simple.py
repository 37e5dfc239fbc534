"""Digits with `ciclo.loop` and a Flax model, as in the README's complete example.

A jitted `train_step` every step, a checkpoint every `CHECKPOINT_EVERY` steps (and
one at the end), TensorBoard logs and a Keras-style progress bar; the learning
curve is written as a PNG; the model is evaluated on the test
set at the end, and the latest checkpoint is restored to show it holds that model.

    python examples/01_simple.py            # 1,000 steps
    CICLO_EXAMPLE_STEPS=30 python examples/01_simple.py
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

STEPS = int(os.environ.get("CICLO_EXAMPLE_STEPS", "1000"))
LOGDIR = os.environ.get("CICLO_EXAMPLE_DIR") or tempfile.mkdtemp()
BATCH = 32
CHECKPOINT_EVERY = max(STEPS // 4, 1)


def load():
    x, y = load_digits(return_X_y=True)  # 1,797 8x8 images, 10 classes
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
    logs.add_metric("accuracy", accuracy)
    logs.add_metric("loss", loss)
    return logs, state.apply_gradients(grads=grads)


def main() -> float:
    x_train, x_test, y_train, y_test = load()
    model = MLP()
    params = model.init(jax.random.key(0), x_train[:1])["params"]
    state = TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(1e-3))
    checkpoint = ciclo.checkpoint(os.path.join(LOGDIR, "01_simple"))

    state, history, elapsed = ciclo.loop(
        state,  # Pytree
        train_batches(x_train, y_train),  # Iterable[Batch]
        {  # Schedule: List[Callback]
            ciclo.every(1): [train_step],
            ciclo.every(steps=CHECKPOINT_EVERY): [checkpoint],
            **ciclo.tensorboard(os.path.join(LOGDIR, "01_simple_tb")),
            **ciclo.keras_bar(total=STEPS),  # last: shows what the others logged
        },
        stop=STEPS,
        on_end=[checkpoint],  # also save the final model
    )

    _, accuracy = loss_and_accuracy(state.params, state.apply_fn, (x_test, y_test))
    restored, restored_elapsed = checkpoint.restore(state)  # the latest checkpoint
    _, restored_accuracy = loss_and_accuracy(
        restored.params, restored.apply_fn, (x_test, y_test)
    )
    curve = os.path.join(LOGDIR, "01_simple_curve.png")
    history.plot("loss", "accuracy", path=curve)
    print(
        f"TensorBoard logs: tensorboard --logdir {os.path.join(LOGDIR, '01_simple_tb')}"
    )
    print(f"learning curve: {curve}")
    losses = history.collect("loss")
    print(
        f"train loss: {losses[0]:.4f} at the first step, {losses[-1]:.4f} at the last"
    )
    print(
        f"trained {elapsed.steps} steps in {elapsed.time:.1f}s: test accuracy "
        f"{float(accuracy):.4f}; latest checkpoint after {restored_elapsed.steps} "
        f"steps: test accuracy {float(restored_accuracy):.4f}"
    )
    assert restored_elapsed.steps == elapsed.steps
    assert float(restored_accuracy) == float(accuracy)
    return float(accuracy)


if __name__ == "__main__":
    accuracy = main()
    if STEPS >= 1_000 and accuracy < 0.95:
        raise SystemExit(f"test accuracy {accuracy:.4f} < 0.95")
