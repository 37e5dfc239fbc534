"""ciclo: a functional training-loops library for JAX."""

from ciclo.time import Elapsed, Period, at, elapse
from ciclo.logs import Logs, logs
from ciclo.schedules.base import Schedule

# --- schedules (issue 2) ---
from ciclo.schedules import after, always, every, never, piecewise

# --- history and loop (issue 2) ---
from ciclo.history import History, history
from ciclo.loop import LoopState, loop
from ciclo import callbacks

# --- callbacks, predefined loops and named schedules (issue 3) ---
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

# --- managed API and strategies (issue 4) ---
from ciclo import managed, strategies
from ciclo.strategies import Strategy, get_strategy, register_strategy

# --- flax (issue 5) ---
from ciclo.flax import FlaxState, create_flax_state

__version__ = "0.2.0"
