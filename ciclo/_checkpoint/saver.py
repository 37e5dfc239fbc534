"""`Store`: how `ciclo.checkpoint` writes and reads the checkpoints of its directory.

A checkpoint HAS a store (`checkpoint.store`), which decides nothing about when
to save: the directory's lock, its orbax manager with the retention policy
(`ranking`), one save, resuming from the latest complete step, waiting for the
saves, and reading the directory's steps back.

A directory is one timeline: saving step `s` first deletes checkpoints at steps
`>= s` left there by an earlier run (with a warning), then saves; earlier steps
are kept and take part in retention, so a resumed run continues its directory. A
directory holding a step folder ciclo did not write is refused with a ValueError
before anything in it is read or deleted (`_orbax.check_layout`).

Faults: a save that finds the disk full ends in one clear `OSError` (`_faults`; the
partial step removed, the manager dropped); a directory is written by one run at a
time (`_lock`: taken when a loop with the checkpoint starts or at a save by hand,
then what kills left there is removed: `_orbax.tidy`; released when the loop
ends or at `close()`). Older checkpoints are deleted kill-safely (renamed out of
the step namespace, then removed: `_orbax.kill_safe`).
"""

from __future__ import annotations

import contextlib
import math
import weakref
from typing import Any

import orbax.checkpoint as ocp
from etils import epath

from ciclo._checkpoint import faults as _faults
from ciclo._checkpoint import history_segments as _history
from ciclo._checkpoint import integrity as _integrity
from ciclo._checkpoint import lock as _lock
from ciclo._checkpoint import orbax as _orbax
from ciclo._checkpoint.agree import agreed
from ciclo._checkpoint.layout import host_layout, select
from ciclo._checkpoint.pending import open_checkpoints, track, untrack
from ciclo._checkpoint.ranking import best_key, retention, score
from ciclo._checkpoint.restore import restore_from
from ciclo._history.transfer import explicit
from ciclo._input.resume import data_state_to_json
from ciclo._interrupts import DEFERRED, reached_preemption
from ciclo._time import Elapsed
from ciclo._warn import warn
from ciclo.callbacks._monitor import Monitor

__all__ = ["Store"]


