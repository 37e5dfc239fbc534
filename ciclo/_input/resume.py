"""Resuming a loop: the `__loop_resume__` hook and where the data starts.

An object among a loop's callbacks (or the owner of a bound method among them) with
`__loop_resume__(state, history, elapsed)` is asked, before the loop starts, for
the `(state, history, elapsed)` to start from; it returns None to leave them as
they are (`ciclo.checkpoint(directory, resume=True)` restores the latest complete
checkpoint of its directory, once). The dataset is then positioned at the start
step: a factory `dataset(start_step)` is called with it, and a plain iterable is
advanced past the batches the restored state already consumed (`read_back`, with
a warning giving the count: those batches are read and discarded; the loop runs it
inside its interrupt handling, so Ctrl-C ends it as it ends training). Last, objects with `__loop_start__(elapsed)`
are told the elapsed the loop starts from (None: step 0), after any restore: the
writers keep an earlier run's rows below it and replace those from it on. A
restored run with nothing left to train (a finished run's command run again, e.g.
a notebook cell) says so (`nothing_left`).

This module imports nothing heavy; the checkpoint callback brings orbax.
"""

from __future__ import annotations

import base64
import inspect
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ciclo._history.history import History
from ciclo._interrupts import preempted
from ciclo._short import short
from ciclo._time import Elapsed
from ciclo._warn import warn

if TYPE_CHECKING:
    from ciclo._loop.hooks import HookTable

__all__ = [
    "Start",
    "checkpointable",
    "data_state_from_json",
    "data_state_to_json",
    "is_factory",
    "nothing_left",
    "position",
    "prepare",
    "read_back",
]


class Start(NamedTuple):
    """Where a resumed run's data starts: the batches the restored state already
    consumed, the data iterator's saved state (None when none was saved), and
    where the state was restored from (a checkpoint's directory; None: not
    restored)."""

    batches: int = 0
    data: Any = None
    source: str | None = None


def checkpointable(iterator: Any) -> bool:
    """An iterator that can save and restore its position: `get_state()` and
    `set_state(state)`, as Grain's `DatasetIterator` (a dict state) and
    `DataLoader` iterators (a bytes state)."""
    return callable(getattr(iterator, "get_state", None)) and callable(
        getattr(iterator, "set_state", None)
    )


def data_state_to_json(state: Any) -> Any:
    """A data iterator's state as JSON: numpy numbers as Python ones, bytes as a
    `{"__bytes__": base64}` object."""
    if isinstance(state, bytes):
        return {"__bytes__": base64.b64encode(state).decode("ascii")}
    if isinstance(state, Mapping):
        return {str(k): data_state_to_json(v) for k, v in state.items()}
    if isinstance(state, list | tuple):
        return [data_state_to_json(v) for v in state]
    if isinstance(state, np.generic | np.ndarray):
        return state.tolist()
    return state


