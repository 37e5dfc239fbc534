"""Manual iteration: `ciclo.elapse` drives a plain Python for loop; schedules,
`checkpoint`, `keras_bar` and `history` are called by hand (no `ciclo.loop`).

    python examples/03_manual_iteration.py            # 1,500 steps
    CICLO_EXAMPLE_STEPS=30 python examples/03_manual_iteration.py
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
EVAL_EVERY = max(min(100, STEPS // 3), 1)


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


@jax.jit
def train_step(state: TrainState, batch):
    images, labels = batch

    def loss_fn(params):
        logits = state.apply_fn({"params": params}, images)
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        return loss, jnp.mean(jnp.argmax(logits, -1) == labels)

    (loss, accuracy), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    logs = ciclo.logs()
    logs.add_loss("loss", loss, add_metric=True)
    logs.add_metric("accuracy", accuracy)
    return logs, state.apply_gradients(grads=grads)


@jax.jit
def test_accuracy(state: TrainState, images, labels):
    logits = state.apply_fn({"params": state.params}, images)
    return jnp.mean(jnp.argmax(logits, -1) == labels)


def main() -> float:
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=360, random_state=0, stratify=y
    )
    model = MLP()
    params = model.init(jax.random.key(0), x_train[:1])["params"]
    state = TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(1e-3))

    call_checkpoint = ciclo.every(steps=EVAL_EVERY)  # Schedule
    checkpoint = ciclo.checkpoint(os.path.join(LOGDIR, "03_manual"))  # Callback
    keras_bar = ciclo.keras_bar(total=STEPS)  # Callback
    history = ciclo.history()  # History
    # (Elapsed, Batch)
    for elapsed, batch in ciclo.elapse(train_batches(x_train, y_train), stop=STEPS):
        logs = ciclo.logs()  # Logs
        # update logs and state
        logs.updates, state = train_step(state, batch)
        # periodically evaluate and checkpoint the state
        if call_checkpoint(elapsed):
            logs.add_metric("accuracy_test", test_accuracy(state, x_test, y_test))
            checkpoint(elapsed, state)  # serialize state (in the background)

        keras_bar(elapsed, logs)  # update progress bar
        history.commit(elapsed, logs)  # commit logs to history
    checkpoint.close()  # wait for the background saves
    keras_bar.close()

    steps, accuracy = history.collect("steps", "accuracy_test")
    for s, a in zip(steps, accuracy):
        print(f"step {s + 1:5d}  test accuracy {a:.4f}")
    restored, restored_elapsed = ciclo.restore(checkpoint.directory, state)
    final = float(test_accuracy(state, x_test, y_test))
    print(
        f"final test accuracy {final:.4f}; latest checkpoint holds "
        f"{restored_elapsed.steps} steps: test accuracy "
        f"{float(test_accuracy(restored, x_test, y_test)):.4f}"
    )
    return final


if __name__ == "__main__":
    accuracy = main()
    if STEPS >= 1_000 and accuracy < 0.95:
        raise SystemExit(f"test accuracy {accuracy:.4f} < 0.95")
