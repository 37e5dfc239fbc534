"""Jax Fit's headline workflow in ciclo: a `TrainState` whose optimizer follows a
warmup + cosine learning-rate schedule built from `steps_per_epoch`, a loss function
and an evaluation step, then `fit(state, train_ds, test_ds, num_epochs=...,
eval_freq=...)`, which trains epoch by epoch, evaluates every `eval_freq` epochs and
logs the per-epoch losses and the learning rate to TensorBoard.

    python examples/from_peers/jax_fit.py             # 30 epochs (420 steps), > 0.9
    CICLO_EXAMPLE_STEPS=30 python examples/from_peers/jax_fit.py

Jax Fit -> ciclo:
    TrainState.create(apply_fn, params,   -> ciclo.create_flax_state(model, inputs,
        batch_stats, tx)                                             tx, ...)
    loss_fn (key 2)                       -> losses={"loss": loss_fn}
    eval_step (key 3)                     -> metrics={"accuracy": accuracy}
    lr_schedule(base_lr, steps_per_epoch, -> optax.warmup_cosine_decay_schedule(...)
        epochs, warmup_epochs)               + ciclo.lr_monitor()
    fit(state, train_ds, test_ds,         -> ciclo.train_loop(state, train_ds,
        num_epochs=..., eval_freq=...)           test_dataset=..., epochs=...,
                                                 test_every=...)
    per-epoch loss                        -> epoch_logs=True ("loss_epoch")
    its per-epoch log line                -> ciclo.keras_bar(verbose=2): one epoch
                                             summary per epoch (loss_epoch, ...,
                                             accuracy_test on evaluated epochs)
    log_name=..., hparams=... (TensorBoard) -> ciclo.tensorboard(logdir, hparams=...)
"""

import os
import tempfile

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from sklearn.datasets import load_digits

import ciclo

STEPS = int(os.environ.get("CICLO_EXAMPLE_STEPS", "420"))
DIR = os.environ.get("CICLO_EXAMPLE_DIR") or tempfile.mkdtemp()
BATCH = 100
BASE_LR = 3e-3  # Jax Fit: lr_schedule(base_lr=...)
EVAL_FREQ = 2  # Jax Fit: eval_freq, evaluate every 2 epochs

x, y = load_digits(return_X_y=True)
order = np.random.default_rng(0).permutation(len(x))
x, y = (x[order] / 16.0).astype(np.float32), y[order].astype(np.int32)
x = x.reshape(-1, 8, 8, 1)  # images for the Conv model
x_train, y_train, x_test, y_test = x[:1400], y[:1400], x[1400:], y[1400:]


def batches(xs, ys):  # Jax Fit: a data loader, any re-iterable with a len()
    return [(xs[i : i + BATCH], ys[i : i + BATCH]) for i in range(0, len(xs), BATCH)]


train_ds, test_ds = batches(x_train, y_train), batches(x_test, y_test)
NUM_EPOCHS = max(STEPS // len(train_ds), EVAL_FREQ)  # Jax Fit: num_epochs


class Model(nn.Module):  # Jax Fit: key 1, your model (conv + bn + relu + dropout)
    @nn.compact
    def __call__(self, x, train=False):  # ciclo passes train=True / False
        x = nn.Conv(features=16, kernel_size=(3, 3))(x)
        x = nn.BatchNorm(use_running_average=not train)(x)
        x = nn.relu(x)
        x = nn.Dropout(rate=0.5)(x, deterministic=not train)
        x = x.reshape((x.shape[0], -1))
        return nn.Dense(features=10)(x)


def loss_fn(logits, labels):  # Jax Fit: key 2, loss_fn (its loss_dict -> history)
    return optax.softmax_cross_entropy(logits, jax.nn.one_hot(labels, 10)).mean()


def accuracy(logits, labels):  # Jax Fit: key 3, eval_step
    return jnp.equal(jnp.argmax(logits, -1), labels).mean()


lr_fn = optax.warmup_cosine_decay_schedule(  # Jax Fit: lr_schedule(...)
    init_value=BASE_LR / 10,  # as Jax Fit's lr_schedule
    peak_value=BASE_LR,
    warmup_steps=1 * len(train_ds),  # warmup_epochs * steps_per_epoch
    decay_steps=NUM_EPOCHS * len(train_ds),  # epochs * steps_per_epoch
)
state = ciclo.create_flax_state(  # Jax Fit: model.init + TrainState.create(...)
    Model(),
    inputs=x_train[:1],
    tx=optax.inject_hyperparams(optax.adam)(lr_fn),  # as in Jax Fit
    losses={"loss": loss_fn},
    metrics={"accuracy": accuracy},
)
state, history, elapsed = ciclo.train_loop(  # Jax Fit: fit(state, train_ds, test_ds,
    state,
    train_ds,
    test_dataset=lambda: test_ds,  # test_ds, read afresh at each evaluation
    epochs=NUM_EPOCHS,  # num_epochs
    test_every=EVAL_FREQ,  # eval_freq
    epoch_logs=True,  # the per-epoch losses: loss_epoch, accuracy_epoch
    callbacks=[
        ciclo.keras_bar(verbose=2),  # one line per epoch, as Jax Fit prints
        ciclo.lr_monitor(),  # the learning rate, read from inject_hyperparams
        ciclo.tensorboard(  # log_name="digits", hparams={...}
            f"{DIR}/digits", hparams={"batch_size": BATCH, "lr": BASE_LR}
        ),
    ],
)

steps, loss_epoch = history.collect("steps", "loss_epoch")
accuracy_test = history.collect("accuracy_test")
rates = history.collect("learning_rate")
assert elapsed.steps == NUM_EPOCHS * len(train_ds)
assert len(loss_epoch) == NUM_EPOCHS and len(accuracy_test) == NUM_EPOCHS // EVAL_FREQ
assert loss_epoch[-1] < loss_epoch[0], loss_epoch
assert np.isclose(rates[0], BASE_LR / 10) and np.isclose(max(rates), BASE_LR)
assert rates[-1] < BASE_LR / 10, rates  # warmup, then cosine decay
assert os.listdir(f"{DIR}/digits")  # the TensorBoard event file and hparams
if STEPS >= 420:
    assert accuracy_test[-1] > 0.9, accuracy_test
