"""The `eager` strategy: runs the step as plain Python on one device (debugging)."""

from __future__ import annotations

from ciclo._strategies.base import Strategy

__all__ = ["Eager"]


class Eager(Strategy):
    """No compilation: the step runs op by op, so `print` and breakpoints work.

    Example:
        >>> import ciclo
        >>> ciclo.get_strategy("eager")
        Eager('eager')
    """

    def __init__(self, name: str = "eager"):
        super().__init__(name)
