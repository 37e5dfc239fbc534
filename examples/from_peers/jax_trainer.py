"""JAX-Trainer's headline workflow in ciclo: a `TrainerModule` subclass that writes
only the loss function (the loss, the updated mutable variables and metrics),
trained for `train_epochs` with validation every `check_val_every_n_epoch` epochs,
callbacks at each training epoch's start and after each validation, the gradient
norm and the learning rate logged, NaN detection, a `ModelCheckpoint` keeping the
best model by `val/acc` without the optimizer state, and `load_from_checkpoint` to
test that best model.

    python examples/from_peers/jax_trainer.py         # 30 epochs (360 steps), > 0.9
    CICLO_EXAMPLE_STEPS=30 python examples/from_peers/jax_trainer.py

JAX-Trainer -> ciclo:
    class ImgClassifierTrainer(TrainerModule) -> a managed.ManagedState subclass
    loss_function_linen(params, state, batch, -> a method returning logs and the
        rng, train) -> loss, (mutables, metrics)  state with its new batch_stats
    its training / evaluation functions       -> @managed.train_step / @managed.step
                                                 methods `train_step` / `test_step`
    train_epochs, check_val_every_n_epoch     -> epochs, test_every
    val/acc, val/loss                         -> acc_val, loss_val (test_name="val")
    on_training_epoch_start                   -> ciclo.on_epoch_begin
    on_validation_epoch_start / _end          -> a callbacks object's
                                                 on_validation_begin / _end
    its per-epoch metric line (val/acc, ...)  -> ciclo.keras_bar(verbose=2): one
                                                 epoch summary per epoch
    train metrics aggregated per epoch        -> epoch_logs=True (loss_epoch, ...;
                                                 per metric: aggregation=...)
    log_grad_norm: True                       -> managed.train_step(log_grad_norm=True)
    LearningRateMonitor (at each epoch start) -> ciclo.lr_monitor(schedule) on
                                                 ciclo.on_epoch_begin
    detect_nans: True                         -> ciclo.nan_guard()
    ModelCheckpoint(monitor="val/acc", mode="max", save_top_k=1,
                    save_optimizer_state=False)
        -> ciclo.checkpoint(dir, monitor="acc_val", mode="max", keep=1,
                            items=["params", "batch_stats"])
    TrainerModule.load_from_checkpoint(dir)   -> ciclo.restore(dir, state, best=True)
    trainer.test_model(test_loader)           -> ciclo.test_loop(state, test_data)
"""

import os
import tempfile
from typing import Any

import flax.linen as nn
import jax
import numpy as np
import optax
from sklearn.datasets import load_digits

import ciclo
from ciclo import managed

STEPS = int(os.environ.get("CICLO_EXAMPLE_STEPS", "360"))
DIR = os.environ.get("CICLO_EXAMPLE_DIR") or tempfile.mkdtemp()
BATCH = 100  # dataset: global_batch_size
CHECK_VAL_EVERY = 2  # trainer: check_val_every_n_epoch

x, y = load_digits(return_X_y=True)
rng = np.random.default_rng(42)  # seed: 42
order = rng.permutation(len(x))  # dataset: split_seed
x, y = (x[order] / 16.0).astype(np.float32), y[order].astype(np.int32)
x_train, y_train, x_val, y_val = x[:1200], y[:1200], x[1200:1400], y[1200:1400]
x_test, y_test = x[1400:], y[1400:]
STEPS_PER_EPOCH = len(x_train) // BATCH
TRAIN_EPOCHS = max(STEPS // STEPS_PER_EPOCH, CHECK_VAL_EVERY)  # trainer: train_epochs


def train_loader():  # JAX-Trainer: dataset.train_loader, reshuffled every epoch
    order = rng.permutation(len(x_train)).reshape(STEPS_PER_EPOCH, BATCH)
    return [(x_train[index], y_train[index]) for index in order]


class SimpleClassifier(nn.Module):  # model: c_hid 32, gelu, batch_norm
    c_hid: int = 32
    num_classes: int = 10

    @nn.compact
    def __call__(self, x, train=True):
        x = nn.Dense(self.c_hid)(x)
        x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x)
        return nn.Dense(self.num_classes)(nn.gelu(x))


