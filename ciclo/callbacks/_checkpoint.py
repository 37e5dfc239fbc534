"""`checkpoint` and `restore`: save the state and its `Elapsed` with orbax-checkpoint.

Each checkpoint is an orbax step directory named by `elapsed.steps` — the batches
already trained INTO the saved state — holding two items: `state` (the pytree, via
`StandardSave`) and `elapsed` (JSON). Saves are asynchronous (orbax writes in the
background) and are finished before the loop returns.

Retention: without `monitor`, the `keep` latest checkpoints. With `monitor`, the
`keep` best by that metric AND the latest one (orbax's `best_fn` with `max_to_keep`
alone would delete the newest when it is not among the best, and a resume would go
back silently), combined as `AnyPreservationPolicy([LatestN(1), BestRanked(keep)])`.
Among equal values the earliest checkpoint is the better one, as in Keras and
Lightning (only a strict improvement replaces the best).

A directory is one timeline: saving step `s` first deletes checkpoints at steps
`>= s` left there by an earlier run (with a warning), then saves; earlier steps are
kept and take part in retention, so a resumed run continues its directory. A
directory holding a step folder ciclo did not write (no `elapsed` item, e.g.
`7/weights.bin`) is refused with a ValueError before anything in it is read or
deleted.

A managed state (`ManagedState`, `FlaxState`) is saved in its single-device host
layout and restored into the target's strategy, so a checkpoint saved under one
strategy or device count restores under any other.

Faults: a checkpoint that does not read back whole (a damaged file, or array bytes
that differ from the checksums saved beside them: `_integrity`) is never loaded
(resume falls back past it with a warning, `restore` names it:
`_orbax.restore_from`); a save
that finds the disk full ends in one clear `OSError` (`_faults`); a directory is
written by one run at a time (`_lock`: taken when a loop with the checkpoint starts
or at a save by hand, released when the loop ends or at `close()`).
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import sys
import threading
import warnings
from collections.abc import Mapping
from typing import Any

import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as policies

from ciclo._history import History
from ciclo._resume import data_state_to_json
from ciclo._time import Elapsed, batch_size
from ciclo._transfer import explicit
from ciclo.callbacks import _faults, _integrity, _lock, _orbax
from ciclo.callbacks._monitor import Monitor

__all__ = ["checkpoint", "restore"]

# The checkpoints of this process whose orbax manager is open (saves may be pending),
# by id; strong references, so a callback dropped by the user still finishes.
_OPEN: dict[int, checkpoint] = {}
_exit_hook = False


def _track(ckpt: checkpoint) -> None:
    """Remembers `ckpt` until it is closed; at normal interpreter exit its pending
    saves are finished before Python refuses new threads (orbax needs them)."""
    global _exit_hook
    _OPEN[id(ckpt)] = ckpt
    if not _exit_hook:
        _exit_hook = True
        try:  # runs before concurrent.futures shuts its executors down
            threading._register_atexit(_finish_pending)  # type: ignore[attr-defined]
        except (AttributeError, RuntimeError):
            atexit.register(_finish_pending)


def _finish_pending() -> None:
    """Finishes every pending save at interpreter exit, quietly (one line on error)."""
    for ckpt in list(_OPEN.values()):
        try:
            ckpt.close()
        except BaseException as error:  # exit must go on
            _OPEN.pop(id(ckpt), None)
            print(
                f"ciclo.checkpoint: a save to {ckpt.directory} did not finish at "
                f"exit: {type(error).__name__}: {error}",
                file=sys.stderr,
            )


def _wait_for(directory: Any) -> None:
    """Waits for this process's pending saves to `directory`."""
    for ckpt in list(_OPEN.values()):
        if ckpt.directory == directory:
            ckpt.wait()


