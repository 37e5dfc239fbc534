"""`train_loop(epoch_logs=True)`: the epoch's means of the train batches' logs."""

from __future__ import annotations

from typing import Any

from ciclo._logs import Logs
from ciclo._time import Elapsed


class EpochMeans:
    """`train_loop(epoch_logs=True)`: adds up each train batch's losses and metrics
    (weighted by its batch size, on the device: no host sync), and at the epoch end
    logs their means as `{name}_epoch` in the same collection, then starts over."""

    COLLECTIONS = ("losses", "metrics")

    def __init__(self) -> None:
        self._sums: dict[tuple[str, str], Any] = {}
        self._sizes: dict[tuple[str, str], int] = {}

    def add(self, state: Any, batch: Any, elapsed: Elapsed, loop_state: Any) -> None:
        size = loop_state.elapsed_after.samples - elapsed.samples
        for collection in self.COLLECTIONS:
            for name, value in (loop_state.logs.get(collection) or {}).items():
                key = (collection, name)
                total = self._sums.get(key)
                weighted = value * size
                self._sums[key] = weighted if total is None else total + weighted
                self._sizes[key] = self._sizes.get(key, 0) + size

    def means(self) -> Logs:
        logs = Logs()
        for (collection, name), total in self._sums.items():
            size = max(self._sizes[(collection, name)], 1)
            logs.add_entry(collection, f"{name}_epoch", total / size)
        self._sums, self._sizes = {}, {}
        return logs
