"""The strategy registry: `register_strategy` and `get_strategy`."""

from __future__ import annotations

from ciclo._strategies.base import Strategy

__all__ = ["get_strategy", "register_strategy", "registered_strategies"]

_REGISTRY: dict[str, Strategy] = {}
_METHODS = ("from_host", "to_host", "lift_batch", "compile", "mean")
_METHODS += ("reduce_logs", "lower_logs")


def _normalize(name: str) -> str:
    return name.replace("-", "_")


def register_strategy(
    name: str, strategy: Strategy, *, overwrite: bool = False
) -> None:
    """Registers `strategy` under `name` (for `ManagedState.create(strategy=name)`).

    Args:
        name: the name (`"-"` and `"_"` are interchangeable).
        strategy: an object with the `Strategy` methods (usually a subclass
            instance); its `name` attribute is set to `name`.
        overwrite: replace a strategy already registered under `name`.

    Raises:
        ValueError: if `name` is taken and `overwrite` is False.
        TypeError: if `strategy` lacks a `Strategy` method.

    Example:
        >>> import ciclo
        >>> from ciclo import Strategy
        >>> ciclo.register_strategy("debug", Strategy("debug"), overwrite=True)
        >>> ciclo.get_strategy("debug")
        Strategy('debug')
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"A strategy name must be a non-empty str, got {name!r}.")
    missing = [m for m in _METHODS if not callable(getattr(strategy, m, None))]
    if missing:
        raise TypeError(
            f"Cannot register {strategy!r} as strategy {name!r}: it lacks "
            f"{missing}. Subclass ciclo.strategies.Strategy and override what differs."
        )
    key = _normalize(name)
    if key in _REGISTRY and not overwrite and _REGISTRY[key] is not strategy:
        raise ValueError(
            f"A strategy named {name!r} is already registered "
            f"({_REGISTRY[key]!r}); pass overwrite=True to replace it."
        )
    strategy.name = key
    _REGISTRY[key] = strategy


def get_strategy(name: str | Strategy) -> Strategy:
    """The strategy registered under `name` (a `Strategy` is returned as is).

    Raises:
        ValueError: for an unknown name; the message lists the registered ones.
        TypeError: if `name` is neither a str nor a strategy.

    Example:
        >>> import ciclo
        >>> ciclo.get_strategy("jit").name
        'jit'
    """
    if isinstance(name, Strategy):
        return name
    if not isinstance(name, str):
        raise TypeError(
            f"A strategy is given by name (a str such as 'jit'), got "
            f"{type(name).__name__}: {name!r}."
        )
    try:
        return _REGISTRY[_normalize(name)]
    except KeyError:
        raise ValueError(
            f"Unknown strategy {name!r}; registered strategies: "
            f"{registered_strategies()}. Add one with ciclo.register_strategy."
        ) from None


def registered_strategies() -> list[str]:
    """The names of the registered strategies, sorted."""
    return sorted(_REGISTRY)
