"""`early_stopping`: end training when a monitored metric stops improving."""

from __future__ import annotations

import copy
import math
import numbers
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from ciclo._input.batch import batch_size
from ciclo._period import Period, as_period
from ciclo._short import short
from ciclo._time import Elapsed, new_elapsed
from ciclo._warn import warn
from ciclo.callbacks._monitor import Monitor, as_logs

if TYPE_CHECKING:
    from ciclo._loop.state import LoopState

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
    (and on `on_train_begin` to reset, `on_train_end` to restore the best state)
    when given in `callbacks`; in `tasks` it is a loop callback; by hand,
    `stop, state = es(elapsed, state, logs)`.

    Elapsed values are those counted AFTER the batch the state was trained on (what
    the state has consumed), as `checkpoint` records them.

    Attributes:
        best: the best value seen (or `baseline`), None before the first call.
        best_elapsed: the `Elapsed` at which `best` was seen (or where patience
            started counting: the loop start, or the first call by hand).
        stopped_elapsed: the `Elapsed` at which it asked to stop, else None.
    """

    reads_batch = False  # its hooks never read the loop's batch

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
        if baseline is not None and (
            isinstance(baseline, bool) or not isinstance(baseline, numbers.Real)
        ):
            raise TypeError(
                f"early_stopping: `baseline` must be a number or None, got "
                f"{short(baseline)} ({type(baseline).__name__})."
            )
        if baseline is not None and math.isnan(baseline):
            raise ValueError("early_stopping: `baseline` must be a number, got NaN.")
        self.baseline = None if baseline is None else float(baseline)
        self.restore_best_weights = bool(restore_best_weights)
        self.reset()

    def reset(self) -> None:
        """Forgets everything seen (done at the start of each `train_loop`)."""
        self.best: float | None = self.baseline
        self.best_elapsed: Elapsed | None = None
        self.best_state: Any = None
        self.stopped_elapsed: Elapsed | None = None
        self._restore_at_end = False
        self._resumed: dict[str, Any] | None = None  # what a checkpoint gave back
        self._resumed_best = False  # `best` came from a checkpoint (not its state)

    @property
    def __loop_state_key__(self) -> str:
        """What tells it apart from the other `early_stopping`s of a loop in a
        checkpoint: its monitor and mode (their order may change)."""
        return f"{self.monitor.name}/{self.monitor.mode}"

    def __loop_state__(self) -> dict[str, Any]:
        """What a checkpoint in the loop keeps: the best value and where it was
        seen (patience counts from there), so a resumed run stops where the
        uninterrupted one would. The best state (`restore_best_weights`) is
        not kept: after a resume it is the best seen since."""
        since = self.best_elapsed
        return {
            "stopped": self.stopped_elapsed is not None,
            "best": self.best,
            "best_elapsed": None
            if since is None
            else [int(since.steps), int(since.samples), float(since.time)],
        }

    def __loop_restore__(self, saved: Any) -> None:
        """Takes back what `__loop_state__` gave, when a loop resumes from a
        checkpoint (again at `train_loop`'s start, which resets otherwise). Only
        a state saved for the same monitor and mode comes back (its key)."""
        if not isinstance(saved, dict):
            return
        self._apply(saved)
        self._resumed = saved

    def _apply(self, saved: dict[str, Any]) -> None:
        best, since = saved.get("best"), saved.get("best_elapsed")
        self.best = None if best is None else float(best)
        self._resumed_best = best is not None and best != self.baseline
        if since is not None:  # patience reads its steps, samples and time
            steps, samples, time = since
            self.best_elapsed = new_elapsed(int(steps), int(samples), float(time), 0.0)

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
            self._resumed_best = False
            if self.restore_best_weights:
                self.best_state = jax.tree.map(_copy, state)
            return False, state
        if not self._waited(elapsed):
            return False, state
        self.stopped_elapsed = elapsed
        if self.restore_best_weights and self.best_state is not None:
            return True, self.best_state
        if self.restore_best_weights and self._resumed_best:
            warn(
                f"early_stopping({self.monitor.name!r}, restore_best_weights=True): "
                f"the best value ({self.best}) was seen at step "
                f"{self.best_elapsed.steps}, before the run was resumed, and its "
                f"state is not in the checkpoint: the state at the stop is "
                f"returned. A checkpoint with monitor={self.monitor.name!r} keeps "
                f"the best state on disk: ciclo.restore(directory, best=True)."
            )
        return True, state

    def __call__(
        self, elapsed: Elapsed, state: Any, logs: Any = None, *, batch: Any = None
    ) -> tuple[bool, Any]:
        """Checks `logs` by hand: returns `(stop, state)`.

        Args:
            elapsed: the `Elapsed` that `ciclo.elapse` gave with the batch `state`
                was just trained on; patience is measured at `elapsed.update(...)`
                (that batch counted), as in a loop.
            state: the state after that batch.
            logs: the logs holding the monitored metric.
            batch: that batch, so a patience in samples counts its samples too.

        Returns:
            `(stop, state)`; `state` is the best state when stopping with
            `restore_best_weights`.

        Raises:
            ValueError: if the monitored metric is not in `logs`.
        """
        value = self.monitor.read(as_logs(logs))
        size = 0 if batch is None else batch_size(batch)
        return self.update(elapsed.update(size), state, value)

    def __loop_start__(self, elapsed: Elapsed | None) -> None:
        """Before a loop's first batch: patience counts from where the loop starts
        while nothing has been checked yet (a `baseline` never beaten stops after
        `patience` from the start, as Keras does); one already counting (a loop
        run in chunks with `elapsed=`) goes on."""
        if self.best_elapsed is None:
            self.best_elapsed = Elapsed.create() if elapsed is None else elapsed

    def __loop_callback__(self, loop_state: LoopState) -> tuple[None, Any]:
        stop, state = self._check(loop_state)
        return None, state if stop else None

    def _check(self, loop_state: LoopState) -> tuple[bool, Any]:
        value = self.monitor.read_loop_state(loop_state)
        stop, state = self.update(loop_state.elapsed_after, loop_state.state, value)
        if stop:
            loop_state.stop_after_batch()
        return stop, state

    def on_epoch_end(
        self, state: Any, batch: Any, elapsed: Elapsed, loop_state: LoopState
    ):
        """Self-registration: checks at each epoch end of `train_loop`.

        It asks the loop to stop; the best state (`restore_best_weights`) is handed
        back on `on_train_end`, so the callbacks after it in that batch (e.g. a
        checkpoint) still see the state trained so far.
        """
        stop, _ = self._check(loop_state)
        self._restore_at_end = stop and self.best_state is not None

    def on_train_begin(
        self, state: Any, batch: Any, elapsed: Elapsed, loop_state: LoopState
    ):
        """Self-registration: starts fresh (patience counts from the loop start),
        or, resumed from a checkpoint, where the saved run was."""
        resumed = self._resumed
        self.reset()
        self.best_elapsed = start = loop_state.elapsed_after
        if resumed is None:
            return
        self._apply(resumed)
        if resumed.get("stopped") and self._waited(start):
            # the saved run had stopped here, and patience (maybe changed) agrees:
            # nothing left to train, as in a finished run run again
            self.stopped_elapsed = start
            loop_state.stop_iteration = True
            warn(
                f"early_stopping({self.monitor.name!r}): the run restored at step "
                f"{start.steps} had stopped early there (no improvement on "
                f"{self.best} since step {self.best_elapsed.steps}), so there is "
                f"nothing left to train. To train further, give a larger "
                f"`patience`, or start fresh (a new directory, or resume=False)."
            )

    def on_train_end(self, state: Any) -> tuple[None, Any]:
        """Self-registration: returns the best state if it stopped the loop."""
        if self._restore_at_end:
            self._restore_at_end = False
            return None, self.best_state
        return None, None


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
    beats `baseline`). Elapsed values count the batch just trained on (what the
    state has consumed, as `checkpoint` records it): in a loop
    `elapsed.update(batch_size)` during a step, by hand `es(elapsed, state, logs)`
    with the `elapsed` `ciclo.elapse` gave with that batch. Reading the value is a
    host sync, once per call (per epoch when self-registered on `on_epoch_end`).

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
            (its arrays are copied when recorded, so donation cannot spoil it):
            self-registered in `train_loop` on `on_train_end` (the rest of the
            stopping batch sees the state trained so far), in `ciclo.loop` or as an
            explicit task at the check that stops, by hand as the returned state.
            Like Keras, nothing is restored when the loop ends without stopping.

    Returns:
        An `EarlyStopping` callback.

    Raises:
        ValueError: for a bad `mode`, negative `min_delta` or a `date` patience.
        TypeError: for a `patience` that is not an int or `Period`, or a
            `min_delta` / `baseline` that is not a real number.

    Example:
        >>> import ciclo
        >>> es = ciclo.early_stopping("loss", patience=2)
        >>> for step, loss in enumerate([3.0, 2.0, 2.5, 2.4, 2.6]):
        ...     logs = ciclo.logs()
        ...     _ = logs.add_metric("loss", loss)
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
