"""`nan_guard`: stops the loop when a watched loss or metric is NaN or infinite."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ciclo._locate import locate
from ciclo._logs import LOSSES, METRICS, STATEFUL_METRICS
from ciclo._warn import warn
from ciclo.callbacks._base import LoopElement
from ciclo.callbacks._lagged import LaggedQueue

__all__ = ["NonFiniteError", "nan_guard"]

_ACTIONS = ("raise", "warn")
_WATCHED = (LOSSES, METRICS, STATEFUL_METRICS)


class NonFiniteError(FloatingPointError):
    """A watched entry was NaN or infinite. `step` and `entry` say where;
    `state` is the last good state when the guard keeps it."""

    def __init__(self, message: str, *, step: int, entry: str, state: Any = None):
        super().__init__(message)
        self.step, self.entry, self.state = step, entry, state


def _numeric(value: Any) -> bool:
    if isinstance(value, bool | np.bool_):
        return False
    if isinstance(value, int | float | np.number):
        return True
    dtype = getattr(value, "dtype", None)
    return dtype is not None and np.issubdtype(dtype, np.inexact)


def _bad(value: Any) -> Any:
    """The first NaN or infinite element of `value` (fetched), or None."""
    if value is None:
        return None
    array = np.asarray(value)
    if array.dtype.kind not in "fc" or np.isfinite(array).all():
        return None
    return array.reshape(-1)[~np.isfinite(array.reshape(-1))][0]


class nan_guard(LoopElement):
    """Stops the loop when a watched loss or metric is NaN or infinite.

    By default it watches every entry of `losses`, `metrics` and
    `stateful_metrics` (a `grad_norm` entry included when one is logged), and any
    entry named `grad_norm` in another collection; `watch` names the entries to
    watch instead (bare `"loss"` or `"metrics.grad_norm"`). Arrays are bad when any
    element is.

    **No per-step sync, so it may run a few steps past the bad one.** Values are
    checked lagged, once the device has computed them (`jax.Array.is_ready()`):
    a NaN logged at step `s` is seen at the first call after it is computed, and
    the loop stops at the end of that batch (`loop_state.stop_after_batch()`).
    With `max_lag=k` the guard waits for a value when `k` newer steps are
    unchecked, so the loop ends at most `k` steps after the bad one (by default
    8; `max_lag=0` checks every step synchronously and stops on the bad step
    itself). Whatever is still unchecked when the loop ends is checked then.

    What it does on a bad value, `action`:

    - `"raise"` (default): raises `NonFiniteError` (a `FloatingPointError`), with a
      message naming the entry, its value, the step that logged it and the step
      the loop had reached. It is raised from the callback (or, for a value first
      read at the loop's end, from the end of the loop, after the other callbacks'
      end hooks ran), so writers still flush. The error's `state` is the last good
      state when `keep_good_state=True`.
    - `"warn"`: warns (`RuntimeWarning`, the same message) and stops the loop at
      the end of the batch; the loop returns normally. With
      `keep_good_state=True` the returned state is the last good one.

    Either way `guard.found` is `(step, entry, value)` of the first bad value
    (None while none) and `guard.good_state` the last state known good (with
    `keep_good_state=True`): the state after the last step whose watched values
    were all finite. Keeping it holds references to the states of the unchecked
    steps (at most `max_lag + 1`): with a donating strategy (`"jit_donate"`) those
    buffers are reused, so keep it only without donation.

    A `ciclo.checkpoint` in the same loop saves no state whose logs the guard
    would call bad (it checks the rows it saves, which are on the host then), so
    the last finite checkpoint is kept even though the guard reads lagged.

    In `ciclo.train_loop(callbacks=[...])` it runs on `on_train_batch_end`; in
    `ciclo.loop` spread it after the train step (`{**ciclo.nan_guard()}`) or give
    it a schedule. By hand: `guard(elapsed, logs, state)` checks (and raises or
    warns), `guard.close()` checks the rest.

    Args:
        watch: entry names to watch; None: the default above.
        action: `"raise"` or `"warn"`.
        max_lag: at most this many steps unchecked (0: check every step).
        keep_good_state: keep the last good state and hand it back.

    Raises:
        ValueError: for an unknown `action` or a negative `max_lag`.

    Example:
        >>> import warnings, ciclo
        >>> def train_step(state, batch):
        ...     loss = float("nan") if batch == 3 else 1.0
        ...     return ciclo.logs().add_loss("loss", loss), state + 1
        >>> guard = ciclo.nan_guard(action="warn", keep_good_state=True)
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     state, _, elapsed = ciclo.loop(
        ...         0, range(10), {ciclo.every(1): train_step, **guard})
        >>> print(caught[0].message)
        nan_guard: losses.loss is nan at step 3; the loop stops.
        >>> guard.found[:2], state, elapsed.steps
        ((3, 'losses.loss'), 3, 4)
    """

    def __init__(
        self,
        watch: str | list[str] | tuple[str, ...] | None = None,
        *,
        action: str = "raise",
        max_lag: int = 8,
        keep_good_state: bool = False,
    ):
        if action not in _ACTIONS:
            raise ValueError(
                f"nan_guard: `action` must be one of {_ACTIONS}; got {action!r}."
            )
        if isinstance(max_lag, bool) or not isinstance(max_lag, int) or max_lag < 0:
            raise ValueError(
                f"nan_guard: `max_lag` must be an int >= 0, got {max_lag!r}."
            )
        if isinstance(watch, str):
            watch = [watch]
        if watch is not None and not all(isinstance(w, str) and w for w in watch):
            raise TypeError(f"nan_guard: `watch` must be entry names, got {watch!r}.")
        self.watch = None if watch is None else tuple(watch)
        self.action = action
        self.max_lag = max_lag
        self.keep_good_state = bool(keep_good_state)
        self._queue = LaggedQueue(max_lag)
        self.found: tuple[int, str, float] | None = None
        self.good_state: Any = None
        self._error: NonFiniteError | None = None

    @property
    def on_train_batch_end(self) -> nan_guard:
        """The guard itself: `train_loop(callbacks=[guard])` runs it after each batch."""
        return self

    def _watched(self, logs: Mapping[str, Mapping[str, Any]]) -> tuple[list, list]:
        names, values = [], []
        if self.watch is not None:
            for key in self.watch:
                pairs = {(c, n): v for c, e in logs.items() for n, v in e.items()}
                found = locate(pairs, key, "nan_guard") if pairs else None
                if found is not None:
                    names.append(".".join(found))
                    values.append(pairs[found])
            return names, values
        for collection, entries in logs.items():
            for name, value in entries.items():
                if (collection in _WATCHED or name == "grad_norm") and _numeric(value):
                    names.append(f"{collection}.{name}")
                    values.append(value)
        return names, values

    def check(
        self, elapsed: Any, logs: Any, state: Any = None, now: Any = None
    ) -> bool:
        """Queues this step's watched values and checks those computed; True when a
        bad value was found (now or before)."""
        if self.found is None:
            names, values = self._watched(logs or {})
            if names or self.keep_good_state:
                self._queue.push((int(elapsed.steps), names, state), values)
            self._inspect(self._queue.pop_ready(), now)
        return self.found is not None

    def bad_entry(self, logs: Mapping[str, Mapping[str, Any]]) -> str | None:
        """The first watched entry of `logs` (host values) that is bad, or None.
        A checkpoint in the same loop asks it of the rows it is about to save."""
        names, values = self._watched(logs)
        for name, value in zip(names, values):
            if _bad(value) is not None:
                return name
        return None

    def _inspect(self, items: list, now: Any) -> None:
        for (step, names, state), values in items:
            for name, value in zip(names, values):
                bad = _bad(value)
                if bad is None:
                    continue
                self.found = (step, name, float(np.real(bad)))
                late = "" if now is None or now == step else f", seen at step {now}"
                self._error = NonFiniteError(
                    f"nan_guard: {name} is {bad} at step {step}{late}; "
                    + ("the loop stops." if self.action == "warn" else "stopping."),
                    step=step,
                    entry=name,
                    state=self.good_state,
                )
                self._queue.clear()
                return
            if self.keep_good_state:
                self.good_state = state

    def _react(self, loop_state: Any = None) -> None:
        error = self._error
        if error is None:
            return
        self._error = None
        if self.action == "raise":
            raise error
        warn(str(error), RuntimeWarning)
        if loop_state is not None:
            loop_state.stop_after_batch()
            if self.keep_good_state and self.good_state is not None:
                loop_state.state = self.good_state

    def __call__(self, elapsed: Any, logs: Any = None, state: Any = None) -> bool:
        """Checks a step by hand (`elapsed` as `ciclo.elapse` gave it); raises or
        warns on a bad value; returns True once one was found."""
        found = self.check(elapsed, logs, state)
        self._react()
        return found

    def __loop_callback__(self, loop_state: Any) -> tuple[None, Any]:
        loop_state._nan_guard = self  # a checkpoint there saves no bad state
        if self.found is None:
            self.check(
                loop_state.elapsed,
                loop_state.logs,
                loop_state.state if self.keep_good_state else None,
                now=int(loop_state.elapsed.steps),
            )
            if self._error is not None:
                self._react(loop_state)
                if self.keep_good_state and self.good_state is not None:
                    return None, self.good_state
        return None, None

    def close(self) -> None:
        """Checks every unchecked value (waiting for the device); raises or warns."""
        if self.found is None:
            self._inspect(self._queue.drain(), None)
        self._queue.clear()
        self._react()

    def __loop_end__(self, loop_state: Any) -> None:
        """Checks what is still unchecked when the loop ends."""
        try:
            self.close()
        finally:
            self._queue.clear()

    def reset(self) -> None:
        """Forgets a found value and the good state (to guard a new run)."""
        self.found, self.good_state, self._error = None, None, None
        self._queue.clear()
