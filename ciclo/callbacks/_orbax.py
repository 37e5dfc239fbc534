"""The orbax side of `ciclo.checkpoint`: the on-disk layout and restoring from it.

A checkpoint is an orbax `CheckpointManager` step directory named by the number of
batches trained into the state, with two items: `state` (the pytree, `StandardSave`;
a bare array is wrapped in a one-element list) and `elapsed` (JSON). Checkpoints
saved with a monitor carry orbax metrics `{"score", "value", "monitor", "mode"}`,
`score` oriented so that higher is better.

A managed state (one whose `strategy` attribute names a registered strategy, such
as `ManagedState` / `FlaxState`) is saved in its single-device host layout
(`strategy.to_host`) and restored into the host layout of the target, then placed
with the target's strategy (`place_state`): a checkpoint moves freely between
strategies and device counts (e.g. saved under `data_parallel` on 8 devices,
restored under `jit` on one).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath

from ciclo._time import Elapsed

__all__ = [
    "ITEMS",
    "elapsed_json",
    "host_layout",
    "is_leaf",
    "manager",
    "path",
    "restore_from",
    "score",
]

ITEMS = ("state", "elapsed")


def score(metrics: Any) -> float:
    """Higher is better; checkpoints saved with a monitor store it as `score`."""
    if isinstance(metrics, Mapping) and "score" in metrics:
        return float(metrics["score"])
    return -math.inf


def path(directory: Any) -> epath.Path:
    """`directory` as an absolute `epath.Path` (URLs such as gs://... kept as is)."""
    if not isinstance(directory, str | os.PathLike):
        raise TypeError(
            f"`directory` must be a path (str or os.PathLike), got {directory!r} "
            f"({type(directory).__name__})."
        )
    result = epath.Path(directory)
    return result if "://" in str(directory) else result.absolute()


def manager(directory: epath.Path, **options: Any) -> ocp.CheckpointManager:
    """A `CheckpointManager` of the `state` + `elapsed` layout."""
    return ocp.CheckpointManager(
        directory,
        item_names=ITEMS,
        options=ocp.CheckpointManagerOptions(**options),
    )


def strategy_of(state: Any) -> Any:
    """The registered strategy a managed state names in `state.strategy`, or None.

    Duck-typed (any object with a `str` `strategy` attribute naming a registered
    strategy), so that this module needs no import of `ciclo.managed`.
    """
    name = getattr(state, "strategy", None)
    if not isinstance(name, str):
        return None
    # imported here: ciclo.callbacks is imported before ciclo.strategies
    from ciclo._strategies.registry import get_strategy

    try:
        return get_strategy(name)
    except ValueError:
        return None


def host_layout(state: Any) -> Any:
    """The state as saved: a managed state in its single-device host layout."""
    strategy = strategy_of(state)
    return state if strategy is None else strategy.to_host(state)


def is_leaf(state: Any) -> bool:
    """True for a bare array / number, which `StandardSave` cannot store alone."""
    # orbax's StandardSave needs a container; a bare array / number is wrapped.
    return jax.tree_util.treedef_is_leaf(jax.tree.structure(state))


def elapsed_json(elapsed: Elapsed, wrapped: bool) -> dict[str, Any]:
    """The `elapsed` item (and whether the state was wrapped in a list)."""
    return {
        "steps": int(elapsed.steps),
        "samples": int(elapsed.samples),
        "date": float(elapsed.date),
        "date_start": float(elapsed.date_start),
        "wrapped": wrapped,
    }


def restore_from(
    mngr: ocp.CheckpointManager,
    target_state: Any,
    best: bool,
    step: int | None,
) -> tuple[Any, Elapsed]:
    """`(state, elapsed)` of `step`, else the best (`best=True`), else the latest.

    Raises:
        ValueError: no checkpoint, no such step, or `best` without monitored ones.
    """
    steps = mngr.all_steps()
    where = mngr.directory
    if not steps:
        raise ValueError(f"No checkpoint to restore in {where}.")
    if step is not None:
        if step not in steps:
            raise ValueError(
                f"No checkpoint for step {step} in {where}; steps there: {steps}."
            )
    elif best:
        scored = [s for s in steps if score(mngr.metrics(s)) > -math.inf]
        if not scored:
            raise ValueError(
                f"best=True, but the checkpoints in {where} (steps {steps}) carry no "
                f"monitored metric: save them with ciclo.checkpoint(..., "
                f"monitor='name'), or restore the latest with best=False."
            )
        step = max(scored, key=lambda s: (score(mngr.metrics(s)), s))
    else:
        step = steps[-1]
    items = mngr.restore(step, args=ocp.args.Composite(elapsed=ocp.args.JsonRestore()))
    e = items["elapsed"]
    wrapped = bool(e.get("wrapped", False))
    strategy = strategy_of(target_state)
    if target_state is None:
        state_args = ocp.args.StandardRestore()
    else:
        host = target_state if strategy is None else strategy.to_host(target_state)
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, host)
        state_args = ocp.args.StandardRestore([abstract] if wrapped else abstract)
    state = mngr.restore(step, args=ocp.args.Composite(state=state_args))["state"]
    state = state[0] if wrapped else state
    if strategy is not None:
        state = strategy.place_state(state)
    elapsed = Elapsed(int(e["steps"]), int(e["samples"]), e["date"], e["date_start"])
    return state, elapsed
