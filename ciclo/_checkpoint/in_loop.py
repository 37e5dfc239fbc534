"""How `ciclo.checkpoint` takes part in a loop: a save per call, resume, the end.

In a loop the checkpoint saves at each call the state after the current batch,
its `elapsed_after` and where a checkpointable data iterator is, as they are at
the call; the save itself is made once the loop committed the step's row, so
that the history saved holds that row whole (entries logged by callbacks after
the checkpoint, such as `lr_monitor` after an epoch-end save, included). With a
`nan_guard` in the loop, a save whose rows since the previous save hold a value
the guard would call bad is not made (that state would replace the last finite
checkpoint; the guard stops the loop). With `resume=True` it restores the latest
complete checkpoint before the first loop it is given to; when the loop ends it
waits for the background saves and, with `monitor`, checks that the monitored
entry was logged at least once. Monitored checkpoints are ranked only by a value
logged in the step they are taken at (`_ranking`).
"""

from __future__ import annotations

import contextlib
from typing import Any

from ciclo._checkpoint.saver import Store
from ciclo._history.history import History
from ciclo._interrupts import DEFERRED
from ciclo._loop.state import LoopState, after_commit, kept_states
from ciclo._time import Elapsed
from ciclo._warn import warn
from ciclo.callbacks._monitor import logged

__all__ = ["InLoop"]


class InLoop:
    """A checkpoint's part in the loops it is given to, over its `Store`: what
    `ciclo.checkpoint`'s loop hooks do (`call`, `resume`, `preempt`, `end`)."""

    def __init__(self, store: Store):
        self.store = store
        self.unranked = False  # this loop saved without a fresh monitored value
        self.fresh = False  # this loop saved with a fresh monitored value
        self.resumed_from: int | None = None  # the step its resume restored
        self.cleared = 0  # rows from this step on are not checked finite yet
        # a save not made for a bad value: (step, entry, its row)
        self.refused: tuple[int, str, int] | None = None

    def call(self, loop_state: LoopState) -> tuple[None, None]:
        with DEFERRED:  # Ctrl-C from the call on: raised once the save started
            self._save_step(loop_state)
        return None, None

    def _save_step(self, loop_state: LoopState) -> None:
        elapsed = loop_state.elapsed_after
        value = None
        if self.store.monitor is not None:  # ranked only by a value logged this step
            if logged(loop_state.logs, self.store.monitor.name):
                value = self.store.monitor.read(loop_state.logs)
                self.fresh = True
            else:  # saved unranked; checked at the loop's end that it was logged
                self.unranked = True
        state, data = loop_state.state, loop_state.data_state()
        history, batch = loop_state.history, loop_state.batch

        def save(row: tuple[Elapsed, Any] | None = None) -> None:
            # once the step's row is committed (whole); `row`: after an error in
            # the batch, the step's row as it is
            guard = getattr(loop_state, "_nan_guard", None)
            if guard is not None and self._nonfinite(guard, history, elapsed, row):
                return
            rows = (history, row, None if row is None else batch)
            # the loop's objects as the whole batch left them (early stopping)
            self.store.save(elapsed, state, value, rows, data, kept_states(loop_state))

        save.where = f"ciclo.checkpoint({str(self.store.directory)!r}) saving"
        if not after_commit(loop_state, save):  # not a loop's: save now
            # a fused call's per-step rows too (a loop commits them after the batch)
            rows = (history, (loop_state.elapsed, loop_state.logs), batch)
            self.store.save(elapsed, state, value, rows, data)

    def _nonfinite(
        self, guard: Any, history: History, elapsed: Elapsed, row: Any = None
    ) -> bool:
        """Whether the rows since the previous save (and `row`, not committed)
        hold a value `guard` calls bad (then the save is not made, and said at
        the loop's end)."""
        since = history.first_row_at(self.cleared)
        rows = [(int(logs["elapsed"]["steps"]), logs) for logs in history[since:]]
        if row is not None:
            rows.append((int(row[0].steps), row[1]))
        for step, logs in rows:
            bad = guard.bad_entry(logs)
            if bad is not None:
                if self.refused is None:  # the first one is said
                    self.refused = (int(elapsed.steps), bad, step)
                return True
        self.cleared = int(elapsed.steps)
        return False

    def resume(
        self, state: Any, history: History | None, elapsed: Elapsed | None
    ) -> tuple[Any, ...] | None:
        """With `resume=True`, before the first loop it is given to: the state,
        history and elapsed of the latest complete checkpoint (and the saved
        position of a checkpointable data iterator, when there is one), or None
        (start fresh) when the directory holds none."""
        self.cleared = 0 if elapsed is None else int(elapsed.steps)
        restored = self.store.resume(state)
        if restored is not None:
            self.resumed_from = self.cleared = int(restored[2].steps)
        return restored

    def preempt(self, loop_state: LoopState) -> None:
        """The loop stops early for a preemption (SIGTERM): saves the step it
        reached (its history committed; unranked with `monitor`), unless that step
        is saved already, is the one this run resumed from, or (with a
        `nan_guard` in the loop) has logs that are not finite. `end`
        then waits for the save, before the process ends."""
        elapsed = loop_state.elapsed_after
        step = int(elapsed.steps)
        if step == 0 or step in self.store.saved or step == self.resumed_from:
            return
        guard = getattr(loop_state, "_nan_guard", None)
        if guard is not None and self._nonfinite(guard, loop_state.history, elapsed):
            return
        rows = (loop_state.history, None, None)
        data = loop_state.data_state()
        kept = kept_states(loop_state)
        self.store.save(elapsed, loop_state.state, None, rows, data, kept)

    def end(self, loop_state: LoopState) -> None:
        """Waits for the background saves (called once when the loop ends); with
        `monitor`, raises if the monitored entry was never logged in the loop.

        When the loop is ending because of an exception (a callback's error, an
        uncaught Ctrl-C), that exception is the one that propagates: the pending
        saves are finished, a save that failed is only warned about, and the
        monitored entry is not checked."""
        unranked, fresh = self.unranked, self.fresh
        self.unranked = self.fresh = False
        failing = getattr(loop_state, "error", None)  # the loop's own error
        if self.refused is not None:
            self._say_refused(failing)
        if failing is None:
            self.store.close()
            if unranked and not fresh and self.store.monitor is not None:
                self.store.monitor.find(
                    loop_state.accumulated_logs
                )  # names what was logged
            return
        try:
            self.store.close()
        except Exception as error:  # the loop's own error goes on, not this one
            warn(
                f"ciclo.checkpoint: a pending save to {self.store.directory} failed while "
                f"the loop was ending with {type(failing).__name__}: "
                f"{type(error).__name__}: {error}"
            )

    def _say_refused(self, failing: BaseException | None) -> None:
        """Says that a save was not made for a bad value: a note on the loop's
        error (the guard's), or a warning when the loop ends normally."""
        step, entry, row = self.refused  # type: ignore[misc]
        self.refused = None
        kept = None
        if self.store.is_open:
            with contextlib.suppress(Exception):  # a failed save is said by close()
                kept = self.store.latest_step()
        message = (
            f"ciclo.checkpoint: the checkpoint of step {step} (and any later) was "
            f"not saved: "
            f"{entry} is not finite at step {row} (nan_guard); {self.store.directory} "
            + (
                f"keeps step {kept}, the last finite one."
                if kept is not None
                else "holds no checkpoint of this run."
            )
        )
        if failing is not None:
            failing.add_note(message)
        else:
            warn(message, RuntimeWarning)
