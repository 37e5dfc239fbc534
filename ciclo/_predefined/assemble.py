"""A predefined loop's table of named schedules laid out as an ordinary task dict
(with `on_start` and `on_end`), and run as one `ciclo.loop` call.

Each named schedule becomes a `Place` key (a `When` gate splits its callbacks into
runs behind their schedule); the epoch's places carry the epoch end.
"""

from __future__ import annotations

import warnings
from typing import Any

from ciclo._loop.loop import EmptyDataWarning, loop
from ciclo._predefined.register import Gated, as_list
from ciclo._predefined.tables import TASKS, Table
from ciclo._schedules.named import Place, aliases_of

__all__ = ["compile_table", "run_table"]


def _keys(name, callbacks, **where) -> list[tuple[Place, list[Any]]]:
    """A named schedule's callbacks as task-dict entries, in their order: the runs
    of plain callbacks, and each `When` key's callbacks behind their gate."""
    entries, plain = [], []
    for callback in callbacks:
        if isinstance(callback, Gated):
            if plain:
                entries.append((Place(name, **where), plain))
                plain = []
            entries.append(
                (Place(name, when=callback.when, **where), callback.callbacks)
            )
        else:
            plain.append(callback)
    if plain:
        entries.append((Place(name, **where), plain))
    return entries


def compile_table(table: Table, named, ordinary, epoch=None, builtin=None):
    """The table laid out as `ciclo.loop` arguments: (tasks, on_start, on_end).
    `builtin` holds the callbacks of the loop's own places (`NESTED`, ...)."""
    callbacks = {**named, **(builtin or {})}
    tasks: dict[Any, Any] = {}
    begins = [n for n in table.epoch_begin if callbacks[n]]
    for name in begins:
        tasks.update(_keys(name, callbacks[name], epoch=epoch, begin=True))
    for name in table.batch:
        if name == TASKS:
            tasks.update((k, v) for k, v in ordinary if as_list(v))
        else:
            tasks.update(_keys(name, callbacks.get(name, [])))
    for name in table.epoch:
        tasks.update(_keys(name, callbacks.get(name, []), epoch=epoch))
    if begins:  # the epoch end is decided on every batch
        tasks[Place("<epoch end>", epoch)] = []
    for name in table.batch_end:
        tasks.update(_keys(name, callbacks[name]))
    ends = [(n, cb) for n in (*table.start, *table.end) for cb in callbacks[n]]
    for name, callback in ends:
        if isinstance(callback, Gated):
            raise TypeError(
                f"{table.loop}: {callback.when!r} gates `{name}`, which runs once; "
                f"only the per-batch named schedules (e.g. ciclo.on_epoch_end) can be "
                f"combined with a schedule. Use `{name}` alone."
            )
    on_start = [cb for name in table.start for cb in callbacks[name]]
    on_end = [cb for name in table.end for cb in callbacks[name]]
    return tasks, on_start, on_end


def run_table(table: Table, state, dataset, named, ordinary, **loop_kwargs):
    per_batch = (n for n in (*table.batch, *table.batch_end) if n != TASKS)
    if not ordinary and not any(named[n] for n in per_batch):
        step = aliases_of(table.step)[-1]
        raise ValueError(
            f"{table.loop}: nothing runs on `{table.step}` (nor on any other "
            f"per-batch schedule), so the loop would do nothing: give the state a "
            f"`{step}` method or pass "
            f"tasks={{ciclo.{table.step}: [{step}]}}."
        )
    tasks, on_start, on_end = compile_table(table, named, ordinary)
    with warnings.catch_warnings():  # each predefined loop says it its own way
        warnings.simplefilter("ignore", EmptyDataWarning)
        return loop(
            state, dataset, tasks, on_start=on_start, on_end=on_end, **loop_kwargs
        )