def restore(
    directory: str | os.PathLike,
    target_state: Any = None,
    *,
    best: bool = False,
    step: int | None = None,
) -> tuple[Any, Elapsed]:
    """Restores `(state, elapsed)` from a directory written by `ciclo.checkpoint`.

    The restored `Elapsed` counts the batches already trained into the state, so
    `ciclo.train_loop(state, data_from(elapsed.steps), elapsed=elapsed, ...)` resumes
    with the next unseen batch.

    Args:
        directory: the checkpoint directory.
        target_state: a state with the structure, dtypes and shardings to restore
            into (e.g. a freshly initialised one); None returns orbax's raw pytree.
            A managed state is restored under its own strategy, whatever the
            strategy and device count the checkpoint was saved with.
        best: restore the best checkpoint by the monitored metric instead of the
            latest (the default, which is what resuming needs).
        step: restore this step instead.

    Returns:
        `(state, elapsed)`.

    Raises:
        ValueError: if there is no checkpoint, no such step, `best=True` and the
            checkpoints were saved without `monitor`, the directory holds step
            folders ciclo did not write, or `target_state` does not have the
            structure or shapes of the saved state (the message names the
            differing paths); if the checkpoint does not read back whole
            (damaged or deleted files: nothing of it is loaded; the message names
            the step and the fix, `step=` an older one or deleting it).

    Example:
        >>> import tempfile, jax.numpy as jnp, ciclo
        >>> directory = tempfile.mkdtemp()
        >>> ckpt = ciclo.checkpoint(directory)
        >>> ckpt(ciclo.Elapsed.create(steps=4), {"w": jnp.ones(2)})
        >>> ckpt.close()
        >>> state, elapsed = ciclo.restore(directory, {"w": jnp.zeros(2)})
        >>> state["w"].tolist(), elapsed.steps
        ([1.0, 1.0], 5)
    """
    path = _orbax.path(directory)
    _wait_for(path)
    if not path.exists():
        raise ValueError(f"No checkpoint directory {path}.")
    manager = _orbax.manager(path, create=False, enable_async_checkpointing=False)
    try:
        return _orbax.restore_from(manager, target_state, best, step)
    finally:
        manager.close()


