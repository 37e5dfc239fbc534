"""`ciclo.checkpoint`: save the state and its `Elapsed` with orbax-checkpoint.

Each checkpoint is an orbax step directory named by `elapsed.steps` — the batches
already trained INTO the saved state — holding the state, its `elapsed` and the
run's history up to it (`_orbax`, `history_segments`). Saves are asynchronous (orbax
writes in the background) and are finished before the loop returns.

This module holds the public class: its arguments and what a save by hand
records. A checkpoint is composed of two parts: its `Store` (`saver.py`: the
directory's lock, orbax manager, timeline, faults, resuming) and its part in the
loops it is given to (`InLoop`, `in_loop.py`: when a save is made, resume, the
end). Around them: which checkpoints are kept (`ranking`), the state's saved
layout (`layout`), reading back (`restore`, `read`), and the saves pending at
interpreter exit (`pending`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ciclo._checkpoint import orbax as _orbax
from ciclo._checkpoint.in_loop import InLoop
from ciclo._checkpoint.layout import as_items
from ciclo._checkpoint.saver import Store
from ciclo._history.history import History
from ciclo._input.batch import batch_size
from ciclo._loop.state import LoopState
from ciclo._short import short
from ciclo._time import Elapsed, counted_by
from ciclo._warn import warn
from ciclo.callbacks._monitor import Monitor

__all__ = ["checkpoint", "resuming"]


class checkpoint:
    """Saves the state and its `Elapsed` with orbax-checkpoint at each call.

    In `ciclo.train_loop(callbacks=[...])` it runs on `on_epoch_end`; in `ciclo.loop`
    give it a schedule (`{ciclo.every(1000): [train_step, ckpt]}`, after the train
    step). The checkpoint's step is the number of batches trained into the saved
    state: in a loop it counts the current batch (a checkpoint taken after batch 4
    — the 5th — says `steps == 5`). Called by hand, `ckpt(elapsed, state)` takes
    the `elapsed` that `ciclo.elapse` gave with the batch the state was just
    trained on, and also counts that batch (pass `batch=` so samples count it too).

    Each checkpoint also holds the run's history up to it (this step's row
    included: in a loop the save is made once the step's row is committed, with
    the state as it was at the call), so that a resumed run continues it. With a
    `nan_guard` in the loop, a state whose logs since the previous save are not
    finite is not saved (the last finite checkpoint stays; said at the loop's
    end). Saves are asynchronous; the loop
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

        Used by hand, a checkpoint is a context manager: the block's end closes
        it (its saves written, the directory's lock released):

        >>> with ciclo.checkpoint(tempfile.mkdtemp()) as ckpt:
        ...     ckpt(ciclo.Elapsed.create(steps=5), jnp.array(1.0), consumed=True)
        >>> ckpt.latest_step()
        5

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

    # its hooks read a batch only when it is a fused call's `ciclo.Steps` (ciclo's
    # own stack, for its per-step rows), never a loader's buffers
    reads_batch = False

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
        chosen = as_items(items)  # validated before anything else
        if isinstance(keep, bool) or not isinstance(keep, int):
            raise TypeError(f"`keep` must be an int, got {short(keep)}.")
        if keep < 1:
            raise ValueError(
                f"`keep` must be >= 1 (checkpoints to keep), got {keep}; to save "
                f"nothing, don't add a checkpoint callback."
            )
        monitored = (
            None if monitor is None else Monitor(monitor, mode, owner="checkpoint")
        )
        if monitor is None and mode not in ("min", "max"):
            raise ValueError(f"`mode` must be 'min' or 'max'; got {short(mode)}.")
        if not isinstance(resume, bool):
            raise TypeError(
                f"`resume` must be True or False, got {short(resume)} "
                f"({type(resume).__name__}); the directory is the first argument: "
                f"ciclo.checkpoint('ckpts/', resume=True)."
            )
        self.resume = resume
        self.store = Store(
            _orbax.path(directory), monitored, keep, bool(async_save),
            chosen, resume,
        )  # fmt: skip
        self._loop = InLoop(self.store)

    # -- what it was given ---------------------------------------------------------
    @property
    def directory(self) -> Any:
        """The checkpoints' directory (an `etils.epath.Path`)."""
        return self.store.directory

    @property
    def monitor(self) -> Monitor | None:
        """The entry that ranks the checkpoints, or None."""
        return self.store.monitor

    @property
    def keep(self) -> int:
        """How many checkpoints are kept."""
        return self.store.keep

    @property
    def async_save(self) -> bool:
        """Whether saves are written in the background."""
        return self.store.async_save

    @property
    def items(self) -> tuple[str, ...] | None:
        """The items of the state saved (None: all of it)."""
        return self.store.items

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
        `consumed=True` and recorded as it is. Given without it, the very
        `Elapsed` a loop returned, `ciclo.iterate` yielded or `ciclo.restore`
        returned is recognised and recorded as it is, with a warning to pass
        `consumed=True` (a copy of it, or `loop_state.elapsed_after`, cannot be
        told apart and records `elapsed.steps + 1`).

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
                f"checkpoint: `consumed` must be True or False, got {short(consumed)}."
            )
        counted = None if consumed else counted_by(elapsed)
        if counted is not None:
            consumed = True
            warn(
                f"ciclo.checkpoint: ckpt(elapsed, state) was given the `elapsed` "
                f"{counted}, which already counts the batches trained into the "
                f"state: recorded as step {elapsed.steps}, not {elapsed.steps + 1}. "
                f"Say so with ckpt(elapsed, state, consumed=True); without it an "
                f"`elapsed` records elapsed.steps + 1 (the rule for ciclo.elapse's "
                f"before-the-batch `elapsed`)."
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
            committed = len(history) and (  # the step's row, already?
                history[-1]["elapsed"]["steps"] == elapsed.steps
            )
            uncommitted = logs and not committed
            if consumed:  # the step's row is committed before a loop returns
                uncommitted = False
            rows = (history, (elapsed, logs) if uncommitted else None, None)
        self.store.save(
            elapsed if consumed else elapsed.update(size), state, value, rows
        )

    # -- in a loop (`InLoop`) ------------------------------------------------------
    def __loop_callback__(self, loop_state: LoopState) -> tuple[None, None]:
        return self._loop.call(loop_state)

    def __loop_resume__(
        self, state: Any, history: History | None, elapsed: Elapsed | None
    ) -> tuple[Any, ...] | None:
        """With `resume=True`, before the first loop it is given to: the state,
        history and elapsed of the latest complete checkpoint (and the saved
        position of a checkpointable data iterator, when there is one), or None
        (start fresh) when the directory holds none."""
        return self._loop.resume(state, history, elapsed)

    def __loop_preempt__(self, loop_state: LoopState) -> None:
        self._loop.preempt(loop_state)

    def __loop_end__(self, loop_state: LoopState) -> None:
        self._loop.end(loop_state)

    # -- the directory (`Store`) ---------------------------------------------------
    def wait(self) -> None:
        """Blocks until the background saves are written (re-raises their errors)."""
        self.store.wait()

    def close(self) -> None:
        """Waits for the saves and releases orbax's resources (reopened on use)
        and the directory's lock."""
        self.store.close()

    def __enter__(self) -> checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        """`with ciclo.checkpoint(directory) as ckpt:` closes it as the block ends
        (its saves written, the directory's lock released), however it ends."""
        self.store.close()

    def steps(self) -> list[int]:
        """The steps of the checkpoints in the directory (after pending saves);
        incomplete step folders (a kill or damage left them) are not listed."""
        return self.store.steps()

    def latest_step(self) -> int | None:
        """The step of the latest checkpoint, or None."""
        return self.store.latest_step()

    def best_step(self) -> int | None:
        """The step of the best checkpoint by `monitor` (the latest without it)."""
        return self.store.best_step()

    def restore(
        self, target_state: Any = None, *, best: bool = False, step: int | None = None
    ) -> tuple[Any, Elapsed]:
        """Restores `(state, elapsed)`: the latest checkpoint, or with `best=True`
        the best by `monitor`. See `ciclo.restore`."""
        return self.store.restore(target_state, best=best, step=step)


def resuming(callbacks: list[Any], directory: str | os.PathLike) -> list[Any]:
    """`train_loop(resume=directory)`: `callbacks` with a checkpoint of `directory`
    that resumes: the one already there (one writer per directory), else a new
    one, saving at each epoch end."""
    target = _orbax.path(directory)
    for callback in callbacks:
        if isinstance(callback, checkpoint) and callback.directory == target:
            callback.resume = callback.store.resume_pending = True
            return callbacks
    return [*callbacks, checkpoint(directory, resume=True)]
