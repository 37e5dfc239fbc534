"""ciclo: a functional training-loops library for JAX."""

from ciclo.time import Elapsed, Period, at, elapse
from ciclo.logs import Logs, logs
from ciclo.schedules.base import Schedule

# schedules
from ciclo.schedules import after, always, every, never, piecewise

# history and the loop
from ciclo.history import History, history
from ciclo.loop import LoopState, loop
from ciclo import callbacks

# predefined loops, named schedules and callbacks
from ciclo.loops import (
    on_epoch_end,
    on_predict_batch_begin,
    on_predict_batch_end,
    on_predict_begin,
    on_predict_end,
    on_predict_step,
    on_reset_step,
    on_test_batch_begin,
    on_test_batch_end,
    on_test_begin,
    on_test_end,
    on_test_step,
    on_train_batch_begin,
    on_train_batch_end,
    on_train_begin,
    on_train_end,
    on_train_step,
    predict_loop,
    test_loop,
    train_loop,
)
from ciclo.callbacks.early_stopping import early_stopping
from ciclo.callbacks.inner_loop import inner_loop
from ciclo.callbacks.noop import noop
from ciclo.callbacks.keras_bar import keras_bar
from ciclo.callbacks.tqdm_bar import tqdm_bar
from ciclo.callbacks.checkpoint import checkpoint, restore

# managed API and strategies
from ciclo import managed, strategies
from ciclo.strategies import Strategy, get_strategy, register_strategy

# Flax state factories
from ciclo.flax import FlaxState, create_flax_state

__all__ = [
    "Elapsed",
    "FlaxState",
    "History",
    "Logs",
    "LoopState",
    "Period",
    "Schedule",
    "Strategy",
    "after",
    "always",
    "at",
    "callbacks",
    "checkpoint",
    "create_flax_state",
    "early_stopping",
    "elapse",
    "every",
    "get_strategy",
    "history",
    "inner_loop",
    "keras_bar",
    "logs",
    "loop",
    "managed",
    "never",
    "noop",
    "on_epoch_end",
    "on_predict_batch_begin",
    "on_predict_batch_end",
    "on_predict_begin",
    "on_predict_end",
    "on_predict_step",
    "on_reset_step",
    "on_test_batch_begin",
    "on_test_batch_end",
    "on_test_begin",
    "on_test_end",
    "on_test_step",
    "on_train_batch_begin",
    "on_train_batch_end",
    "on_train_begin",
    "on_train_end",
    "on_train_step",
    "piecewise",
    "predict_loop",
    "register_strategy",
    "restore",
    "strategies",
    "test_loop",
    "tqdm_bar",
    "train_loop",
]

__version__ = "0.2.0"
