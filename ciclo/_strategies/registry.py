"""The strategy registry: `register_strategy` and `get_strategy`."""

from __future__ import annotations

from typing import Any

from ciclo._short import short
from ciclo._strategies.base import Strategy

__all__ = [
    "get_strategy",
    "lookup",
    "register_strategy",
    "registered_name",
    "registered_strategies",
    "strategy_of",
]

_REGISTRY: dict[str, Strategy] = {}
METHODS = ("place_state", "place_batch", "wrap", "to_host")


def _normalize(name: str) -> str:
    return name.replace("-", "_")


def register_strategy(
    name: str, strategy: Strategy, *, overwrite: bool = False
) -> None:
    """Registers `strategy` under `name`, for `ManagedState.create(strategy=name)`.

    The object is stored as given: its own `name` attribute is not changed, so one
    strategy object may be registered under several names.

    Args:
        name: the name (`"-"` and `"_"` are interchangeable).
        strategy: a `Strategy` (usually a subclass instance), or any object with
            its methods `place_state`, `place_batch`, `wrap` and `to_host`.
        overwrite: replace a different strategy already registered under `name`.

    Raises:
        TypeError: if `name` is not a non-empty str, or `strategy` lacks one of the
            methods.
        ValueError: if `name` is taken by another strategy and `overwrite` is False.

    Example:
        >>> import ciclo
        >>> debug = ciclo.Strategy("mine")
        >>> ciclo.register_strategy("debug", debug, overwrite=True)
        >>> ciclo.get_strategy("debug") is debug, debug.name
        (True, 'mine')
    """
    if not isinstance(name, str) or not name:
        raise TypeError(
            f"register_strategy: the name must be a non-empty str, got {short(name)}; "
            f"e.g. register_strategy('my_strategy', MyStrategy())."
        )
    missing = [m for m in METHODS if not callable(getattr(strategy, m, None))]
    if missing:
        raise TypeError(
            f"Cannot register {strategy!r} ({type(strategy).__name__}) as strategy "
            f"{name!r}: it lacks {missing}; a strategy needs {list(METHODS)}. "
            f"Subclass ciclo.Strategy and override what differs."
        )
    key = _normalize(name)
    if key in _REGISTRY and not overwrite and _REGISTRY[key] is not strategy:
        raise ValueError(
            f"A strategy named {name!r} is already registered "
            f"({_REGISTRY[key]!r}); pass overwrite=True to replace it, or choose "
            f"another name."
        )
    _REGISTRY[key] = strategy


def get_strategy(name: str | Strategy) -> Strategy:
    """The strategy registered under `name` (a `Strategy` is returned as is).

    Args:
        name: a registered name (`"eager"`, `"jit"`, `"jit_donate"`,
            `"data_parallel"`, `"data_parallel_donate"`, `"sharded"`, or one added
            with `register_strategy`), or a `Strategy`.

    Returns:
        The `Strategy` object.

    Raises:
        ValueError: for an unknown name; the message lists the registered ones.
        TypeError: if `name` is neither a str nor a strategy.

    Example:
        >>> import ciclo
        >>> ciclo.get_strategy("data-parallel") is ciclo.get_strategy("data_parallel")
        True
    """
    if isinstance(name, Strategy):
        return name
    if not isinstance(name, str):
        raise TypeError(
            f"get_strategy expects a strategy name (a str such as 'jit') or a "
            f"ciclo.Strategy, got {type(name).__name__}: {short(name)}."
        )
    try:
        return _REGISTRY[_normalize(name)]
    except KeyError:
        raise ValueError(
            f"Unknown strategy {name!r}; registered strategies: "
            f"{registered_strategies()}. Add one with ciclo.register_strategy."
        ) from None


def lookup(name: str) -> Strategy | None:
    """The strategy registered under `name`, or None (no error)."""
    return _REGISTRY.get(_normalize(name))


def strategy_of(state: Any) -> Strategy | None:
    """The strategy a managed state carries (`state.strategy`), or None for a
    state without one. A state that holds a registered name (as states did before
    they carried the object) gets the strategy registered under it.

    Example:
        >>> import ciclo, jax.numpy as jnp, optax
        >>> from ciclo import managed
        >>> from ciclo._strategies.registry import strategy_of
        >>> s = managed.ManagedState.create(params=jnp.zeros(2), tx=optax.sgd(0.1))
        >>> strategy_of(s) is ciclo.get_strategy("jit"), strategy_of(object())
        (True, None)
    """
    strategy = getattr(state, "strategy", None)
    if isinstance(strategy, str):
        return lookup(strategy)
    if isinstance(strategy, Strategy) or callable(getattr(strategy, "wrap", None)):
        return strategy  # (registered objects need not subclass Strategy)
    return None


def registered_name(strategy: Any) -> str | None:
    """The first name `strategy` (the object itself) is registered under, or None."""
    for key, value in _REGISTRY.items():
        if value is strategy:
            return key
    return None


def registered_strategies() -> list[str]:
    """The names of the registered strategies, sorted."""
    return sorted(_REGISTRY)
