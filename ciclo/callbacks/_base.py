"""The callback protocol.

A callback is any callable `f(state, batch, elapsed, loop_state)` (declaring as many
of those leading positional parameters as it needs) returning `None`, a `Logs`, a
state, or a 2-tuple `(logs_or_None, state_or_None)`. An object with
`__loop_callback__(loop_state) -> (logs, state)` is called that way instead.

A `LoopElement` is a callback that knows its own schedule, so it can be spread into a
task dict: `{**ciclo.keras_bar(total=100)}` is `{ciclo.every(1): [bar]}`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LoopElement"]


class _OnInstances:
    """A method of callback instances; read from the class (`{**ciclo.keras_bar}`,
    the class not called) it raises an error that names the fix."""

    def __init__(self, method: Any):
        self.method = method

    def __get__(self, obj: Any, cls: type) -> Any:
        if obj is not None:
            return self.method.__get__(obj, cls)
        import ciclo

        name = cls.__name__
        name = f"ciclo.{name}" if getattr(ciclo, name, None) is cls else name

        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise TypeError(
                f"{{**{name}}} spreads the class {name}, not a callback: build one "
                f"first, e.g. {{**{name}(...)}}."
            )

        return refuse


class LoopElement:
    """Mixin for callbacks that can be spread with `**` into a loop's task dict.

    Subclasses may override `default_schedule()` (default: every step).

    Example:
        >>> import ciclo
        >>> class Printer(ciclo.callbacks.LoopElement):
        ...     def __call__(self, state, batch, elapsed):
        ...         print(elapsed.steps)
        >>> _ = ciclo.loop(None, range(2), {**Printer()})
        0
        1
    """

    def default_schedule(self) -> Any:
        from ciclo._schedules import every

        return every(1)

    @_OnInstances
    def keys(self) -> list[Any]:
        return [self.default_schedule()]

    def __getitem__(self, key: Any) -> list[Any]:
        return [self]
