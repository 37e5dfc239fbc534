"""ciclo: a functional training-loops library for JAX.

The loop language (time, schedules, `loop`, logs, history, the predefined loops)
needs only jax, numpy and optax. Callbacks and integrations that need more (orbax
checkpoints, pkbar/tqdm bars, Flax, the managed strategies) are imported when first
used; a missing optional dependency raises an `ImportError` naming the extra to
install.

Example:
    >>> import ciclo
    >>> _, history, elapsed = ciclo.loop(0, range(3), {ciclo.every(1): ciclo.noop})
    >>> elapsed.steps
    3
"""

from __future__ import annotations

import importlib
from typing import Any

from ciclo._time import Elapsed as Elapsed
from ciclo._period import Period as Period
from ciclo._input.batch import Steps as Steps
from ciclo._period import at as at
from ciclo._time import elapse as elapse
from ciclo._logs import Logs as Logs
from ciclo._logs import logs as logs
from ciclo._history.history import History as History
from ciclo._history.history import history as history
from ciclo._loop.callback import inject as inject
from ciclo._schedules import Schedule as Schedule
from ciclo._schedules import after as after
from ciclo._schedules import always as always
from ciclo._schedules import every as every
from ciclo._schedules import never as never
from ciclo._schedules import piecewise as piecewise
from ciclo._loop.state import LoopState as LoopState
from ciclo._loop.loop import loop as loop
from ciclo._input.fused import fuse as fuse
from ciclo._schedules.named import NamedSchedule as NamedSchedule
from ciclo._schedules.named import on_epoch_begin as on_epoch_begin
from ciclo._schedules.named import on_epoch_end as on_epoch_end
from ciclo._schedules.named import on_predict_batch_begin as on_predict_batch_begin
from ciclo._schedules.named import on_predict_batch_end as on_predict_batch_end
from ciclo._schedules.named import on_predict_begin as on_predict_begin
from ciclo._schedules.named import on_predict_end as on_predict_end
from ciclo._schedules.named import on_predict_step as on_predict_step
from ciclo._schedules.named import on_reset_step as on_reset_step
from ciclo._schedules.named import on_test_batch_begin as on_test_batch_begin
from ciclo._schedules.named import on_test_batch_end as on_test_batch_end
from ciclo._schedules.named import on_test_begin as on_test_begin
from ciclo._schedules.named import on_test_end as on_test_end
from ciclo._schedules.named import on_test_step as on_test_step
from ciclo._schedules.named import on_train_batch_begin as on_train_batch_begin
from ciclo._schedules.named import on_train_batch_end as on_train_batch_end
from ciclo._schedules.named import on_train_begin as on_train_begin
from ciclo._schedules.named import on_train_end as on_train_end
from ciclo._schedules.named import on_train_step as on_train_step
from ciclo._schedules.named import (
    on_validation_batch_begin as on_validation_batch_begin,
)
from ciclo._schedules.named import on_validation_batch_end as on_validation_batch_end
from ciclo._schedules.named import on_validation_begin as on_validation_begin
from ciclo._schedules.named import on_validation_end as on_validation_end
from ciclo._schedules.named import on_validation_step as on_validation_step
from ciclo._loop.iterate import iterate as iterate
from ciclo._predefined.evaluate import predict_loop as predict_loop
from ciclo._predefined.evaluate import test_loop as test_loop
from ciclo._predefined.train import train_loop as train_loop
from ciclo import callbacks as callbacks
from ciclo.callbacks._early_stopping import early_stopping as early_stopping
from ciclo.callbacks._inner_loop import inner_loop as inner_loop
from ciclo.callbacks._noop import noop as noop
from ciclo.callbacks._csv import csv_logger as csv_logger
from ciclo.callbacks._csv import jsonl_logger as jsonl_logger
from ciclo.callbacks._lr_monitor import lr_monitor as lr_monitor
from ciclo.callbacks._nan_guard import nan_guard as nan_guard
from ciclo.callbacks._profiler import profiler as profiler
from ciclo.callbacks._tensorboard import tensorboard as tensorboard
from ciclo.callbacks._wandb import wandb_logger as wandb_logger

# name -> (module, attribute, extra): imported on first access, since they pull in
# orbax, pkbar, tqdm, flax or einop.
_LAZY = {
    "keras_bar": ("ciclo.callbacks._keras_bar", "keras_bar", "bars"),
    "tqdm_bar": ("ciclo.callbacks._tqdm_bar", "tqdm_bar", "bars"),
    "checkpoint": ("ciclo._checkpoint.checkpoint", "checkpoint", "checkpoint"),
    "restore": ("ciclo._checkpoint.restore", "restore", "checkpoint"),
    "managed": ("ciclo.managed", None, "flax"),
    "Strategy": ("ciclo._strategies", "Strategy", "flax"),
    "register_strategy": ("ciclo._strategies", "register_strategy", "flax"),
    "get_strategy": ("ciclo._strategies", "get_strategy", "flax"),
    "sharded": ("ciclo._strategies", "sharded", "flax"),
    "create_flax_state": ("ciclo._flax", "create_flax_state", "flax"),
    "FlaxState": ("ciclo._flax", "FlaxState", "flax"),
}


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'ciclo' has no attribute {name!r}")
    module_name, attribute, extra = target
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        package = error.name or ""
        if package == "ciclo" or package.startswith("ciclo."):
            raise  # ciclo's own import failed: not a dependency's
        if isinstance(error, ModuleNotFoundError):  # a dependency is missing
            raise ImportError(
                f"ciclo.{name} needs {package or 'a package that is missing'} "
                f"({error}); install it with: pip install 'ciclo[{extra}]'."
            ) from error
        raise ImportError(  # installed, but importing from it failed
            f"ciclo.{name} could not import from {package or 'a dependency'}, "
            f"which is installed but failed: {error}. An incompatible version? "
            f"Upgrade it: pip install -U 'ciclo[{extra}]'."
        ) from error
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "Elapsed",
    "FlaxState",
    "History",
    "Logs",
    "LoopState",
    "NamedSchedule",
    "Period",
    "Schedule",
    "Steps",
    "Strategy",
    "after",
    "always",
    "at",
    "callbacks",
    "checkpoint",
    "create_flax_state",
    "csv_logger",
    "early_stopping",
    "elapse",
    "every",
    "fuse",
    "get_strategy",
    "history",
    "inject",
    "inner_loop",
    "iterate",
    "jsonl_logger",
    "keras_bar",
    "logs",
    "loop",
    "lr_monitor",
    "managed",
    "nan_guard",
    "never",
    "noop",
    "on_epoch_begin",
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
    "on_validation_batch_begin",
    "on_validation_batch_end",
    "on_validation_begin",
    "on_validation_end",
    "on_validation_step",
    "piecewise",
    "predict_loop",
    "profiler",
    "register_strategy",
    "restore",
    "sharded",
    "tensorboard",
    "test_loop",
    "tqdm_bar",
    "train_loop",
    "wandb_logger",
]

__version__ = "0.2.0"