class Store:
    """Writes the checkpoints of `directory` through an orbax manager (opened on
    first use, closed by `close()`), and reads them back.

    Args (validated by `ciclo.checkpoint`): the directory, the `Monitor` that
    ranks steps (or None), how many steps to `keep`, `async_save`, the state's
    `items` to save (None: all), and whether to `resume` before the first loop.
    """

    def __init__(
        self,
        directory: epath.Path,
        monitor: Monitor | None,
        keep: int,
        async_save: bool,
        items: tuple[str, ...] | None,
        resume: bool,
    ):
        self.directory, self.monitor, self.keep = directory, monitor, keep
        self.async_save, self.items = async_save, items
        self.resume_pending = resume  # a resume is still to come (first loop)
        self.saved: set[int] = set()  # the steps this store saved
        self.skipped: set[int] = set()  # steps a resume skipped as unreadable
        self._manager: ocp.CheckpointManager | None = None  # open, or None
        self._pending: int | None = None  # the step of a save not known written
        self._locked = False  # holds the directory's lock
        self._history_base: _history.Base | None = None  # the next save builds on

    @property
    def is_open(self) -> bool:
        """Whether its orbax manager is open (saves may be pending)."""
        return self._manager is not None

    def save(
        self,
        elapsed: Elapsed,
        state: Any,
        value: float | None,
        history: tuple[Any, Any, Any] | None = None,
        data: Any = None,
        kept: dict[str, Any] | None = None,
    ) -> None:
        """Saves `state` at `elapsed.steps`; `history`: `(history, row, batch)`,
        the run's `History` with the step's `(elapsed, logs)` when they are not
        committed yet (and the fused call `batch` they stand for), else None;
        `kept`: the loop's objects' states (`__loop_state__`, JSON data)."""
        with DEFERRED:  # Ctrl-C meanwhile: raised once the save has started
            self._start_save(elapsed, state, value, history, data, kept)

    def _start_save(
        self,
        elapsed: Elapsed,
        state: Any,
        value: float | None,
        history: tuple[Any, Any, Any] | None,
        data: Any,
        kept: dict[str, Any] | None = None,
    ) -> None:
        self.resume_pending = False  # this run has its own timeline now
        for other in open_checkpoints():
            if other is not self and self._writes_beside(other):
                raise ValueError(
                    f"Two ciclo.checkpoint writers save to {self.directory}: their "
                    f"saves would collide. Use one checkpoint per directory (with "
                    f"train_loop(resume=...), the checkpoint in `callbacks` for that "
                    f"directory is the one that resumes), or give each its own "
                    f"directory."
                )
        self.lock()
        try:
            manager = self.open()
        except BaseException:  # e.g. a directory that is not ciclo's
            self._unlock()
            raise
        step = int(elapsed.steps)
        self._finish(manager)  # the previous save: written, or a clear error
        stale = [s for s in manager.all_steps() if s >= step]
        if stale:  # never delete what is not ours; on several processes, all
            failed = None  # check before any (process 0) deletes
            try:
                _orbax.check_layout(manager, stale)
            except ValueError as error:
                failed = error
            failed = agreed(failed, str)
            if failed is not None:
                raise failed
            foreign = [
                s for s in stale if s not in self.saved and s not in self.skipped
            ]
            if foreign:
                warn(
                    f"ciclo.checkpoint: {self.directory} has checkpoints at steps "
                    f"{foreign} from an earlier run, not before this save at step "
                    f"{step}; deleting them (one directory is one timeline). Use a "
                    f"new directory to keep them."
                )
            for s in stale:
                manager.delete(s)
        metrics = None
        if self.monitor is not None:  # unranked (no value): no score
            metrics = {"monitor": self.monitor.name, "mode": self.monitor.mode}
            if value is not None:
                metrics.update(score=self.monitor.score(value), value=value)
        with explicit():  # a deliberate fetch: allowed under transfer_guard("disallow")
            state = select(host_layout(state), self.items)
        wrapped = _orbax.is_leaf(state)
        saved = _orbax.elapsed_json(elapsed, wrapped)
        if self.items is not None:
            saved["items"] = list(self.items)
        sums = _integrity.checksums([state] if wrapped else state)
        if sums is not None:  # checked when read back: damaged bytes never load
            saved["checksums"] = sums
        if data is not None:
            saved["data"] = data_state_to_json(data)
        if kept:
            saved["callbacks"] = kept
        if history is not None:
            saved["history"] = True  # its absence when read back is damage
        items = {
            "state": ocp.args.StandardSave([state] if wrapped else state),
            "elapsed": ocp.args.JsonSave(saved),
        }
        plan = None
        if history is not None:  # the rows since the previous save (`_history`)
            rows, row, batch = history
            plan = _history.plan(
                self._history_base, rows, step, manager.all_steps(),
                self.directory, row, batch,
            )  # fmt: skip
            items["history"] = _history.HistorySave(plan)
        self._history_base = None  # until this save has started
        self._pending = step
        try:
            with explicit():  # orbax starts its device-to-host copies here
                manager.save(
                    step,
                    args=ocp.args.Composite(**items),
                    metrics=metrics,
                    force=True,
                )
        except Exception as error:
            self._failed(error)
            raise
        self.saved.add(step)
        if plan is not None:
            self._history_base = plan.base(step, history[0])  # type: ignore[index]
        if not self.async_save:
            self._pending = None

    def _writes_beside(self, other: Store) -> bool:
        """Whether `other` is a writer of this directory: it saved there and still
        holds the directory (a loop, or saves by hand not closed). One whose
        loop ended, queried since (`steps()`, `restore`), is not."""
        if other.directory != self.directory or not other.saved:
            return False
        return other._locked or "://" in str(self.directory)  # URLs take no lock

    def _finish(self, manager: ocp.CheckpointManager) -> None:
        """Waits for the pending save; a disk-full failure becomes one clear error."""
        try:
            manager.wait_until_finished()
        except Exception as error:
            self._failed(error)
            raise
        self._pending = None

    def _failed(self, error: Exception) -> None:
        """After a save failed: a full disk raises its one clear error (the partial
        step removed, the manager dropped); any other error is left to propagate."""
        step, self._pending = self._pending, None
        self._history_base = None  # the next save writes the whole history
        if step is None or not _faults.is_disk_full(error):
            return
        manager, self._manager = self._manager, None
        untrack(self)
        clear = _faults.disk_full(self.directory, step, error)  # writes settled
        _abandon(manager)
        raise clear from None

    def lock(self) -> None:
        """Takes the directory's lock (one run writes it), then removes what
        saves killed mid-write left there."""
        if self._locked or "://" in str(self.directory):  # URLs: orbax cleans up
            return
        _lock.acquire(self.directory, then=_orbax.tidy)
        self._locked = True
        if self._manager is not None:  # opened before: `tidy` may have removed steps
            self._manager.reload()

    def _unlock(self) -> None:
        if self._locked:
            self._locked = False
            _lock.release(self.directory)

    def open(self) -> ocp.CheckpointManager:
        if self._manager is None:
            policy = retention(self.keep, self.monitor is not None)
            manager = _orbax.manager(
                self.directory,
                preservation_policy=policy,
                # best_fn makes orbax write the metrics; retention is `policy`.
                best_fn=None if self.monitor is None else score,
                best_mode="max",
                enable_async_checkpointing=self.async_save,
            )
            # orbax asks jax's preemption sync point too (at saves, from its
            # finalize thread, with older steps): the loop's answer instead, so
            # that only the loop moves the step count the processes agree on
            manager.reached_preemption = reached_preemption
            try:  # before retention or a timeline cut could delete them
                _orbax.check_layout(manager)
            except BaseException:
                manager.close()
                raise
            self._manager = manager
            track(self)
        return self._manager

    def resume(self, state: Any) -> tuple[Any, ...] | None:
        """Restores the latest complete checkpoint of the directory, once (the
        lock taken: a loop is about to write here): `(state, history, elapsed)`
        (+ the data iterator's saved position, when there is one), or None when
        the resume was done already or the directory holds none. The next save's
        history builds on the restored segments."""
        self.lock()
        if not self.resume_pending:
            return None
        self.resume_pending = False
        try:
            manager = self.open()
            steps = manager.all_steps()
            if not steps:
                return None
            state, elapsed, history, data, segments, kept = restore_from(
                manager, state, False, None, with_history=True, fallback=True
            )
        except BaseException as error:
            self.close()  # the loop does not start: nothing to hold
            if isinstance(error, ValueError):  # e.g. a model edited since
                error.add_note(
                    f"Resuming from {str(self.directory)!r}: the state passed in "
                    f"must be built like the saved one. To start fresh instead, "
                    f"pass a new directory or resume=False."
                )
            raise
        if segments is not None:  # the next save adds to its segments
            self._history_base = _history.Base(
                int(elapsed.steps), len(history), weakref.ref(history),
                _history.Written(segments),
            )  # fmt: skip
        self.skipped = {s for s in steps if s > elapsed.steps}
        if data is None and not kept:
            return state, history, elapsed
        return state, history, elapsed, data, kept

    def wait(self) -> None:
        """Blocks until the background saves are written (re-raises their errors)."""
        if self._manager is not None:
            self._finish(self._manager)

    def close(self) -> None:
        """Waits for the saves and releases orbax's resources (reopened on use)
        and the directory's lock."""
        with DEFERRED:  # Ctrl-C meanwhile: raised once the saves are written
            self._close()

    def _close(self) -> None:
        try:
            manager = self._manager
            if manager is not None:
                try:
                    self._finish(manager)  # a full disk: its one clear error
                    manager.close()
                except BaseException:
                    _abandon(manager)
                    raise
                finally:
                    self._manager = None
                    untrack(self)
        finally:
            self._unlock()

    def steps(self) -> list[int]:
        """The steps of the checkpoints in the directory (after pending saves);
        incomplete step folders (a kill or damage left them) are not listed."""
        self.wait()
        manager = self.open()
        if not self._locked:  # not writing it: another run may have since
            manager.reload()
        return _orbax.survey(self.directory, manager.all_steps()).complete

    def latest_step(self) -> int | None:
        """The step of the latest checkpoint, or None."""
        steps = self.steps()
        return steps[-1] if steps else None

    def best_step(self) -> int | None:
        """The step of the best checkpoint by `monitor` (the latest without it)."""
        steps = self.steps()
        if self.monitor is None or not steps:
            return steps[-1] if steps else None
        manager = self.open()
        scored = [s for s in steps if score(manager.metrics(s)) > -math.inf]
        if not scored:
            return steps[-1]
        return max(scored, key=lambda s: best_key(s, manager.metrics(s)))

    def restore(
        self, target_state: Any = None, *, best: bool = False, step: int | None = None
    ) -> tuple[Any, Elapsed]:
        """Restores `(state, elapsed)`: the latest checkpoint, or with `best=True`
        the best by `monitor`. See `ciclo.restore`."""
        self.wait()
        return restore_from(self.open(), target_state, best, step)


def _abandon(manager: ocp.CheckpointManager | None) -> None:
    """Releases what it can of a manager whose save failed (its own close would
    raise the failure again)."""
    for name in (
        "_checkpointer",
        "_non_blocking_metadata_store",
        "_blocking_metadata_store",
        "_checkpoint_deleter",
    ):
        part = getattr(manager, name, None)
        with contextlib.suppress(Exception):  # best effort: the failure is raised
            part.close()  # type: ignore[union-attr]
