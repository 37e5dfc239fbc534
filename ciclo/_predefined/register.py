"""Self-registration: which callbacks run on each named schedule of a loop."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ciclo._loop.callback import registered
from ciclo._loop.hooks import hooks_of
from ciclo._predefined.tables import Table, resolve
from ciclo._schedules.named import When, aliases_of


class Gated:
    """Callbacks of a `When` task key, kept in their place among a named schedule's
    callbacks; compiled to their own task key gated by the `When`."""

    def __init__(self, when: When, callbacks: list[Any]):
        self.when, self.callbacks = when, callbacks


def as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, list | tuple) else [value]


def register(table: Table, state: Any, tasks: Any, callbacks: Any):
    """Callbacks per named schedule: the state's class methods, then `tasks`, then
    the `callbacks` objects' attributes (on the loop's own names and
    `table.nested_hooks` only; in list order, those with a true `__loop_register_first__` first); and the ordinary
    `(schedule, callbacks)` pairs of `tasks`."""
    named: dict[str, list[Any]] = {name: [] for name in table.names}
    for name in table.names:
        for attribute in aliases_of(name):
            method = getattr(type(state), attribute, None)
            if callable(method) and all(method is not m for m in named[name]):
                named[name].append(method)
    if not isinstance(tasks, Mapping | None):
        raise TypeError(
            f"{table.loop}: `tasks` must be a dict {{schedule: callback_or_list}}, got "
            f"{type(tasks).__name__}. Example: {{ciclo.{table.step}: [step_fn]}}."
        )
    ordinary = []
    for key, value in (tasks or {}).items():
        if isinstance(key, str):
            named[resolve(table, key)].extend(as_list(value))
        elif isinstance(key, When):
            named[resolve(table, key.name)].append(Gated(key, as_list(value)))
        else:
            ordinary.append((key, value))
    first: dict[str, list[Any]] = {}
    later: dict[str, list[Any]] = {}
    hooks = {name: aliases_of(name) for name in table.hooks}
    for i, callback in enumerate(as_list(callbacks)):
        found = registered(callback, f"{table.loop}: callbacks[{i}]", hooks)
        # `__loop_register_first__`: a monitor that only adds entries to the step's
        # logs (`lr_monitor`), so the writers and bars beside it, in any order, see
        # them in the same step
        where = first if hooks_of(callback).first else later
        for name, methods in found.items():
            where.setdefault(name, []).extend(methods)
    for name in table.hooks:
        named[name] += [*first.get(name, ()), *later.get(name, ())]
    return named, ordinary
