"""How `ciclo.checkpoint` takes part in a loop: a save per call, resume, the end.

In a loop the checkpoint saves at each call (the state after the current batch,
its `elapsed_after`, the history so far with this step's logs, and where a
checkpointable data iterator is); with `resume=True` it restores the latest
complete checkpoint before the first loop it is given to; when the loop ends it
waits for the background saves and, with `monitor`, checks that the monitored
entry was logged at least once. Monitored checkpoints are ranked only by a value
logged in the step they are taken at (`_ranking`).
"""

from __future__ import annotations

import warnings
from typing import Any

from ciclo._history import History
from ciclo._time import Elapsed
from ciclo.callbacks._history_item import history_json
from ciclo.callbacks._monitor import logged
from ciclo.callbacks._restore import restore_from
from ciclo.callbacks._saver import Saver

__all__ = ["LoopCheckpoint"]


class LoopCheckpoint(Saver):
    """A `Saver` as a loop callback: the hooks `ciclo.loop` calls."""

    _unranked: bool  # this loop saved without a fresh monitored value
    _fresh: bool  # this loop saved with a fresh monitored value
    _returned: Elapsed | None  # what the last loop it ran in returned

    def __loop_callback__(self, loop_state: Any) -> tuple[None, None]:
        elapsed = loop_state.elapsed_after
        value = None
        if self.monitor is not None:  # ranked only by a value logged this step
            if logged(loop_state.logs, self.monitor.name):
                value = self.monitor.read(loop_state.logs)
                self._fresh = True
            else:  # saved unranked; checked at the loop's end that it was logged
                self._unranked = True
        # the history so far, this step's logs included (committed after the batch)
        # (a fused call's per-step rows too: the loop commits them after the batch)
        rows = history_json(
            loop_state.history,
            (loop_state.elapsed, loop_state.logs),
            loop_state.batch,
        )
        data = loop_state.data_state()  # where a checkpointable iterator is
        self._save(elapsed, loop_state.state, value, rows, data)
        return None, None

    def __loop_resume__(
        self, state: Any, history: History | None, elapsed: Elapsed | None
    ) -> tuple[Any, ...] | None:
        """With `resume=True`, before the first loop it is given to: the state,
        history and elapsed of the latest complete checkpoint (and the saved
        position of a checkpointable data iterator, when there is one), or None
        (start fresh) when the directory holds none."""
        if not self._resume_pending:
            self._lock()  # a loop is about to write here: one run per directory
            return None
        self._resume_pending = False
        try:
            self._lock()
            manager = self._open()
            steps = manager.all_steps()
            if not steps:
                return None
            state, elapsed, history, data = restore_from(
                manager, state, False, None, with_history=True, fallback=True
            )
        except BaseException:
            self.close()  # the loop does not start: nothing to hold
            raise
        self._skipped = {s for s in steps if s > elapsed.steps}
        if data is None:
            return state, history, elapsed
        return state, history, elapsed, data  # + the data iterator's position

    def __loop_end__(self, loop_state: Any) -> None:
        """Waits for the background saves (called once when the loop ends); with
        `monitor`, raises if the monitored entry was never logged in the loop.

        When the loop is ending because of an exception (a callback's error, an
        uncaught Ctrl-C), that exception is the one that propagates: the pending
        saves are finished, a save that failed is only warned about, and the
        monitored entry is not checked."""
        # the loop returns this very object: recognised if passed back by hand
        self._returned = loop_state.elapsed_after
        unranked, fresh = self._unranked, self._fresh
        self._unranked = self._fresh = False
        failing = getattr(loop_state, "error", None)  # the loop's own error
        if failing is None:
            self.close()
            if unranked and not fresh and self.monitor is not None:
                self.monitor.find(loop_state.accumulated_logs)  # names what was logged
            return
        try:
            self.close()
        except Exception as error:  # the loop's own error goes on, not this one
            warnings.warn(
                f"ciclo.checkpoint: a pending save to {self.directory} failed while "
                f"the loop was ending with {type(failing).__name__}: "
                f"{type(error).__name__}: {error}",
                stacklevel=2,
            )
