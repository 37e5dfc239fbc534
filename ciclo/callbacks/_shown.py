"""`Shown`: the values a progress bar shows, read from the run's `History`.

A bar makes no transfer of its own: the History is the run's one device-to-host
stream. At each redraw the bar moves the stream on without waiting
(`History.poll`) and shows, per entry, the newest value already on the host; a
value the current step logged as a host number (a Python float, a numpy scalar)
is shown at once. A device value the step logged is shown once the history has
brought its row to the host: a redraw or a few later, never waited for. When the
bar closes, the current step's device values are read waiting for them
(`History.wait_for`: one sync, at the end). Used by hand, a bar commits each
call's logs to a History of its own, read the same way.

Each step only hands the bar its logs (a loop's bar costs a few bytecodes a
step between redraws). The names shown, first logged first, are noted when values
are read: those of the history's columns (each column's first row is where its
name was first logged; within one row, losses before metrics) and the current
step's.
"""

from __future__ import annotations

from collections.abc import KeysView, Mapping
from typing import Any

import jax

from ciclo._history.history import History
from ciclo._logs import SHOWN_COLLECTIONS
from ciclo.callbacks._rows import host_scalar

__all__ = ["Shown", "number"]

# a shown collection -> its place in the order names are noted in
_RANK = {collection: i for i, collection in enumerate(SHOWN_COLLECTIONS)}


def number(value: Any) -> float | None:
    """A host value as a float when it is a single number (see `host_scalar`)."""
    scalar = host_scalar(value)
    return None if scalar is None else float(scalar)


class Shown:
    """The newest host value of each entry a bar shows (`SHOWN_COLLECTIONS`, by
    bare name, first logged first).

    Example:
        >>> import ciclo
        >>> from ciclo.callbacks._shown import Shown
        >>> shown = Shown()
        >>> shown.commit(ciclo.Elapsed.create(), ciclo.logs().add_loss("loss", 0.5))
        >>> shown.read()
        {'loss': 0.5}
    """

    def __init__(self) -> None:
        self.history: History | None = None  # the stream read
        self._own: History | None = None  # by hand: the bar's own history
        self._names: dict[str, None] = {}  # first logged first
        # the history whose names were last noted, and its column count then
        self._learned_from: History | None = None
        self._learned = 0
        self._live: Mapping[str, Mapping[str, Any]] | None = None  # this step's
        self._shown: dict[str, float] = {}

    # -- each step (cheap: no conversion, no name noted) --------------------------
    def follow(self, history: History, logs: Any) -> None:
        """In a loop: the loop's history, and the step's logs (not committed yet).
        The names they log are noted when the values are next read."""
        self.history, self._live = history, logs

    def commit(self, elapsed: Any, logs: Any) -> None:
        """By hand: commits the step's logs to the bar's own history."""
        own = self._own
        if own is None:
            own = self._own = History()
        own.commit(elapsed, logs if logs else {})
        self.history, self._live = own, logs

    def _learn(self) -> None:
        """Notes the names logged since the last read, first logged first: those
        of the history's rows (a column's first row is where its name was first
        logged) and those of the current step."""
        history = self.history
        if history is not None:
            columns = history._columns
            if history is not self._learned_from or len(columns) != self._learned:
                self._learned_from, self._learned = history, len(columns)
                names, new = self._names, []
                for (collection, name), column in columns.items():
                    if collection in _RANK and name not in names and len(column.rows):
                        new.append((column.rows[0], _RANK[collection], name))
                new.sort(key=lambda first: first[:2])  # stable: a row's own order
                for _, _, name in new:
                    names.setdefault(name, None)
        logs = self._live
        if logs:
            self._note(logs)

    def _note(self, logs: Any) -> None:
        known = self._names.keys()
        for collection, entries in logs.items():  # a set comparison per collection
            if collection in _RANK and entries and not entries.keys() <= known:
                self._note_new(logs)  # a name not seen yet: noted in order
                return

    def _note_new(self, logs: Any) -> None:
        names = self._names
        for collection in SHOWN_COLLECTIONS:  # losses, then metrics, ...
            for name in logs.get(collection) or ():
                if name not in names:
                    names[name] = None

    def rows_after(self, steps: int) -> int:
        """The rows the history holds once the current batch (`steps` steps) is
        committed: the row of its last step is the one below."""
        history = self.history
        if history is None:
            return 0
        if history is self._own:  # by hand: the current step is committed
            return len(history)
        return len(history) + max(steps, 1)

    # -- reading --------------------------------------------------------------------
    def read(self) -> dict[str, float]:
        """The values to show now: per entry the newest one on the host."""
        history = self.history
        if history is not None:
            history.poll()
            self._take(history.latest(SHOWN_COLLECTIONS))
        self._learn()
        self._take(self._live_values(host=True))
        return self._ordered()

    def read_final(self, logs: Any = None) -> dict[str, float]:
        """The newest values: those of `logs` (default: the current step's),
        waiting for the device (one sync, when the bar closes)."""
        if logs is not None:
            self._live = logs
        history = self.history
        if history is not None:
            history.poll()
            self._take(history.latest(SHOWN_COLLECTIONS))
        self._learn()
        if history is not None:
            device = self._live_values(host=False)
            if device:
                host = history.wait_for(list(device.values()))
                self._take(dict(zip(device, host, strict=True)))
        self._take(self._live_values(host=True))
        return self._ordered()

    def row(self, stop: int) -> dict[str, float] | None:
        """The entries of row `stop - 1` as numbers, once it is on the host (no
        wait), else None."""
        history = self.history
        if history is None or history.on_host < stop:
            return None
        rows = history.host_rows(stop - 1, stop, SHOWN_COLLECTIONS)
        if not rows:
            return None
        return self._numbers(rows[0][3])

    def names(self) -> KeysView[str]:
        """The names logged so far, the first logged first."""
        self._learn()
        return self._names.keys()

    def clear(self) -> None:
        """Forgets everything (a new run)."""
        self.history = self._own = self._live = self._learned_from = None
        self._learned = 0
        self._names.clear()
        self._shown.clear()

    # -- internals ----------------------------------------------------------------
    def _live_values(self, *, host: bool) -> dict[str, Any]:
        """The current step's entries that are host values (`host`), or the
        others (device values)."""
        out: dict[str, Any] = {}
        logs = self._live
        if not logs:
            return out
        for collection in SHOWN_COLLECTIONS:
            entries = logs.get(collection)
            if entries:
                for name, value in entries.items():
                    if isinstance(value, jax.Array) is not host:
                        out[name] = value
        return out

    @staticmethod
    def _numbers(values: Mapping[str, Any]) -> dict[str, float]:
        out = {}
        for name, value in values.items():
            scalar = number(value)
            if scalar is not None:
                out[name] = scalar
        return out

    def _take(self, values: Mapping[str, Any]) -> None:
        self._shown.update(self._numbers(values))

    def _ordered(self) -> dict[str, float]:
        shown = self._shown
        return {n: shown[n] for n in self._names if n in shown}
