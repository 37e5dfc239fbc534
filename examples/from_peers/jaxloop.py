"""Jaxloop's headline workflow in ciclo: an outer loop that trains for
`train_total_steps`, in inner train loops of `train_loop_steps` steps whose end
actions log a summary and checkpoint, and runs the eval loops (`EvalSpec`s, each
with its own dataset and step count) after every inner train loop.

    python examples/from_peers/jaxloop.py             # 600 steps, > 0.9 accuracy
    CICLO_EXAMPLE_STEPS=30 python examples/from_peers/jaxloop.py

Jaxloop -> ciclo:
    Step (train=True / False)           -> managed.train_step / managed.step
    TrainLoop(train_step, end_actions)  -> on_train_step + on_epoch_end callbacks
    EvalLoop / EvalSpec(dataset, steps) -> test_dataset={name: factory},
                                           test_duration={name: steps}
    OuterLoop(train_total_steps,        -> ciclo.train_loop(stop=...,
              train_loop_steps)                             epoch_duration=...)
    summary_action / ckpt_action        -> history + ciclo.checkpoint(...)
"""

import os
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import optax
from sklearn.datasets import load_digits

import ciclo
from ciclo import managed

STEPS = int(os.environ.get("CICLO_EXAMPLE_STEPS", "600"))
DIR = os.environ.get("CICLO_EXAMPLE_DIR") or tempfile.mkdtemp()
BATCH = 32

x, y = load_digits(return_X_y=True)
x, y = (x / 16.0).astype(np.float32), y.astype(np.int32)
x_train, y_train, x_eval, y_eval = x[:1400], y[:1400], x[1400:], y[1400:]


def train_dataset():  # Jaxloop: train_ds.as_numpy_iterator(), an endless stream
    rng = np.random.default_rng(0)
    while True:
        order = rng.permutation(len(x_train))
        for i in range(0, len(order) - BATCH + 1, BATCH):
            yield x_train[order[i : i + BATCH]], y_train[order[i : i + BATCH]]


def eval_dataset(xs, ys):  # Jaxloop: EvalSpec(dataset=...)
    return lambda: ((xs[i : i + 99], ys[i : i + 99]) for i in range(0, len(xs), 99))


def apply(params, images):  # Jaxloop: the model
    hidden = jax.nn.relu(images @ params["w1"] + params["b1"])
    return hidden @ params["w2"] + params["b2"]


def init(key):  # Jaxloop: train_step.initialize_model(shape)
    k1, k2 = jax.random.split(key)
    return {
        "w1": jax.random.normal(k1, (64, 128)) * 0.1,
        "b1": jnp.zeros(128),
        "w2": jax.random.normal(k2, (128, 10)) * 0.1,
        "b2": jnp.zeros(10),
    }


def _logits_and_logs(state, batch):
    images, labels = batch
    logits = apply(state.params, images)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    accuracy = jnp.mean(jnp.argmax(logits, -1) == labels)
    return ciclo.logs().add_loss("loss", loss).add_metric("accuracy", accuracy)


train_step = managed.train_step(_logits_and_logs)  # Jaxloop: Step(train=True)
eval_step = managed.step(_logits_and_logs)  # Jaxloop: Step(train=False)

state = managed.ManagedState.create(params=init(jax.random.key(0)), tx=optax.adam(3e-3))
ckpt_action = ciclo.checkpoint(f"{DIR}/jaxloop_ckpt")  # Jaxloop: ckpt_action
state, history, elapsed = ciclo.train_loop(  # Jaxloop: OuterLoop(...)(state, ...)
    state,
    train_dataset(),
    {ciclo.on_train_step: train_step, ciclo.on_test_step: eval_step},
    callbacks=[ckpt_action],  # Jaxloop: TrainLoop(end_actions=[...])
    stop=STEPS,  # train_total_steps
    epoch_duration=max(STEPS // 6, 1),  # train_loop_steps
    test_dataset={  # eval_specs: one EvalLoop per dataset
        "eval": eval_dataset(x_eval, y_eval),
        "train_sample": eval_dataset(x_train[:300], y_train[:300]),
    },
    test_duration={"train_sample": 2},  # EvalSpec(num_steps=2)
)

steps, accuracy = history.collect("steps", "accuracy_eval")  # summary_action
print(f"step {steps[-1]}: eval accuracy {accuracy[-1]:.3f}")
assert ckpt_action.latest_step() == elapsed.steps == STEPS
if STEPS >= 600:
    assert accuracy[-1] > 0.9, accuracy
