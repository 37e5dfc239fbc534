"""`early_stopping`: end training when a monitored metric stops improving."""

from __future__ import annotations

import copy
from typing import Any

import jax
import numpy as np

from ciclo.callbacks.monitor import Monitor, as_logs
from ciclo.time import Elapsed, Period, as_period

__all__ = ["EarlyStopping", "early_stopping"]


def _copy(leaf: Any) -> Any:
    """A copy of a state leaf, so donating or mutating the state cannot change it.

    Arrays are copied on their device (no host sync); immutable scalars are kept;
    other objects (a state that is not a pytree) are deep-copied.
    """
    if isinstance(leaf, jax.Array | np.ndarray):
        return leaf.copy()
    if leaf is None or isinstance(
        leaf, int | float | complex | str | bytes | np.generic
    ):
        return leaf
    return copy.deepcopy(leaf)


class EarlyStopping:
    """Stops the loop when `monitor` has not improved for `patience`.

    See `early_stopping` for the arguments. Registers itself on `on_epoch_end`
    (and resets on `on_train_begin`) when given in `callbacks`; in `tasks` it is a
    loop callback; by hand, `stop, state = es(elapsed, state, logs)`.

    Attributes:
        best: the best value seen (or `baseline`), None before the first call.
        best_elapsed: the `Elapsed` at which `best` was seen (or the first call's).
        stopped_elapsed: the `Elapsed` at which it asked to stop, else None.
    """

    def __init__(
        self,
        monitor: str,
        patience: int | Period,
        *,
        min_delta: float = 0.0,
        mode: str = "min",
        baseline: float | None = None,
        restore_best_weights: bool = False,
    ):
        self.monitor = Monitor(monitor, mode, min_delta, owner="early_stopping")
        self.patience = as_period(patience, "patience")
        if self.patience.date is not None:
            raise ValueError(
                "early_stopping: `patience` is a duration: use steps, samples or "
                "time, e.g. ciclo.at(time=600); got a `date`."
            )
        if baseline is not None and not isinstance(baseline, int | float):
            raise TypeError(
                f"early_stopping: `baseline` must be a number or None, got "
                f"{baseline!r} ({type(baseline).__name__})."
            )
        self.baseline = None if baseline is None else float(baseline)
        self.restore_best_weights = bool(restore_best_weights)
        self.reset()

    def reset(self) -> None:
        """Forgets everything seen (done at the start of each `train_loop`)."""
        self.best: float | None = self.baseline
        self.best_elapsed: Elapsed | None = None
        self.best_state: Any = None
        self.stopped_elapsed: Elapsed | None = None

    def __repr__(self) -> str:
        return (
            f"early_stopping({self.monitor.name!r}, patience={self.patience}, "
            f"mode={self.monitor.mode!r})"
        )

    def _waited(self, elapsed: Elapsed) -> bool:
        since, p = self.best_elapsed, self.patience
        return (
            (p.steps is not None and elapsed.steps - since.steps >= p.steps)
            or (p.samples is not None and elapsed.samples - since.samples >= p.samples)
            or (p.time is not None and float(elapsed.time - since.time) >= p.time)
        )

    def update(self, elapsed: Elapsed, state: Any, value: float) -> tuple[bool, Any]:
        """Feeds one monitored `value`; returns `(stop, state_to_continue_with)`."""
        if self.best_elapsed is None:
            self.best_elapsed = elapsed
        if self.monitor.improves(value, self.best):
            self.best, self.best_elapsed = value, elapsed
            if self.restore_best_weights:
                self.best_state = jax.tree.map(_copy, state)
            return False, state
        if not self._waited(elapsed):
            return False, state
        self.stopped_elapsed = elapsed
        if self.restore_best_weights and self.best_state is not None:
            return True, self.best_state
        return True, state

    def __call__(
        self, elapsed: Elapsed, state: Any, logs: Any = None
    ) -> tuple[bool, Any]:
        """Checks `logs` by hand: returns `(stop, state)`.

        `state` is the best state when stopping with `restore_best_weights`.

        Raises:
            ValueError: if the monitored metric is not in `logs`.
        """
        value = self.monitor.read(as_logs(logs))
        return self.update(elapsed, state, value)

    def __loop_callback__(self, loop_state: Any) -> tuple[None, Any]:
        value = self.monitor.read_loop_state(loop_state)
        stop, state = self.update(loop_state.elapsed, loop_state.state, value)
        if stop:
            loop_state.stop_iteration = True
            return None, state
        return None, None

    def on_epoch_end(self, state: Any, batch: Any, elapsed: Any, loop_state: Any):
        """Self-registration: checks at each epoch end of `train_loop`."""
        return self.__loop_callback__(loop_state)

    def on_train_begin(self, state: Any, batch: Any, elapsed: Any, loop_state: Any):
        """Self-registration: starts fresh (patience counts from the loop start)."""
        self.reset()
        self.best_elapsed = elapsed


def early_stopping(
    monitor: str,
    patience: int | Period,
    *,
    min_delta: float = 0.0,
    mode: str = "min",
    baseline: float | None = None,
    restore_best_weights: bool = False,
) -> EarlyStopping:
    """A callback that stops the loop when `monitor` stops improving.

    The loop stops when the monitored value has not improved on the best one by
    more than `min_delta` for `patience`, measured from the elapsed at which the
    best was seen (from the loop start, or the first check by hand, while nothing
    beats `baseline`). Reading the value is a host sync, once per call (per epoch
    when self-registered on `on_epoch_end`).

    Args:
        monitor: the logged entry to watch, bare (`"loss_test"`) or
            `"collection.name"`.
        patience: int steps or a `Period` (steps, samples or time); e.g. with
            `epoch_duration=100`, `patience=300` stops after 3 epochs without
            improvement.
        min_delta: the smallest change that counts as an improvement.
        mode: `"min"` (lower is better) or `"max"`.
        baseline: a value the metric must beat; until it does, nothing is "best".
        restore_best_weights: when stopping, return the state from the best check
            (its arrays are copied when recorded, so donation cannot spoil it).
            Like Keras, nothing is restored when the loop ends without stopping.

    Returns:
        An `EarlyStopping` callback.

    Raises:
        ValueError: for a bad `mode`, negative `min_delta` or a `date` patience.
        TypeError: for a `patience` that is not an int or `Period`.

    Example:
        >>> import ciclo
        >>> es = ciclo.early_stopping("loss", patience=2)
        >>> for step, loss in enumerate([3.0, 2.0, 2.5, 2.4, 2.6]):
        ...     logs = ciclo.logs()
        ...     logs.add_metric("loss", loss)
        ...     stop, _ = es(ciclo.Elapsed.create(steps=step), None, logs)
        ...     if stop:
        ...         break
        >>> step, es.best
        (3, 2.0)
    """
    return EarlyStopping(
        monitor,
        patience,
        min_delta=min_delta,
        mode=mode,
        baseline=baseline,
        restore_best_weights=restore_best_weights,
    )
