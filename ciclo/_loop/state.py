"""`LoopState`, the loop's live record, and how a callback's output updates it.

`Apply` applies what a callback returns (`None`, logs, a state, or `(logs,
state)`): logs merged into the step's logs, a new state checked once against the
state the callback got and then taken.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from ciclo._entries import Entries
from ciclo._history.history import History
from ciclo._input.batch import Item
from ciclo._logs import Logs, _new_logs, same_entries
from ciclo._loop.callback import describe, split_output
from ciclo._time import Elapsed, new_elapsed
from ciclo._warn import warn

# an `Elapsed`'s fields as the History stores them (`LoopState._row`)
_ROW = operator.attrgetter("steps", "samples", "time", "date")
# `elapsed_after`'s (`LoopState._after_counts`)
_COUNTS = operator.attrgetter("steps", "samples", "date", "date_start")


def elapsed_at(row: tuple[int, int, float, float], start: float) -> Elapsed:
    """The `Elapsed` of a History row `(steps, samples, time, date)` whose
    clock started at `start` (the row's time is `date - start`)."""
    steps, samples, _, date = row
    return new_elapsed(steps, samples, date, start)


__all__ = [
    "Apply",
    "LoopState",
    "after_commit",
    "committed",
    "elapsed_at",
    "interrupted",
    "kept_states",
    "read_from",
]


class LoopState:
    """The loop's live record, passed to callbacks as their fourth argument.

    Read it during the call; the loop reuses it from batch to batch.

    Attributes:
        state: the current state (updated after every callback that returns one).
        batch: the current batch.
        elapsed: the `Elapsed` before the current batch.
        elapsed_after: the `Elapsed` counting the current batch (what the state
            has consumed once the batch's train step ran).
        history: the `History` being built.
        logs: this step's logs so far.
        accumulated_logs: every entry logged so far in this loop (this step's
            included), latest value per entry; a new `Logs` at each read.
        metadata: the `metadata` given to `loop`.
        stop_iteration: set it to True to end the loop right after the current
            callback (the batch's remaining callbacks do not run).
        error: while the end hooks (`__loop_end__`) run, the exception the loop
            is ending with; None on a normal end or a caught Ctrl-C.

    Example:
        >>> import ciclo
        >>> def stop_at_two(state, batch, elapsed, loop_state):
        ...     if loop_state.elapsed_after.steps == 2:
        ...         loop_state.stop_after_batch()  # the batch's other callbacks run
        >>> _, _, elapsed = ciclo.loop(None, range(10), {ciclo.every(1): stop_at_two})
        >>> elapsed.steps
        2
    """

    __slots__ = (
        "_after",
        "_after_commit",
        "_after_counts",
        "_borrowed",
        "_committed",
        "_data",
        "_elapsed",
        "_fresh",
        "_interrupted",
        "_nan_guard",
        "_row",
        "_shapes",
        "_start",
        "_table",
        "_unmerged",
        "batch",
        "error",
        "history",
        "logs",
        "metadata",
        "placed",
        "state",
        "stop_iteration",
        "stopping",
    )

    state: Any
    batch: Any
    history: History
    logs: Logs
    metadata: Any
    stop_iteration: bool
    stopping: bool  # stop_after_batch() was called
    error: BaseException | None
    placed: Item | None
    _committed: Logs
    _borrowed: Logs | None
    _fresh: Logs | None
    _data: Any
    _after_commit: list[Callable[..., None]]
    _nan_guard: Any
    _interrupted: bool
    _shapes: tuple[Any, Any]  # (the batch, its leaf shapes), set by `Run`
    # `elapsed`, or None while it is not built (set by `Run`): then `_row`
    # (steps, samples, time, date, the History's) and `_start` are its fields;
    # `_row` is `elapsed`'s in any case
    _elapsed: Elapsed | None
    _row: tuple[int, int, float, float]
    _start: float
    # `elapsed_after`, or None while it is not built: then `_after_counts`
    # (steps, samples, date, date_start) are its fields (set by `Run`)
    _after: Elapsed | None
    _after_counts: tuple[int, int, float, float]

    def __init__(
        self,
        state: Any,
        batch: Any,
        elapsed: Elapsed,
        elapsed_after: Elapsed,
        history: History,
        logs: Logs,
        metadata: Any,
    ) -> None:
        self.state, self.batch = state, batch
        self.elapsed, self.elapsed_after = elapsed, elapsed_after
        self._start = 0.0
        self.history, self.logs, self.metadata = history, logs, metadata
        self._committed = Logs()
        self._unmerged = []  # committed steps' logs not merged into it yet
        self._borrowed = None  # a callback's Logs taken as the batch's logs
        self._fresh = None  # a Logs made for the loop alone (`hand_over`)
        self._data = None  # the iterator the batches come from
        self._after_commit = []  # run once the step's row is committed
        self._nan_guard = None  # a `nan_guard` running in this loop
        self._interrupted = False  # Ctrl-C ended the loop (set for the end hooks)
        self._shapes = (None, None)  # the batch's shapes, for the shape watch
        self._table = None  # the loop's `HookTable` (its kept objects' states)
        self.stop_iteration = False
        self.stopping = False  # stop_after_batch() was called
        self.error = None  # what the loop is ending with
        # the batch's `ciclo._input.batch.Item` from the input stage: a managed
        # step takes its placed copy (if any) instead of placing the batch again
        self.placed = None

    @property
    def elapsed(self) -> Elapsed:
        """The `Elapsed` before the current batch; the loop builds it at the
        first read in a batch (most batches nothing reads it)."""
        if self._elapsed is None:
            self._elapsed = elapsed_at(self._row, self._start)
        return self._elapsed

    @elapsed.setter
    def elapsed(self, value: Elapsed) -> None:
        self._elapsed, self._row = value, _ROW(value)

    @property
    def elapsed_after(self) -> Elapsed:
        """The `Elapsed` counting the current batch; the loop builds it at the
        first read in a batch (most batches nothing reads it)."""
        after = self._after
        if after is None:
            steps, samples, date, start = self._after_counts
            after = self._after = new_elapsed(steps, samples, date, start)
        return after

    @elapsed_after.setter
    def elapsed_after(self, value: Elapsed) -> None:
        self._after, self._after_counts = value, _COUNTS(value)

    @property
    def accumulated_logs(self) -> Logs:
        return Logs(committed(self)).merge(self.logs)

    def data_state(self) -> Any:
        """The position of the data after the current batch, when the batches come
        from a checkpointable iterator (`get_state()`/`set_state()`, as Grain's):
        its `get_state()`; else None. `ciclo.checkpoint` saves it, and a resumed
        run hands it to the new iterator's `set_state` instead of skipping."""
        get_state = getattr(self._data, "get_state", None)
        return None if get_state is None else get_state()

    def stop_after_batch(self) -> None:
        """Ends the loop at the end of the current batch: the batch's remaining
        callbacks still run and its logs are committed. Called from `on_start`, it
        ends the loop before the first batch."""
        self.stopping = True

    def __repr__(self) -> str:
        return (
            f"LoopState(elapsed.steps={self.elapsed.steps}, "
            f"stop_iteration={self.stop_iteration}, stopping={self.stopping})"
        )


def read_from(ls: LoopState, data: Any) -> None:
    """Makes `ls.data_state()` read the position of `data`, the input stage the
    loop's batches come from (`ciclo._input.stage.Inputs`)."""
    ls._data = data


def after_commit(ls: LoopState | Any, action: Callable[..., None]) -> bool:
    """Runs `action()` once the loop committed the current step's row (after the
    batch's last callback; a step that does not count drops it). When a later
    callback of the batch raises, `action(row=(elapsed, logs))` runs instead,
    with the step's row as it is (not committed). `action.where` names it if it
    raises. False when `ls` is not a loop's (`action` not taken)."""
    pending = getattr(ls, "_after_commit", None)
    if pending is None:
        return False
    pending.append(action)
    return True


def interrupted(ls: LoopState, value: bool | None = None) -> bool:
    """Whether Ctrl-C (KeyboardInterrupt) ended `ls`'s loop, which the loop sets
    (`value`) before its end hooks run; they read it."""
    if value is not None:
        ls._interrupted = value
    return ls._interrupted


def committed(ls: LoopState) -> Logs:
    """The logs `ls`'s loop committed so far (latest value per entry), which
    `accumulated_logs` reads. The loop notes each committed step's logs
    (`_unmerged`) and they are merged in here, when read (or every 256 steps)."""
    merged, unmerged = ls._committed, ls._unmerged
    if unmerged:
        _fold(merged, unmerged)
        unmerged.clear()
    return merged


def kept_states(ls: LoopState | Any) -> dict[str, Any] | None:
    """The states of `ls`'s loop's objects that checkpoints keep (their
    `__loop_state__`, e.g. `early_stopping`'s), or None (none, or not a loop's)."""
    table = getattr(ls, "_table", None)
    return None if table is None else table.states()


def hand_over(ls: LoopState | Any, logs: Logs) -> None:
    """Tells `ls`'s loop that `logs` was made for it alone (a compiled call's
    outputs, built afresh for the loop, as a managed step's): taken as the
    batch's logs, other callbacks' entries are added to it in place instead of
    to a copy. No effect on anything but a loop's state."""
    if type(ls) is LoopState:
        ls._fresh = logs


def log_entry(ls: LoopState, collection: str, name: str, value: Any) -> None:
    """Adds one entry to the batch's logs, as a callback returning
    `Logs({collection: {name: value}})` would (entries merged in order, the
    newest winning), without a `Logs` of its own: an observer's per-step value
    (`lr_monitor`). A callback's own `Logs` taken as the batch's is copied
    first (never changed)."""
    logs = ls.logs
    if type(logs) is not Logs:  # a callback set `ls.logs` itself
        ls.logs = Logs(logs).merge({collection: {name: value}})
        return
    if logs is ls._borrowed:
        logs = ls.logs = _copy(logs)
    entries = logs.get(collection)
    if type(entries) is Entries:
        entries[name] = value
    elif entries is None:
        logs[collection] = Entries({name: value})
    else:  # a collection that is not `Entries` (set by hand): merged as usual
        logs.merge({collection: {name: value}})


def _copy(logs: Logs) -> Logs:
    """A copy of a callback's `Logs` (its collections copied, not its values):
    `Logs(logs)`, written out for the common `Entries` collections."""
    out = _new_logs(Logs)
    for collection, entries in logs.items():
        if type(entries) is not Entries:
            return Logs(logs)
        out[collection] = Entries(entries)
    declared = logs._aggregations
    if declared:
        out._aggregations = dict(declared)
    return out


_DECLARED = operator.attrgetter("_aggregations")


def _fold(merged: Logs, unmerged: list[Any]) -> None:
    """Merges the `unmerged` logs into `merged`, in order: only the newest value of
    each entry is copied (the logs are read newest first; one whose entries were
    all seen is skipped with a set comparison)."""
    groups = same_entries(unmerged) if set(map(type, unmerged)) == {Logs} else None
    if groups is not None:  # the common case: every step logged the same entries
        newest: dict[str, dict[str, Any]] = {c: {} for c in unmerged[-1]}
        for collection, name, values in groups:
            newest[collection][name] = values[-1]
        if any(map(_DECLARED, unmerged)):
            for logs in unmerged:
                declared = logs._aggregations
                if declared:
                    merged._aggregations = {**(merged._aggregations or {}), **declared}
        merged.merge(newest)
        return
    newest = {}
    try:  # committed logs: their collections are mappings (the commit read them)
        for logs in reversed(unmerged):
            for collection, entries in logs.items():
                seen = newest.get(collection)
                if seen is None:
                    newest[collection] = dict(entries)
                elif not entries.keys() <= seen.keys():
                    for name, value in entries.items():
                        seen.setdefault(name, value)
    except (AttributeError, TypeError, ValueError):  # changed since
        for each in unmerged:  # merge's own error, in order
            merged.merge(each)
        return
    for logs in unmerged:
        declared = getattr(logs, "_aggregations", None)
        if declared:
            merged._aggregations = {**(merged._aggregations or {}), **declared}
    merged.merge(newest)


_NUMERIC = (int, float, complex, np.generic, np.ndarray, jax.Array)


def _check_state(new: Any, old: Any, callback: Any) -> None:
    """The first state a callback returns must be a state: a callback that returns
    a bare number or array for a structured state (e.g. an `eval_step` returning
    its accuracy) would silently replace the state with it."""
    if old is None or type(new) is type(old):
        return
    if isinstance(old, _NUMERIC) and not isinstance(new, str | bytes):
        return  # a number state may become an array (or anything but text)
    if isinstance(new, type(old)) or isinstance(old, type(new)):
        return
    if isinstance(new, Mapping) and isinstance(old, Mapping):
        return
    what = (
        f"an array of shape {tuple(new.shape)}"
        if hasattr(new, "shape") and hasattr(new, "dtype")
        else f"a {type(new).__name__}"
    )
    if isinstance(new, (*_NUMERIC, str)):
        raise TypeError(
            f"Callback {describe(callback)} returned {what} where the state (a "
            f"{type(old).__name__}) was expected, so it would replace the state. "
            f"To log a value return logs, e.g. ciclo.logs().add_metric('accuracy', "
            f"value), or (logs, state); return None or (logs, None) to keep the "
            f"state."
        )
    warn(
        f"Callback {describe(callback)} returned {what} as the new state, which "
        f"was a {type(old).__name__}; the loop continues with it. If it is not a "
        f"state, return logs or (logs, None) instead."
    )


def _check_pair(output: tuple, old: Any, callback: Any) -> None:
    """A 2-tuple `(dict, other)` is read as `(logs, state)`. When the state is
    itself a pair that `output` matches (e.g. `(params_dict, opt_state)`) and
    `other` does not, the callback most likely returned its new tuple state bare:
    reading it as logs would log the params and make `opt_state` the state."""
    if type(old) is not tuple or len(old) != 2:
        return
    structure = jax.tree.structure
    if structure(output) == structure(old) and structure(output[1]) != structure(old):
        raise TypeError(
            f"Callback {describe(callback)} returned ({type(output[0]).__name__}, "
            f"{type(output[1]).__name__}), which has the structure of the state (a "
            f"pair). Read as (logs, state) it would log the first element and make "
            f"the second the state; read as the new state it would be a tuple "
            f"state. Return (None, state) for a tuple state, or (logs, state) with "
            f"logs from ciclo.logs()."
        )


class Apply:
    """Applies a callback's output to the loop state; checks the first state it
    returns against the state it got, and a first `(dict, other)` pair against a
    pair state (once per callback, never per step).

    `fresh`: the callback returns new objects at every call (a `jax.jit`
    function, whose output pytrees are rebuilt from its outputs), so its `Logs`
    is the loop's alone, as a managed step's (`hand_over`): entries added later
    join it in place."""

    __slots__ = ("callback", "checked", "fresh", "paired", "where")

    def __init__(self, callback: Any, where: str, fresh: bool = False):
        self.callback, self.where, self.checked = callback, where, False
        self.paired, self.fresh = False, fresh

    def __call__(self, output: Any, ls: LoopState) -> None:
        if type(output) is tuple and len(output) == 2 and self.paired:
            logs, state = output  # a step's (logs, state), the first logs of its
            if (  # batch (the common case: what the general path below does)
                type(logs) is Logs
                and logs
                and not ls.logs
                and (state is None or (self.checked and not isinstance(state, Logs)))
            ):
                if self.fresh or logs is ls._fresh:
                    ls.logs, ls._fresh = logs, None
                else:
                    ls.logs = ls._borrowed = logs
                if state is not None:
                    ls.state = state
                return
        if output is None:
            return
        callback = self.callback
        if not self.paired and type(output) is tuple:
            self.paired = True
            first = output[0] if len(output) == 2 else None
            if isinstance(first, Mapping) and not isinstance(first, Logs):
                _check_pair(output, ls.state, callback)
        kind = type(output)
        if kind is Logs:  # the common outputs first, as split_output reads them
            logs, state = output, None
        elif (
            kind is tuple
            and len(output) == 2
            and type(output[0]) is Logs
            and not isinstance(output[1], Logs)
        ):  # a step's (logs, state)
            logs, state = output
        else:
            logs, state = split_output(output, callback)
        if logs:
            target = ls.logs
            if not target and type(logs) is Logs:
                # the batch's first logs are taken as they are, copied only if
                # another callback's logs are merged in (the callback's object
                # is never changed), unless made for the loop alone
                if self.fresh or logs is ls._fresh:
                    ls.logs, ls._fresh = logs, None
                else:
                    ls.logs = ls._borrowed = logs
                logs = None
            elif target is ls._borrowed:
                target = ls.logs = _copy(target)
        if logs:
            try:
                target.merge(logs)
            except TypeError as error:
                raise TypeError(
                    f"Callback {describe(callback)} returned logs that are not a "
                    f"dict of collections to entries ({error}). Build them with "
                    f"ciclo.logs().add_loss/add_metric(...), or return (None, "
                    f"state) when the first element is a state."
                ) from None
        if state is not None:
            if not self.checked:
                self.checked = True
                _check_state(state, ls.state, callback)
            ls.state = state
