"""What of a state a checkpoint holds, and in which layout.

A managed state (one whose `strategy` attribute is a strategy, such
as `ManagedState` / `FlaxState`) is saved in its single-device host layout
(`strategy.to_host`) and restored into the host layout of the target, then placed
with the target's strategy (`place_state`): a checkpoint moves freely between
strategies and device counts (e.g. saved under `data_parallel` on 8 devices,
restored under `jit` on one). A strategy with a `checkpoint_layout(state)` method
saves that layout instead: `ciclo.sharded` keeps a sharded state's arrays as they
are, so orbax writes each process's shards (no host gathers the model) and restores
them straight into the shardings of the target (another mesh or device count).

`checkpoint(items=[...])` saves only those fields of the state (`select`), and a
restore puts them back into the target (`put`), the other fields being the
target's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

__all__ = ["as_items", "host_layout", "put", "select", "strategy_of"]


def strategy_of(state: Any) -> Any:
    """The strategy a managed state carries in `state.strategy` (or, in a state
    from before strategies were objects, names), or None.

    Duck-typed (any object with a `strategy` attribute), so that this module needs
    no import of `ciclo.managed`.
    """
    if getattr(state, "strategy", None) is None:
        return None
    # imported here: ciclo.callbacks is imported before ciclo.strategies
    from ciclo._strategies.registry import strategy_of as carried

    return carried(state)


def host_layout(state: Any) -> Any:
    """The state as saved: a managed state in its single-device host layout, or
    in the layout its strategy's `checkpoint_layout` gives."""
    strategy = strategy_of(state)
    if strategy is None:
        return state
    # a strategy may keep its layout (e.g. `ciclo.sharded`: sharded arrays, each
    # process writing its own shards, restored in the target's shardings)
    return getattr(strategy, "checkpoint_layout", strategy.to_host)(state)


def as_items(items: Any) -> tuple[str, ...] | None:
    """`checkpoint(items=...)` as a tuple of field names (None: the whole state)."""
    if items is None:
        return None
    names = (items,) if isinstance(items, str) else items
    if (
        not isinstance(names, list | tuple)
        or not names
        or not all(isinstance(n, str) for n in names)
    ):
        raise TypeError(
            f"checkpoint: `items` must be a field name or a list of them (attributes "
            f"of the state, or keys of a dict state), e.g. items=['params']; got "
            f"{items!r:.80} ({type(items).__name__})."
        )
    return tuple(names)


def select(state: Any, items: tuple[str, ...] | None) -> Any:
    """The fields `items` of `state` as a dict (the whole state for None)."""
    if items is None:
        return state
    missing = [n for n in items if not _has(state, n)]
    if missing:
        raise ValueError(
            f"checkpoint(items={list(items)}): the state "
            f"({type(state).__name__}) has no field {missing}; use attribute names "
            f"of the state (e.g. 'params') or keys of a dict state."
        )
    return {
        n: state[n] if isinstance(state, Mapping) else getattr(state, n) for n in items
    }


def _has(state: Any, name: str) -> bool:
    return name in state if isinstance(state, Mapping) else hasattr(state, name)


def put(target: Any, fields: Mapping[str, Any]) -> Any:
    """`target` with `fields` replaced (a dict, a Flax struct / dataclass, or any
    object with `replace(**fields)`)."""
    if isinstance(target, Mapping):
        return type(target)({**target, **fields})
    if hasattr(target, "replace"):
        return target.replace(**fields)
    if dataclasses.is_dataclass(target):
        return dataclasses.replace(target, **fields)
    raise TypeError(
        f"ciclo.restore: cannot put the saved items {sorted(fields)} into a "
        f"{type(target).__name__}; the target must be a dict, a dataclass or have "
        f"`replace(**fields)` (as Flax TrainState)."
    )
