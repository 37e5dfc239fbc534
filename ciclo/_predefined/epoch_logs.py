"""`train_loop(epoch_logs=...)`: the epoch's aggregates of the train batches' logs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ciclo._input.batch import Steps
from ciclo._logs import LOSSES, METRICS, Logs
from ciclo._time import Elapsed
from ciclo.callbacks._aggregation import Running, Spec

if TYPE_CHECKING:
    from ciclo._loop.state import LoopState

# What epoch_logs=True aggregates, and how: losses and metrics, each batch weighted
# by its size (a smaller last batch counts for what it holds).
COLLECTIONS = (LOSSES, METRICS)
DEFAULT = "weighted_mean"


class EpochLogs:
    """`train_loop(epoch_logs=...)`: accumulates each train batch's entries on the
    device (no host sync; see `Running`), and at the epoch end logs their
    aggregates as `{name}_epoch` in the same collection, then starts over.

    `spec` is True (losses and metrics, batch-size-weighted means) or an
    aggregation spec (`ciclo.inner_loop`'s `aggregation`: a mode, a function of
    the list of values, or a dict `"collection.entry"` / `"entry"` /
    `"collection"` -> mode). Aggregated are the entries of `losses` and
    `metrics`, those of any collection or entry a dict names, and those a step
    declared a mode for (`logs.add_metric(name, value, aggregation="max")`); the
    mode of an entry is, most specific first: its dict key, its declared mode,
    its collection's dict key, the spec's mode (default `"weighted_mean"`).

    Example:
        >>> import ciclo
        >>> def train_step(state, batch):
        ...     logs = ciclo.logs().add_loss("loss", float(batch))
        ...     return logs.add_metric("best", float(batch), aggregation="max")
        >>> _, history, _ = ciclo.train_loop(
        ...     None, [1, 3, 2, 0], {ciclo.on_train_step: train_step},
        ...     epoch_duration=2, epoch_logs={"loss": "sum"})
        >>> history.collect("loss_epoch"), history.collect("best_epoch")
        ([4.0, 2.0], [3.0, 2.0])
    """

    def __init__(self, spec: Any = True):
        where = "train_loop: epoch_logs"
        self._spec = Spec(None if spec is True else spec, where, DEFAULT)
        self._named = isinstance(spec, Mapping)
        self._modes: dict[tuple[str, str], Any] = {}  # None: not aggregated
        self._running: dict[tuple[str, str], Running] = {}

    def _mode(self, collection: str, name: str, declared: Any) -> Any:
        spec = self._spec
        mode = declared.get((collection, name)) if declared else None
        if (
            collection in COLLECTIONS
            or mode is not None
            or (self._named and spec.names(collection, name))
        ):
            return spec.mode(collection, name, mode)
        return None

    def add(
        self, state: Any, batch: Any, elapsed: Elapsed, loop_state: LoopState
    ) -> None:
        """Adds this batch's entries (a device op or two each, no sync). A fused
        call's per-step rows (`Steps.rows`) count step by step; its other logs
        as one value of the call's samples."""
        logs = loop_state.logs
        size = loop_state.elapsed_after.samples - elapsed.samples
        rows = batch.rows if type(batch) is Steps else None
        if rows is not None:
            self._add(rows, size // max(batch.n, 1), stacked=True)
        self._add(logs, size, skip=rows)

    def _add(self, logs: Any, size: int, stacked: bool = False, skip: Any = None):
        declared = getattr(logs, "_aggregations", None)
        modes, running = self._modes, self._running
        for collection, entries in logs.items():
            skipped = skip.get(collection, ()) if skip else ()
            for name, value in entries.items():
                if name in skipped:
                    continue
                key = (collection, name)
                accumulator = running.get(key)
                if accumulator is None:
                    if key in modes and not declared:
                        mode = modes[key]
                    else:
                        mode = modes[key] = self._mode(collection, name, declared)
                    if mode is None:
                        continue
                    accumulator = running[key] = Running(mode)
                if stacked:
                    accumulator.add_rows(value, size)
                else:
                    accumulator.add(value, size)

    def logs(self) -> Logs:
        """The epoch's aggregates, `{name}_epoch`; starts the next epoch."""
        logs = Logs()
        for (collection, name), accumulator in self._running.items():
            value = accumulator.result()
            if value is not None:
                logs.add_entry(collection, f"{name}_epoch", value)
        self._running = {}
        return logs