class checkpoint:
    """Saves the state and its `Elapsed` with orbax-checkpoint at each call.

    In `ciclo.train_loop(callbacks=[...])` it runs on `on_epoch_end`; in `ciclo.loop`
    give it a schedule (`{ciclo.every(1000): [train_step, ckpt]}`, after the train
    step). The checkpoint's step is the number of batches trained into the saved
    state: in a loop it counts the current batch (a checkpoint taken after batch 4
    — the 5th — says `steps == 5`). Called by hand, `ckpt(elapsed, state)` takes
    the `elapsed` that `ciclo.elapse` gave with the batch the state was just
    trained on, and also counts that batch (pass `batch=` so samples count it too).

    Each checkpoint also holds the run's history up to it (this step's logs so far
    included), so that a resumed run continues it. Saves are asynchronous; the loop
    waits for them when it ends (normally, on Ctrl-C or on an error). By hand,
    pending saves finish when the interpreter exits normally and `ciclo.restore` in
    the same process waits for them; `wait()` / `close()` finish them now.

    Args:
        directory: where to save (created if missing; a local path or a URL orbax
            supports, e.g. `gs://...`).
        monitor: keep the best checkpoints by this logged entry (bare name or
            `"collection.name"`, e.g. `"accuracy_test"`); None keeps the latest.
        mode: `"min"` or `"max"`: whether lower or higher `monitor` is better.
        keep: how many checkpoints to keep: the latest ones, or with `monitor` the
            best ones (the latest is always kept too, to resume from).
        async_save: write in the background (orbax async checkpointing).
        resume: before the first loop it is given to (`train_loop(callbacks=[...])`,
            or any task of `ciclo.loop`), restore the latest complete checkpoint of
            `directory` — state (optimizer state and RNG included), `elapsed` and
            the history so far — and start the data there: a dataset given as a
            factory `dataset(start_step)` is called with it, a plain iterable is
            advanced past the consumed batches (with a warning). With no complete
            checkpoint there (none, or only one killed mid-write), start fresh.
            Newer checkpoints that do not read back whole (damaged files) are
            skipped with a warning; if none reads back, a ValueError (never a
            silent fresh start).
        items: save only these fields of the state (attribute names of a
            dataclass / Flax struct such as `"params"`, or keys of a dict), e.g.
            `items=["params", "batch_stats"]` to leave the optimizer state out.
            Restoring such a checkpoint needs a target state: the saved fields are
            put into it and the others are the target's (a resumed run keeps a
            fresh optimizer state).

    Monitored checkpoints are ranked only by a fresh value: in a loop, one logged
    in this step (for an epoch end, this epoch's test loop); a checkpoint taken
    when the monitored entry was not logged this step (e.g. the test loop ran only
    every n epochs) is saved and kept as the latest, but not ranked. An entry
    never logged in the whole loop is an error when the loop ends normally (a
    loop ending with an error raises that error alone). Ties: among checkpoints
    with the same best value the EARLIEST is the best one (the one kept, and the
    one `best=True` restores), as Keras' `ModelCheckpoint(save_best_only=True)`
    and Lightning, where only a strict improvement replaces the best.

    Raises:
        TypeError: if `directory` is not a path, `keep` not an int, or `items`
            not a name or a list of names.
        ValueError: if `keep < 1` or `mode` is not "min"/"max"; at a save, if the
            monitored metric was not logged (the message lists what was).
        RuntimeError: when a loop starts with it, or at a save by hand, if another
            live run holds the directory (its lock file `ciclo.lock` names the
            host, pid and start time; a dead run's lock is taken over with a
            warning). The lock is released when the loop ends or at `close()`.
        OSError: (errno ENOSPC) at a save, when the disk is full: one error
            naming the directory, the step not saved and the previous checkpoint,
            which is intact (the partial files are removed).

    Example:
        >>> import tempfile, jax.numpy as jnp, ciclo
        >>> def train_step(state, batch):
        ...     logs = ciclo.logs()
        ...     _ = logs.add_metric("accuracy", batch / 10)
        ...     return logs, state + batch
        >>> directory = tempfile.mkdtemp()
        >>> ckpt = ciclo.checkpoint(directory, monitor="accuracy", mode="max")
        >>> _ = ciclo.loop(
        ...     jnp.array(0), [3, 9, 1], {ciclo.every(1): [train_step, ckpt]}
        ... )
        >>> ckpt.steps(), ckpt.best_step()
        ([2, 3], 2)
        >>> state, elapsed = ckpt.restore(jnp.array(0), best=True)
        >>> int(state), elapsed.steps
        (12, 2)

        Resuming in one line (here the second run continues the first):

        >>> directory = tempfile.mkdtemp()
        >>> def run(stop):
        ...     ckpt = ciclo.checkpoint(directory, resume=True)
        ...     return ciclo.loop(jnp.array(0), lambda start: range(start, 10),
        ...                       {ciclo.every(1): [train_step], ciclo.every(3): ckpt},
        ...                       stop=stop)
        >>> _ = run(stop=5)  # saved after batches 0 and 3: steps 1 and 4
        >>> state, history, elapsed = run(stop=10)  # restarts at batch 4
        >>> int(state), elapsed.steps, history.collect("steps")[:6]
        (45, 10, [0, 1, 2, 3, 4, 5])
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        monitor: str | None = None,
        mode: str = "min",
        keep: int = 1,
        async_save: bool = True,
        resume: bool = False,
        items: str | list[str] | tuple[str, ...] | None = None,
    ):
        self.items = _orbax.as_items(items)
        if isinstance(keep, bool) or not isinstance(keep, int):
            raise TypeError(f"`keep` must be an int, got {keep!r}.")
        if keep < 1:
            raise ValueError(
                f"`keep` must be >= 1 (checkpoints to keep), got {keep}; to save "
                f"nothing, don't add a checkpoint callback."
            )
        self.directory = _orbax.path(directory)
        self.monitor = (
            None if monitor is None else Monitor(monitor, mode, owner="checkpoint")
        )
        if monitor is None and mode not in ("min", "max"):
            raise ValueError(f"`mode` must be 'min' or 'max'; got {mode!r}.")
        self.keep = keep
        self.async_save = bool(async_save)
        if not isinstance(resume, bool):
            raise TypeError(
                f"`resume` must be True or False, got {resume!r} "
                f"({type(resume).__name__}); the directory is the first argument: "
                f"ciclo.checkpoint('ckpts/', resume=True)."
            )
        self.resume = resume
        self._resume_pending = resume  # resumes once, before the first loop
        self._manager: ocp.CheckpointManager | None = None
        self._saved: set[int] = set()
        self._unranked = self._fresh = False  # this loop's saves, with monitor
        self._returned: Elapsed | None = None  # what the last loop it ran in returned
        self._locked = False  # holds the directory's lock (one run per directory)
        self._pending: int | None = None  # the step of a save not known written yet
        self._skipped: set[int] = set()  # steps the resume skipped as unreadable

    # -- registration -----------------------------------------------------------
    @property
    def on_epoch_end(self) -> checkpoint:
        """The callback itself: `train_loop(callbacks=[ckpt])` saves each epoch."""
        return self

    # -- saving -------------------------------------------------------------------
    def __call__(
        self,
        elapsed: Elapsed,
        state: Any,
        logs: Mapping[str, Mapping[str, Any]] | None = None,
        *,
        batch: Any = None,
        history: History | None = None,
        consumed: bool = False,
    ) -> None:
        """Saves `state` by hand, after training it on the batch `elapsed` came with.

        The checkpoint records the batches trained into `state`. The rule: by
        default `elapsed` is the one `ciclo.elapse` gave with the batch just
        trained on (counted before it), so the checkpoint records
        `elapsed.steps + 1`. An `elapsed` that already counts every consumed
        batch — the one a loop returned, `ciclo.iterate`'s,
        `loop_state.elapsed_after`, or a restored one — is passed with
        `consumed=True` and recorded as it is. The one exception is detected:
        the very `Elapsed` returned by a loop this checkpoint ran in is recorded
        as is, with a warning to pass `consumed=True` (a checkpoint that did not
        run in the loop cannot tell, and records `elapsed.steps + 1`).

        Args:
            elapsed: the `Elapsed` from `ciclo.elapse` for that batch; the checkpoint
                records `elapsed.steps + 1` (and with `batch`, its samples too);
                with `consumed=True`, the `Elapsed` after the batches (recorded
                as is).
            state: the state to save.
            logs: the step's logs; required with `monitor`.
            batch: the batch, to count its samples.
            history: the run's `History`, saved beside the state (with `logs` as
                the step's row when they are not committed yet) so that a resumed
                run continues it.
            consumed: whether `elapsed` already counts the batch `state` was
                trained on (see above).

        Raises:
            ValueError: with `monitor` and no `logs`, or `batch` with
                `consumed=True` (the batch is counted already).

        Example:
            >>> import tempfile, ciclo
            >>> ckpt = ciclo.checkpoint(tempfile.mkdtemp(), async_save=False)
            >>> state, _, elapsed = ciclo.loop(0, [1, 2], {ciclo.every(1): ciclo.noop})
            >>> ckpt(elapsed, {"w": 1.0}, consumed=True)  # a loop's elapsed: 2 steps
            >>> ckpt.latest_step()
            2
        """
        if not isinstance(consumed, bool):
            raise TypeError(
                f"checkpoint: `consumed` must be True or False, got {consumed!r}."
            )
        if not consumed and self._returned is not None and elapsed is self._returned:
            consumed = True
            warnings.warn(
                f"ciclo.checkpoint: ckpt(elapsed, state) was given the `elapsed` "
                f"the loop returned (this checkpoint ran in that loop), which "
                f"already counts the loop's last batch: recorded as step "
                f"{elapsed.steps}, not {elapsed.steps + 1}. Say so with "
                f"ckpt(elapsed, state, consumed=True); without it a checkpoint that "
                f"did not run in the loop records elapsed.steps + 1 (the rule for "
                f"ciclo.elapse's before-the-batch `elapsed`).",
                stacklevel=2,
            )
        if consumed and batch is not None:
            raise ValueError(
                "checkpoint(..., consumed=True, batch=...): with consumed=True "
                "`elapsed` already counts the batch's samples; drop `batch=`."
            )
        size = 0 if batch is None else batch_size(batch)
        value = None
        if self.monitor is not None:
            if not logs:
                raise ValueError(
                    f"checkpoint(monitor={self.monitor.name!r}) needs the step's "
                    f"logs: call it as ckpt(elapsed, state, logs)."
                )
            value = self.monitor.read(logs)
        rows = None
        if history is not None:
            steps = history.collect("elapsed.steps")  # committed already?
            uncommitted = logs and not (steps and steps[-1] == elapsed.steps)
            if consumed:  # the step's row is committed before a loop returns
                uncommitted = False
            rows = _orbax.history_json(
                history, (elapsed, logs) if uncommitted else None
            )
        self._save(elapsed if consumed else elapsed.update(size), state, value, rows)

    def __loop_callback__(self, loop_state: Any) -> tuple[None, None]:
        elapsed = loop_state.elapsed_after
        value = None
        if self.monitor is not None:  # ranked only by a value logged this step
            if _orbax.logged(loop_state.logs, self.monitor.name):
                value = self.monitor.read(loop_state.logs)
                self._fresh = True
            else:  # saved unranked; checked at the loop's end that it was logged
                self._unranked = True
        # the history so far, this step's logs included (committed after the batch)
        rows = _orbax.history_json(
            loop_state.history, (loop_state.elapsed, loop_state.logs)
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
            state, elapsed, history, data = _orbax.restore_from(
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

    def _save(
        self,
        elapsed: Elapsed,
        state: Any,
        value: float | None,
        history: dict[str, Any] | None = None,
        data: Any = None,
    ) -> None:
        self._resume_pending = False  # this run has its own timeline now
        for other in list(_OPEN.values()):
            if other is not self and other.directory == self.directory and other._saved:
                raise ValueError(
                    f"Two ciclo.checkpoint writers save to {self.directory}: their "
                    f"saves would collide. Use one checkpoint per directory (with "
                    f"train_loop(resume=...), the checkpoint in `callbacks` for that "
                    f"directory is the one that resumes), or give each its own "
                    f"directory."
                )
        self._lock()
        try:
            manager = self._open()
        except BaseException:  # e.g. a directory that is not ciclo's
            self._unlock()
            raise
        step = int(elapsed.steps)
        self._finish(manager)  # the previous save: written, or a clear error
        stale = [s for s in manager.all_steps() if s >= step]
        if stale:
            _orbax.check_layout(manager, stale)  # never delete what is not ours
            foreign = [
                s for s in stale if s not in self._saved and s not in self._skipped
            ]
            if foreign:
                warnings.warn(
                    f"ciclo.checkpoint: {self.directory} has checkpoints at steps "
                    f"{foreign} from an earlier run, not before this save at step "
                    f"{step}; deleting them (one directory is one timeline). Use a "
                    f"new directory to keep them.",
                    stacklevel=3,
                )
            for s in stale:
                manager.delete(s)
        metrics = None
        if self.monitor is not None:  # unranked (no value): no score
            metrics = {"monitor": self.monitor.name, "mode": self.monitor.mode}
            if value is not None:
                metrics.update(score=self.monitor.score(value), value=value)
        with explicit():  # a deliberate fetch: allowed under transfer_guard("disallow")
            state = _orbax.select(_orbax.host_layout(state), self.items)
        wrapped = _orbax.is_leaf(state)
        saved = _orbax.elapsed_json(elapsed, wrapped)
        if self.items is not None:
            saved["items"] = list(self.items)
        sums = _integrity.checksums([state] if wrapped else state)
        if sums is not None:  # checked when read back: damaged bytes never load
            saved["checksums"] = sums
        if data is not None:
            saved["data"] = data_state_to_json(data)
        items = {
            "state": ocp.args.StandardSave([state] if wrapped else state),
            "elapsed": ocp.args.JsonSave(saved),
        }
        if history is not None:
            items["history"] = ocp.args.JsonSave(history)
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
        self._saved.add(step)
        if not self.async_save:
            self._pending = None

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
        if step is None or not _faults.is_disk_full(error):
            return
        manager, self._manager = self._manager, None
        _OPEN.pop(id(self), None)
        clear = _faults.disk_full(self.directory, step, error)  # writes settled
        _abandon(manager)
        raise clear from None

    def _lock(self) -> None:
        """Takes the directory's lock (one run writes it), then removes what
        saves killed mid-write left there."""
        if self._locked or "://" in str(self.directory):  # URLs: orbax cleans up
            return
        _lock.acquire(self.directory, then=_orbax.remove_partial_saves)
        self._locked = True

    def _unlock(self) -> None:
        if self._locked:
            self._locked = False
            _lock.release(self.directory)

    def _open(self) -> ocp.CheckpointManager:
        if self._manager is None:
            if self.monitor is None:
                policy = policies.LatestN(n=self.keep)
            else:
                policy = policies.AnyPreservationPolicy(
                    [policies.LatestN(n=1), _orbax.BestRanked(n=self.keep)]
                )
            manager = _orbax.manager(
                self.directory,
                preservation_policy=policy,
                # best_fn makes orbax write the metrics; retention is `policy`.
                best_fn=None if self.monitor is None else _orbax.score,
                best_mode="max",
                enable_async_checkpointing=self.async_save,
            )
            try:  # before retention or a timeline cut could delete them
                _orbax.check_layout(manager)
            except BaseException:
                manager.close()
                raise
            self._manager = manager
            _track(self)
        return self._manager

    # -- waiting, reading, restoring -----------------------------------------------
    def wait(self) -> None:
        """Blocks until the background saves are written (re-raises their errors)."""
        if self._manager is not None:
            self._finish(self._manager)

    def close(self) -> None:
        """Waits for the saves and releases orbax's resources (reopened on use)
        and the directory's lock."""
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
                    _OPEN.pop(id(self), None)
        finally:
            self._unlock()

    def steps(self) -> list[int]:
        """The steps of the checkpoints in the directory (after pending saves)."""
        self.wait()
        return list(self._open().all_steps())

    def latest_step(self) -> int | None:
        """The step of the latest checkpoint, or None."""
        steps = self.steps()
        return steps[-1] if steps else None

    def best_step(self) -> int | None:
        """The step of the best checkpoint by `monitor` (the latest without it)."""
        steps = self.steps()
        if self.monitor is None or not steps:
            return steps[-1] if steps else None
        manager = self._open()
        scored = [s for s in steps if _orbax.score(manager.metrics(s)) > -math.inf]
        if not scored:
            return steps[-1]
        return max(scored, key=lambda s: _orbax.best_key(s, manager.metrics(s)))

    def restore(
        self, target_state: Any = None, *, best: bool = False, step: int | None = None
    ) -> tuple[Any, Elapsed]:
        """Restores `(state, elapsed)`: the latest checkpoint, or with `best=True`
        the best by `monitor`. See `ciclo.restore`."""
        self.wait()
        return _orbax.restore_from(self._open(), target_state, best, step)


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


def resuming(callbacks: list[Any], directory: str | os.PathLike) -> list[Any]:
    """`train_loop(resume=directory)`: `callbacks` with a checkpoint of `directory`
    that resumes: the one already there (one writer per directory), else a new
    one, saving at each epoch end."""
    target = _orbax.path(directory)
    for callback in callbacks:
        if isinstance(callback, checkpoint) and callback.directory == target:
            callback.resume = callback._resume_pending = True
            return callbacks
    return [*callbacks, checkpoint(directory, resume=True)]