def data_state_from_json(obj: Any) -> Any:
    """The inverse of `data_state_to_json` (lists stay lists)."""
    if isinstance(obj, Mapping):
        if set(obj) == {"__bytes__"}:
            return base64.b64decode(obj["__bytes__"])
        return {k: data_state_from_json(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [data_state_from_json(v) for v in obj]
    return obj


def prepare(
    table: HookTable,
    groups: Iterable[Any],
    state: Any,
    history: History | None,
    elapsed: Any,
) -> tuple[Any, History | None, Any, Start]:
    """Runs the resume hooks, then the start hooks, of the callbacks in `groups`
    (lists or single ones; read through the loop's `table`, then `prepared`).

    A hook returns None, `(state, history, elapsed)`, or with a fourth element
    the data iterator's saved state, and a fifth the saved states of the objects
    checkpoints keep (`__loop_state__`), given back to their `__loop_restore__`.

    Returns:
        `(state, history, elapsed, start)`: `start.batches` is how many batches of
        a plain iterable dataset the restored state already consumed (0 when no
        hook restored anything), `start.data` the saved iterator state, if any.
    """
    table.prepared = True
    owners = table.owners(groups)
    table.kept = table.keyed(groups)
    start = Start()
    kept = None  # the saved states of the objects checkpoints keep
    for owner, hooks in owners:
        if hooks.resume is None:
            continue
        restored = hooks.resume(state, history, elapsed)
        if restored is None:
            continue
        before = 0 if elapsed is None else int(elapsed.steps)
        state, history, elapsed, *extra = restored
        source = getattr(owner, "directory", None)
        start = Start(
            max(0, int(elapsed.steps) - before),
            extra[0] if extra else None,
            short(owner, 80) if source is None else str(source),
        )
        kept = extra[1] if len(extra) > 1 else None
    if kept:
        for key, hooks in table.kept:
            if hooks.restore is not None and key in kept:
                hooks.restore(kept[key])
    for _, hooks in owners:
        if hooks.start is not None:
            hooks.start(elapsed)
    return state, history, elapsed, start


def nothing_left(where: str, start_at: Start, elapsed: Elapsed) -> None:
    """Warns that the run restored from `start_at.source` at `elapsed` trained
    nothing: the restored state, not the one passed in, is what the loop returns."""
    warn(
        f"{where}: restored from {start_at.source!r} at step {elapsed.steps}, and "
        f"there is nothing left to train: that run already reached its end (its "
        f"`stop` or `epochs`, or the end of `dataset`). The restored state, "
        f"history and elapsed are returned as they were saved; the state passed "
        f"in (e.g. with an edited model or learning rate) is not used. To start "
        f"fresh, pass a new directory or resume=False; to train further, give a "
        f"later `stop` (or more epochs or data)."
    )


def is_factory(dataset: Any) -> bool:
    """A dataset given as `dataset(start_step) -> iterable` (callable, not iterable)."""
    return callable(dataset) and not isinstance(dataset, Iterable)


def position(
    dataset: Any, elapsed: Elapsed | None, start_at: Start, where: str, stacklevel: int
) -> Any:
    """The data from the start step: a factory called with `elapsed.steps`; a
    checkpointable iterator (Grain's) given the saved state; else a plain iterable
    advanced by `start.batches` batches (`read_back`, with a warning; the warning
    points `stacklevel` frames up)."""
    skip = start_at.batches
    start = 0 if elapsed is None else int(elapsed.steps)
    if is_factory(dataset):
        try:
            inspect.signature(dataset).bind(start)
        except TypeError as error:
            raise TypeError(
                f"{where}: `dataset` is callable but not iterable, so it is taken "
                f"as a factory `dataset(start_step) -> iterable of batches` and "
                f"called with the step to start from; but {short(dataset, 80)} cannot "
                f"be called with one argument ({error}). Pass an iterable, or a "
                f"function such as `lambda start_step: batches[start_step:]`."
            ) from None
        except ValueError:  # no signature (some builtins): trust it
            pass
        return dataset(start)
    if skip <= 0 or not isinstance(dataset, Iterable):
        return dataset
    if start_at.data is not None:
        iterator = iter(dataset)
        if checkpointable(iterator):
            iterator.set_state(data_state_from_json(start_at.data))
            return iterator
        dataset = iterator  # the state was saved by another kind of data: skip
    if isinstance(dataset, Sequence | np.ndarray):  # indexable: nothing is consumed
        return (dataset[i] for i in range(skip, len(dataset)))
    iterator = iter(dataset)
    read_back(iterator, skip, start, where, stacklevel + 1)
    return iterator


def read_back(
    iterator: Any, skip: int, start: int, where: str, stacklevel: int, say=True
) -> bool:
    """Reads and discards the first `skip` batches of `iterator` (those a resumed
    run already consumed), saying so first in one warning with the count (with
    `say`; it points at the user's line whatever `stacklevel`). Ctrl-C interrupts it as it would a step (the loop then ends cleanly);
    a preemption (SIGTERM) ends it early (the loop then stops before its first
    step). Returns whether all `skip` were read."""
    if say and skip > 0:
        warn(
            f"{where}: resuming at step {start}: skipping the first {skip} batches "
            f"of `dataset` by reading and discarding them (this consumes them, and "
            f"takes as long as loading them). To start there directly, pass a "
            f"factory `dataset(start_step) -> iterable` instead, e.g. "
            f"`lambda start_step: make_batches(start=start_step)`."
        )
    end = object()
    read = 0
    while read < skip and not preempted() and next(iterator, end) is not end:
        read += 1
    return read == skip