class ImgClassifierTrainer(managed.ManagedState):  # JAX-Trainer: TrainerModule
    batch_stats: Any  # the TrainState's mutable variables

    def loss_function(self, batch, train):  # JAX-Trainer: loss_function_linen
        imgs, labels = batch
        variables = {"params": self.params, "batch_stats": self.batch_stats}
        logits, mutable_variables = self.apply_fn(
            variables, imgs, train=train, mutable=["batch_stats"]
        )
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        acc = (logits.argmax(axis=-1) == labels).mean()
        logs = ciclo.logs().add_loss("loss", loss).add_metric("acc", acc)
        return logs, self.replace(batch_stats=mutable_variables["batch_stats"])

    @managed.train_step(log_grad_norm=True)  # trainer: log_grad_norm: True
    def train_step(self, batch):  # JAX-Trainer: the wrapped training function
        return self.loss_function(batch, train=True)

    @managed.step
    def test_step(self, batch):  # JAX-Trainer: the wrapped evaluation function
        return self.loss_function(batch, train=False)


epochs_started = []


def on_training_epoch_start(state, batch, elapsed):  # JAX-Trainer callback hook
    epochs_started.append(elapsed.steps)


class ValidationCounter:  # a JAX-Trainer Callback with validation hooks
    def __init__(self):
        self.started = self.ended = 0

    def on_validation_begin(self):  # on_validation_epoch_start
        self.started += 1

    def on_validation_end(self):  # on_validation_epoch_end
        self.ended += 1


validations = ValidationCounter()


lr_schedule = optax.warmup_cosine_decay_schedule(  # WarmupCosineDecaySchedule
    init_value=0.0,
    peak_value=3e-3,
    warmup_steps=STEPS_PER_EPOCH,
    decay_steps=TRAIN_EPOCHS * STEPS_PER_EPOCH,
    end_value=3e-4,  # decay_factor: 0.1
)
model = SimpleClassifier()
variables = model.init(jax.random.key(42), x_train[:1], train=False)  # init_model
state = ImgClassifierTrainer.create(
    apply_fn=model.apply,
    params=variables["params"],
    batch_stats=variables["batch_stats"],
    tx=optax.adamw(lr_schedule, weight_decay=0.01),  # optimizer: AdamW
)
checkpoint = ciclo.checkpoint(  # ModelCheckpoint(...)
    f"{DIR}/checkpoints",
    monitor="acc_val",  # monitor: val/acc
    mode="max",
    keep=1,  # save_top_k: 1
    items=["params", "batch_stats"],  # save_optimizer_state: False
)
state, history, elapsed = ciclo.train_loop(  # trainer.train_model(...)
    state,
    train_loader,
    {
        ciclo.on_epoch_begin: [
            ciclo.lr_monitor(lr_schedule),  # callbacks: LearningRateMonitor
            on_training_epoch_start,
        ],
        # callbacks: ModelCheckpoint, which saves after each validation
        ciclo.on_epoch_end.every(CHECK_VAL_EVERY): checkpoint,
    },
    test_dataset=lambda: [(x_val, y_val)],  # dataset: val_loader
    test_name="val",
    epochs=TRAIN_EPOCHS,  # train_epochs
    test_every=CHECK_VAL_EVERY,  # check_val_every_n_epoch
    epoch_logs=True,  # the train metrics' epoch means: loss_epoch, acc_epoch
    callbacks=[
        ciclo.nan_guard(),  # detect_nans: True
        validations,  # callbacks with on_validation_* hooks
        ciclo.keras_bar(verbose=2),  # one line per epoch, val/* included
    ],
)

# JAX-Trainer: TrainerModule.load_from_checkpoint(...), then test_model(test_loader)
best, best_elapsed = ciclo.restore(f"{DIR}/checkpoints", state, best=True)
_, val, _ = ciclo.test_loop(best, [(x_val, y_val)])
_, test, _ = ciclo.test_loop(best, [(x_test, y_test)])
val_acc, test_acc = val.collect("acc")[-1], test.collect("acc")[-1]
print(f"best checkpoint: step {best_elapsed.steps}, val/acc {val_acc:.3f}, "
      f"test/acc {test_acc:.3f}")  # fmt: skip
assert elapsed.steps == TRAIN_EPOCHS * STEPS_PER_EPOCH
assert epochs_started == list(range(0, elapsed.steps, STEPS_PER_EPOCH))
assert len(history.collect("acc_val")) == TRAIN_EPOCHS // CHECK_VAL_EVERY
assert validations.started == validations.ended == TRAIN_EPOCHS // CHECK_VAL_EVERY
assert len(history.collect("loss_epoch")) == TRAIN_EPOCHS
assert np.isclose(val_acc, max(history.collect("acc_val")))  # the best is restored
assert len(history.collect("grad_norm")) == elapsed.steps
assert len(history.collect("learning_rate")) == TRAIN_EPOCHS
if STEPS >= 360:
    assert test_acc > 0.9, test_acc
