"""The callback protocol, and the one adapter that turns a callback into a runner.

A callback is any callable `f(state, batch, elapsed, loop_state)` that declares as
many of those leading positional parameters as it needs. It returns `None`, a
`Logs`, a state, or a 2-tuple `(logs_or_None, state_or_None)`. An object with
`__loop_callback__(loop_state)` is called that way instead, and an object with
`__loop_end__(loop_state)` has it called once when the loop ends, on every exit
path (the hooks are read by `ciclo._loop.hooks`). A callback stops the loop by setting `loop_state.stop_iteration = True`
(after the current callback) or calling `loop_state.stop_after_batch()` (at the end
of the current batch). `loop`, the managed steps and the Flax state all read
callbacks through this module.

An object whose hooks never read `loop_state.batch` says so with a class attribute
`reads_batch = False` (ciclo's bars, writers, guards and checkpoints; a subclass
that overrides a hook outside ciclo is taken to read it): when no callback reads
the batch after the epoch-end check, the loop does not copy it before reading the
next one (`ciclo._loop.runners.reads_batch_after_pass_end`). A function reads it
when it declares `batch`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from ciclo._logs import Logs
from ciclo._loop.hooks import hooks_of
from ciclo._short import short

__all__ = [
    "ARGUMENTS",
    "arity",
    "describe",
    "inject",
    "observer",
    "registered",
    "split_output",
    "uncalled",
]

ARGUMENTS = ("state", "batch", "elapsed", "loop_state")


def describe(obj: Any) -> str:
    """A short name for `obj` in error messages."""
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    return name if name else f"{type(obj).__name__} object"


def uncalled(callback: Any) -> str | None:
    """`"ciclo.keras_bar"` for a callback class (or a ciclo callback factory such
    as `ciclo.early_stopping`) given where a callback is expected, without the
    call that builds one; None for anything else.

    A class counts when its instances are callbacks: it defines `__call__` or a
    loop hook (`__loop_callback__`, `__loop_end__`, ...).
    """
    import ciclo  # loaded by now: a loop runs

    if isinstance(callback, type):
        if not (
            hooks_of(callback).present
            or hasattr(callback, "default_schedule")  # a loop element
            or any("__call__" in vars(k) for k in callback.__mro__[:-1])
        ):
            return None
    elif not (
        inspect.isfunction(callback)
        and getattr(callback, "__module__", "").startswith("ciclo.callbacks.")
        and getattr(ciclo, callback.__name__, None) is callback
    ):
        return None
    name = callback.__name__
    return f"ciclo.{name}" if getattr(ciclo, name, None) is callback else name


def observer(method: Callable[..., None]) -> Callable[..., None]:
    """Marks a `__loop_callback__` that always returns None (an observer's:
    writers, bars, `lr_monitor`): the loop calls it as the runner itself, with no
    output to look at. A subclass that overrides the method is not marked.

    Example:
        >>> from ciclo._loop.callback import observer
        >>> class Counter:
        ...     calls = 0
        ...     @observer
        ...     def __loop_callback__(self, loop_state):
        ...         self.calls += 1
        >>> Counter.__loop_callback__.observes_only
        True
    """
    method.observes_only = True  # type: ignore[attr-defined]
    return method


def registered(
    callback: Any, where: str, hooks: Mapping[str, tuple[str, ...]]
) -> dict[str, list[Any]]:
    """The methods a `callbacks=[...]` object registers on a predefined loop: per
    named schedule in `hooks`, its attributes of the names given there (the
    schedule's name, then its aliases), in that order.

    Raises:
        TypeError: for a class (not built yet), or an object with none of them
            (a factory not called, a plain function), naming the fix.
    """
    if inspect.isclass(callback):
        raise TypeError(
            f"{where} is the class {callback.__name__}, not a callback: build one "
            f"first, e.g. {callback.__name__}(...)."
        )
    found: dict[str, list[Any]] = {}
    for name, attributes in hooks.items():
        for attribute in attributes:
            method = getattr(callback, attribute, None)
            if method is not None:
                found.setdefault(name, []).append(method)
    if not found:
        hint = (
            f" Did you pass the factory without calling it? Use "
            f"{getattr(callback, '__name__', 'it')}(...)."
            if inspect.isfunction(callback)
            else ""
        )
        raise TypeError(
            f"{where} ({short(callback, 60)}) has no attribute named like a named "
            f"schedule of that loop ({list(hooks)}), so it cannot register "
            f"itself.{hint} Otherwise put it in `tasks` with a schedule, e.g. "
            f"{{ciclo.every(1): [callback]}}."
        )
    return found


def arity(f: Callable[..., Any], where: str, most: int = len(ARGUMENTS)) -> int:
    """How many leading positional arguments `f` takes (at most `most`).

    Raises:
        TypeError: if `f`'s signature cannot be read, or `f` requires more
            arguments than a callback gets.
    """
    try:
        parameters = inspect.signature(f).parameters.values()
    except (TypeError, ValueError) as error:
        raise TypeError(
            f"{where} ({describe(f)}): cannot read its signature ({error}), so "
            f"ciclo cannot tell which of {ARGUMENTS[:most]} to pass. Wrap it in a "
            f"function, e.g. lambda state, batch: f(state, batch)."
        ) from None
    count = required = 0
    for p in parameters:
        if p.kind == p.VAR_POSITIONAL:
            return most
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            count += 1
            required += p.default is p.empty
        elif p.kind == p.KEYWORD_ONLY and p.default is p.empty:
            required = most + 1
    if required > most:
        given = (
            f"it is called with the first N of {ARGUMENTS[:most]}"
            if most
            else "it cannot be called without arguments"
        )
        raise TypeError(
            f"{where} ({describe(f)}) requires more arguments than it gets: {given}; "
            f"give its other parameters defaults or bind them with functools.partial."
        )
    return min(count, most)


def inject(f: Callable[..., Any], *args: Any) -> Any:
    """Calls `f` with the first N of the arguments, N being the positional
    parameters it accepts (those with defaults counted; bound methods and callable
    objects without `self`; all of them for `*args`), as the loop calls callbacks.

    As in Ciclo 0.1, `inject(f)` returns that caller: `inject(f)(*args)`; given
    arguments, `inject(f, *args)` calls at once.

    Raises:
        TypeError: when called, if `f` requires more arguments than it is given,
            or has no readable signature.

    Example:
        >>> import ciclo
        >>> ciclo.inject(lambda state, batch: state + batch)(1, 2, "unused")
        3
        >>> ciclo.inject(lambda state, batch=10: state + batch, 1, 2, "unused")
        3
    """
    if not callable(f):
        raise TypeError(
            f"ciclo.inject: `f` must be callable, got {short(f)} ({type(f).__name__})."
        )
    if args:
        return f(*args[: arity(f, "ciclo.inject", len(args))])

    @functools.wraps(f)
    def injected(*args: Any) -> Any:
        return f(*args[: arity(f, "ciclo.inject", len(args))])

    return injected


def split_output(output: Any, callback: Any) -> tuple[Logs | None, Any]:
    """A callback's return value as `(logs_or_None, state_or_None)`.

    Raises:
        TypeError: for a tuple that is not a pair, or a pair whose first element is
            not logs or whose second is a `Logs` (a swapped `(state, logs)`, or
            `(logs, logs)`: a `Logs` is never taken as the new state).
    """
    if output is None:
        return None, None
    if type(output) is tuple:
        if len(output) != 2:
            raise TypeError(
                f"Callback {describe(callback)} returned a tuple of length "
                f"{len(output)} ({', '.join(type(o).__name__ for o in output)}); "
                f"expected None, a Logs, a state, or a 2-tuple (logs_or_None, "
                f"state_or_None). To return a tuple state, return (None, state)."
            )
        logs, state = output
        if isinstance(state, Logs):
            if isinstance(logs, Logs):
                raise TypeError(
                    f"Callback {describe(callback)} returned (Logs, Logs): the "
                    f"second element is taken as the new state, and a Logs is not "
                    f"a state. Return (logs, state), or (logs, None) to keep the "
                    f"state; merge two Logs with logs.merge(other)."
                )
            raise TypeError(
                f"Callback {describe(callback)} returned ({type(logs).__name__}, "
                f"Logs): the logs come first. Return (logs, state)."
            )
        if logs is not None and not isinstance(logs, Mapping):
            raise TypeError(
                f"Callback {describe(callback)} returned a 2-tuple whose first "
                f"element is a {type(logs).__name__}; expected (logs_or_None, "
                f"state_or_None). To return a tuple state, return (None, state)."
            )
        return logs, state
    if isinstance(output, Logs):
        return output, None
    return None, output
