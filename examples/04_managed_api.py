"""Digits classification with the managed API: `ManagedState` carries a strategy,
`@managed.train_step` differentiates the logged losses and applies the gradients,
`@managed.step` evaluates; the same code runs under any strategy.

    python examples/04_managed_api.py                       # 1,000 steps, "jit"
    python examples/04_managed_api.py --strategy eager      # debug: no compilation
    CICLO_EXAMPLE_STEPS=30 python examples/04_managed_api.py
    XLA_FLAGS=--xla_force_host_platform_device_count=4 \\
        python examples/04_managed_api.py --strategy data_parallel
"""

import argparse
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import ciclo
from ciclo import managed

BATCH = 32
TEST_BATCH = 72  # 360 test images -> 5 equal batches; splits across 1, 2, 4, 8 devices


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(128)(x))
        return nn.Dense(10)(x)


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


def loss_and_accuracy(state, batch):
    images, labels = batch
    logits = state.apply_fn({"params": state.params}, images)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    return loss, jnp.mean(jnp.argmax(logits, -1) == labels)


@managed.train_step
def train_step(state, batch):
    loss, accuracy = loss_and_accuracy(state, batch)
    logs = ciclo.logs()
    logs.add_loss("loss", loss, add_metric=True)  # the loss ciclo differentiates
    logs.add_metric("accuracy", accuracy)
    return logs, state  # ciclo applies the gradients to this state


@managed.step
def test_step(state, batch):
    loss, accuracy = loss_and_accuracy(state, batch)
    logs = ciclo.logs()
    logs.add_metrics(loss=loss, accuracy=accuracy)
    return logs, state


def main(steps: int, strategy: str) -> float:
    x_train, x_test, y_train, y_test = load()
    model = MLP()
    state = managed.ManagedState.create(
        params=model.init(jax.random.key(0), x_train[:1])["params"],
        apply_fn=model.apply,
        tx=optax.adam(1e-3),
        strategy=strategy,
    )
    epoch = max(min(100, steps // 3), 1)
    state, history, elapsed = ciclo.train_loop(
        state,
        train_batches(x_train, y_train),
        {ciclo.on_train_step: [train_step], ciclo.on_test_step: [test_step]},
        test_dataset=lambda: test_batches(x_test, y_test),
        epoch_duration=epoch,
        inner_loop_kwargs={"aggregation": "mean"},
        callbacks=[ciclo.keras_bar(total=steps)],
        stop=steps,
    )
    steps_done, accuracy = history.collect("steps", "accuracy_test")
    for s, a in zip(steps_done, accuracy):
        print(f"step {s + 1:5d}  test accuracy {a:.4f}")
    # with_strategy("jit") brings a replicated/sharded state back to one device
    params = state.with_strategy("jit").params
    print(f"trained {elapsed.steps} steps under {strategy!r} in {elapsed.time:.1f}s")
    print(
        "first kernel row:", np.round(np.asarray(params["Dense_0"]["kernel"][0, :4]), 4)
    )
    return float(accuracy[-1])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--steps", type=int, default=int(os.environ.get("CICLO_EXAMPLE_STEPS", "1000"))
    )
    parser.add_argument(
        "--strategy",
        default="jit",
        help="one of eager, jit, jit_donate, data_parallel, data_parallel_donate, sharded",
    )
    args = parser.parse_args()
    accuracy = main(args.steps, args.strategy)
    if args.steps >= 1_000 and accuracy < 0.95:
        raise SystemExit(f"test accuracy {accuracy:.4f} < 0.95")
