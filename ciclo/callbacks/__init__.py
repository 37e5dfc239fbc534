"""Callbacks shipped with ciclo (each in its own private module), `LoopElement`,
the mixin of callbacks that can be spread into a task dict with `**`, and
`TEST_AGGREGATION`, the test loops' aggregation: `train_loop`'s evaluation uses
it; pass it to an `inner_loop` running a test loop to aggregate the same way
(stateful metrics `"last"`, losses and metrics `"weighted_mean"`).

Example:
    >>> import ciclo
    >>> ciclo.callbacks.inner_loop is ciclo.inner_loop
    True
    >>> dict(ciclo.callbacks.TEST_AGGREGATION)["losses"]
    'weighted_mean'
"""

from __future__ import annotations

from typing import Any

from ciclo.callbacks._base import LoopElement as LoopElement
from ciclo.callbacks._early_stopping import early_stopping as early_stopping
from ciclo.callbacks._inner_loop import TEST_AGGREGATION as TEST_AGGREGATION
from ciclo.callbacks._inner_loop import inner_loop as inner_loop
from ciclo.callbacks._noop import noop as noop

__all__ = [
    "TEST_AGGREGATION",
    "LoopElement",
    "checkpoint",
    "csv_logger",
    "early_stopping",
    "inner_loop",
    "jsonl_logger",
    "keras_bar",
    "lr_monitor",
    "nan_guard",
    "noop",
    "profiler",
    "restore",
    "tensorboard",
    "tqdm_bar",
    "wandb_logger",
]

_LAZY = {
    "keras_bar",
    "tqdm_bar",
    "checkpoint",
    "restore",
    "tensorboard",
    "csv_logger",
    "jsonl_logger",
    "wandb_logger",
    "lr_monitor",
    "nan_guard",
    "profiler",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'ciclo.callbacks' has no attribute {name!r}")
    import ciclo

    return getattr(ciclo, name)
