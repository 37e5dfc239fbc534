"""`Monitor`: the metric-watching logic shared by `early_stopping` and `checkpoint`.

A monitor names one logged entry (bare `"accuracy_test"` or `"metrics.accuracy_test"`),
finds it in a step's logs, reads it as a Python float, and compares values under a
mode (`"min"` or `"max"`) and a `min_delta`. Reading the value is a device-to-host
sync, so callbacks read it at most once per call (they run per epoch by default).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ciclo._history import transfer
from ciclo._locate import locate
from ciclo._logs import Logs
from ciclo._short import short

if TYPE_CHECKING:
    from ciclo._loop.state import LoopState

__all__ = ["MODES", "Monitor", "as_logs", "logged"]

MODES = ("min", "max")


class Monitor:
    """Finds, reads and compares one monitored metric.

    Args:
        name: the entry to watch: a bare name or `"collection.name"`.
        mode: `"min"` (lower is better) or `"max"` (higher is better).
        min_delta: how much a value must beat the best by to count as an improvement.
        owner: who uses the monitor, named in error messages.

    Raises:
        TypeError: if `name` is not a non-empty string or `min_delta` not a real
            number (Python or NumPy).
        ValueError: if `mode` is not "min"/"max" or `min_delta` is negative or not
            finite.

    Example:
        >>> import ciclo
        >>> from ciclo.callbacks._monitor import Monitor
        >>> monitor = Monitor("accuracy", mode="max", min_delta=0.01)
        >>> logs = ciclo.logs()
        >>> _ = logs.add_metric("accuracy", 0.9)
        >>> value = monitor.read(logs)
        >>> value, monitor.improves(value, best=0.895), monitor.improves(value, None)
        (0.9, False, True)
    """

    def __init__(
        self,
        name: str,
        mode: str = "min",
        min_delta: float = 0.0,
        *,
        owner: str = "monitor",
    ):
        if not isinstance(name, str) or not name:
            raise TypeError(
                f"{owner}: `monitor` must be the name of a logged entry such as "
                f"'loss' or 'metrics.accuracy_test'; got {short(name)}."
            )
        if mode not in MODES:
            raise ValueError(
                f"{owner}: `mode` must be 'min' (lower is better) or 'max' (higher "
                f"is better); got {short(mode)}."
            )
        if isinstance(min_delta, bool) or not isinstance(min_delta, numbers.Real):
            raise TypeError(
                f"{owner}: `min_delta` must be a number, got {short(min_delta)} "
                f"({type(min_delta).__name__})."
            )
        if not min_delta >= 0 or math.isinf(min_delta):
            raise ValueError(
                f"{owner}: `min_delta` must be finite and >= 0 (its sign follows "
                f"`mode`); got "
                f"{min_delta}."
            )
        self.name = name
        self.mode = mode
        self.min_delta = float(min_delta)
        self.owner = owner

    def __repr__(self) -> str:
        return f"Monitor({self.name!r}, mode={self.mode!r}, min_delta={self.min_delta})"

    # -- finding ------------------------------------------------------------------
    def find(self, *sources: Mapping[str, Mapping[str, Any]] | None) -> Any:
        """The raw value (possibly a device array) from the first source that has it.

        Raises:
            ValueError: if no source has the entry; the message names it and lists
                every entry that was logged.
        """
        for source in sources:
            if not source:
                continue
            found, value = _lookup(source, self.name)
            if found:
                return value
        logged = sorted(
            {
                f"{c}.{n}"
                for s in sources
                if s
                for c, values in s.items()
                for n in values
            }
        )
        raise ValueError(
            f"{self.owner}: the monitored metric {self.name!r} was not logged. "
            f"Logged entries: {logged or 'none'}. Check the name (test metrics of "
            f"train_loop are suffixed, e.g. 'accuracy_test') and that the step "
            f"logging it runs before this callback."
        )

    def read(self, *sources: Mapping[str, Mapping[str, Any]] | None) -> float:
        """The monitored value as a Python float (a host sync; call it sparingly).

        Raises:
            ValueError: if the entry is missing (see `find`) or not a scalar.
        """
        value = np.asarray(transfer.now(self.find(*sources)))
        if value.size != 1:
            raise ValueError(
                f"{self.owner}: the monitored metric {self.name!r} must be a scalar, "
                f"got an array of shape {value.shape}."
            )
        return float(value.reshape(()))

    def read_loop_state(self, loop_state: LoopState) -> float:
        """Reads the value logged at this step (`loop_state.logs`), never a stale
        one from an earlier step.

        Raises:
            ValueError: if the entry was not logged at this step; the message
                says when it was last logged, if ever.
        """
        if _lookup(loop_state.logs, self.name)[0]:
            return self.read(loop_state.logs)
        earlier = _lookup(loop_state.accumulated_logs, self.name)[0]
        if not earlier:
            return self.read(loop_state.logs)  # never logged: lists what was
        logged = sorted(f"{c}.{n}" for c, v in loop_state.logs.items() for n in v)
        raise ValueError(
            f"{self.owner}: the monitored metric {self.name!r} was not logged at "
            f"step {loop_state.elapsed.steps} (it was at an earlier step; logged "
            f"now: {logged or 'none'}). A monitor acts only on fresh values: run it "
            f"on the schedule of the step that logs {self.name!r} (e.g. "
            f"on_epoch_end for test metrics), after that step. If the test loop "
            f"logged nothing, check that `test_dataset()` returns a fresh iterable."
        )

    # -- comparing ----------------------------------------------------------------
    def improves(self, value: float, best: float | None) -> bool:
        """True when `value` beats `best` by more than `min_delta` (or `best` is None).

        NaN never improves.
        """
        if math.isnan(value):
            return False
        if best is None:
            return True
        if self.mode == "min":
            return value < best - self.min_delta
        return value > best + self.min_delta

    def better(self, a: float, b: float) -> bool:
        """True when `a` is strictly better than `b`, ignoring `min_delta`."""
        if math.isnan(a):
            return False
        if math.isnan(b):
            return True
        return a < b if self.mode == "min" else a > b

    def score(self, value: float) -> float:
        """`value` oriented so that higher is better (for sorting; NaN is worst)."""
        if math.isnan(value):
            return -math.inf
        return -value if self.mode == "min" else value

    @property
    def worst(self) -> float:
        """The worst possible value under this mode (`inf` for min, `-inf` for max)."""
        return math.inf if self.mode == "min" else -math.inf


def _lookup(source: Mapping[str, Mapping[str, Any]], name: str) -> tuple[bool, Any]:
    pairs = [(c, n) for c, values in source.items() for n in values]
    key = locate(pairs, name, "the monitored logs")
    return (False, None) if key is None else (True, source[key[0]][key[1]])


def as_logs(logs: Any) -> Logs | None:
    """`logs` as a `Logs` (None stays None); used by callbacks called by hand."""
    if logs is None or isinstance(logs, Logs):
        return logs
    return Logs(logs)


def logged(logs: Any, name: str) -> bool:
    """Whether the entry `name` (bare or `collection.name`) is in `logs`."""
    if not logs:
        return False
    pairs = [(c, n) for c, values in logs.items() for n in values]
    return locate(pairs, name, "the monitored logs") is not None
