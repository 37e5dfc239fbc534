"""`nan_guard`: stops the loop when a watched loss or metric is NaN or infinite."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from ciclo._history.history import History
from ciclo._locate import locate
from ciclo._logs import LOSSES, METRICS, STATEFUL_METRICS
from ciclo._loop.state import interrupted
from ciclo._short import short
from ciclo._warn import warn
from ciclo.callbacks._base import LoopElement

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
    if type(value) is float:  # the history's scalars
        return None if math.isfinite(value) else value
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

    **No per-step sync, so it may run a few steps past the bad one.** The guard
    reads the loop's `History`, the run's one device-to-host stream, and makes
    no transfer of its own: it checks each row as it arrives on the host (a
    value the step logged as a host number, at once), and the loop stops at the
    end of the batch where it saw the bad value (`loop_state.stop_after_batch()`).
    With `max_lag=k` the history starts a transfer at least every `k` commits
    while the guard runs (`History.read_within`), and the guard waits
    for a row when `k` newer steps are unchecked (that row only, not the newest
    step), so the loop ends at most `k` steps after the bad one (by default 8;
    `max_lag=0` checks every step synchronously and stops on the bad step
    itself). Whatever is still unchecked when the loop ends is checked then.
    Used by hand, the guard commits each call's logs to a history of its own,
    read the same way.

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
        ValueError: for an unknown `action` or a negative `max_lag`; when a loop
            that ran to its end (or `close()`) never logged a name in `watch`.
        TypeError: for a `watch` that is not a name or a list of names.

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

    reads_batch = False  # its hooks never read the loop's batch

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
                f"nan_guard: `action` must be one of {_ACTIONS}; got {short(action)}."
            )
        if isinstance(max_lag, bool) or not isinstance(max_lag, int) or max_lag < 0:
            raise ValueError(
                f"nan_guard: `max_lag` must be an int >= 0, got {short(max_lag)}."
            )
        if isinstance(watch, str):
            watch = [watch]
        if watch is not None and (
            not isinstance(watch, list | tuple)
            or not all(isinstance(w, str) and w for w in watch)
        ):
            raise TypeError(
                f"nan_guard: `watch` must be an entry name or a list of them (e.g. "
                f'"loss" or ["loss", "metrics.grad_norm"]), got {short(watch)}.'
            )
        self.watch = None if watch is None else tuple(watch)
        self.action = action
        self.max_lag = max_lag
        self.keep_good_state = bool(keep_good_state)
        self.found: tuple[int, str, float] | None = None
        self.good_state: Any = None
        self._error: NonFiniteError | None = None
        self._history: History | None = None  # the stream read
        self._own: History | None = None  # by hand: the guard's own history
        self._cursor = 0  # the next row of `_history` to check
        self._checked = 0  # every step below this one was checked finite
        # (steps counted after a batch, its state): the states of unchecked steps
        self._states: deque[tuple[int, Any]] = deque()

    @property
    def on_train_batch_end(self) -> nan_guard:
        """The guard itself: `train_loop(callbacks=[guard])` runs it after each batch."""
        return self

    # -- what is watched ------------------------------------------------------------
    def _watched_pairs(self, pairs: Mapping[tuple[str, str], Any]) -> tuple[list, list]:
        """The watched `(collection, name) -> value` entries: names and values."""
        names, values = [], []
        if self.watch is not None:
            for key in self.watch:
                found = locate(pairs, key, "nan_guard") if pairs else None
                if found is not None:
                    names.append(".".join(found))
                    values.append(pairs[found])
            return names, values
        for (collection, name), value in pairs.items():
            if (collection in _WATCHED or name == "grad_norm") and _numeric(value):
                names.append(f"{collection}.{name}")
                values.append(value)
        return names, values

    def _watched(self, logs: Mapping[str, Mapping[str, Any]]) -> tuple[list, list]:
        if self.watch is not None:
            pairs = {(c, n): v for c, e in logs.items() for n, v in e.items()}
            return self._watched_pairs(pairs)
        names, values = [], []
        for collection, entries in logs.items():
            watched = collection in _WATCHED
            for name, value in entries.items():
                if (watched or name == "grad_norm") and _numeric(value):
                    names.append(f"{collection}.{name}")
                    values.append(value)
        return names, values

    def bad_entry(self, logs: Mapping[str, Mapping[str, Any]]) -> str | None:
        """The first watched entry of `logs` (host values) that is bad, or None.
        A checkpoint in the same loop asks it of the rows it is about to save."""
        names, values = self._watched(logs)
        for name, value in zip(names, values):
            if _bad(value) is not None:
                return name
        return None

    # -- checking -------------------------------------------------------------------
    def check(
        self, elapsed: Any, logs: Any, state: Any = None, now: Any = None
    ) -> bool:
        """Commits this step's logs to the guard's own history (by hand) and checks
        the rows on the host; True when a bad value was found (now or before)."""
        if self.found is None:
            own = self._own
            if own is None:
                own = self._own = History(lag=max(self.max_lag, 1))
            if self._history is not own:
                self._follow(own, int(elapsed.steps))
            steps = int(elapsed.steps)
            own.commit(elapsed, logs or {})
            own.poll()  # host values: on the host at once
            self._step(own, steps, steps + 1, logs or {}, state, now)
        return self.found is not None

    def _follow(self, history: History, steps: int) -> None:
        """Reads `history` from its next row on (the run starts at `steps`)."""
        self._history, self._cursor, self._checked = history, len(history), steps
        self._states.clear()
        history.read_within(self.max_lag)

    def _step(
        self, history: History, before: int, after: int, logs: Any, state: Any, now
    ) -> None:
        """Checks, for the batch of steps `before` to `after` (its logs, and its
        state when the good one is kept): the rows on the host, the step's host
        values, and, when `max_lag` steps would be unchecked, the rows (or the
        step's own values) that must be, waiting for them."""
        if self.keep_good_state:
            self._states.append((after, state))
        self._check_rows(history, now)
        if self.found is not None:
            return
        pending = self._check_live(history, before, after, logs, now)
        if self.found is not None:
            return
        need = after - self.max_lag  # every step below it checked
        if self._checked >= need:
            return
        if self.max_lag == 0 and pending:  # synchronously: the step's own values
            names, values = zip(*pending, strict=True)
            self._check_values(after - 1, list(names), history.wait_for(list(values)))
            if self.found is not None:
                return
        upto = history.row_at(need, self._cursor)
        if upto > self._cursor and history.on_host < upto:
            history.fetch(upto)  # waits for those rows only
        self._check_rows(history, now)
        if self.found is None and self.max_lag == 0 and self._cursor == len(history):
            self._advance(after)

    def _check_rows(self, history: History, now: Any) -> None:
        """Checks the rows that reached the host since the last call (no wait)."""
        rows = history.host_entries(self._cursor, history.on_host)
        for steps, entries in rows:
            self._cursor += 1
            names, values = self._watched_pairs(entries)
            self._check_values(int(steps), names, values, now)
            if self.found is not None:
                return
            self._advance(int(steps) + 1)

    def _check_live(
        self, history: History, before: int, after: int, logs: Any, now: Any
    ) -> list[tuple[str, Any]]:
        """Checks the step's watched host values now (no transfer); returns its
        device values (`(name, value)`), checked once their row is on the host."""
        names, values = self._watched(logs)
        pending, host_names, host_values = [], [], []
        for name, value in zip(names, values):
            if isinstance(value, jax.Array):
                pending.append((name, value))
            else:
                host_names.append(name)
                host_values.append(value)
        self._check_values(after - 1, host_names, host_values, now)
        if (
            self.found is None
            and not pending
            and after - before == 1
            and self._checked >= before  # every earlier step checked already
        ):
            self._advance(after)  # the step is checked whole
        return pending

    def _check_values(
        self, step: int, names: list[str], values: list[Any], now: Any = None
    ) -> None:
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
            self._states.clear()
            return

    def _advance(self, checked: int) -> None:
        """Every step below `checked` is finite: the good state moves on."""
        if checked <= self._checked:
            return
        self._checked = checked
        states = self._states
        while states and states[0][0] <= checked:
            _, state = states.popleft()
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

    def __loop_callback__(self, loop_state: Any) -> tuple[None, Any] | None:
        loop_state._nan_guard = self  # a checkpoint there saves no bad state
        if self.found is None:
            history = loop_state.history
            before = int(loop_state.elapsed.steps)
            if history is not self._history:
                self._follow(history, before)
            self._step(
                history,
                before,
                int(loop_state.elapsed_after.steps),
                loop_state.logs,
                loop_state.state if self.keep_good_state else None,
                before,
            )
            if self._error is not None:
                self._react(loop_state)
                if self.keep_good_state and self.good_state is not None:
                    return None, self.good_state
        return None  # nothing to apply: the common step

    def close(self) -> None:
        """Checks every unchecked row (waiting for the device); raises or warns.

        Raises:
            ValueError: when a name in `watch` was never logged (nothing was
                guarded: a typo), naming it and the logged entries.
        """
        self._close(check_watched=True)

    def _close(self, check_watched: bool) -> None:
        history = self._history
        try:
            if history is not None:
                history.read_within(None)
                if self.found is None:
                    history.fetch()
                    self._check_rows(history, None)
        finally:
            self._history = self._own = None
            self._states.clear()
        self._react()
        if check_watched and history is not None:
            self._check_watched(history)

    def _check_watched(self, history: History) -> None:
        """A name in `watch` that no row of `history` holds guarded nothing: an
        error naming it (a typo must not silently switch the guard off)."""
        if self.watch is None or len(history) == 0:
            return
        logged = list(history._columns)
        missing = [
            key for key in self.watch if locate(logged, key, "nan_guard") is None
        ]
        if missing:
            names = ", ".join(f"{key!r}" for key in missing)
            raise ValueError(
                f"nan_guard: the watched {'entry' if len(missing) == 1 else 'entries'}"
                f" {names} {'was' if len(missing) == 1 else 'were'} never logged in "
                f"this run, so nothing guarded {'it' if len(missing) == 1 else 'them'}"
                f". Logged: {', '.join(f'{c}.{n}' for c, n in logged) or 'nothing'}. "
                f'Name an entry in `watch` (bare, "loss", or "collection.name").'
            )

    def __loop_end__(self, loop_state: Any) -> None:
        """Checks what is still unchecked when the loop ends; a watched name
        never logged in a run that ended normally is an error (`close`)."""
        ended = getattr(loop_state, "error", None) is None and not interrupted(
            loop_state
        )
        self._close(check_watched=ended)

    def reset(self) -> None:
        """Forgets a found value and the good state (to guard a new run)."""
        self.found, self.good_state, self._error = None, None, None
        self._history = self._own = None
        self._states.clear()
