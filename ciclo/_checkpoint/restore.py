"""`ciclo.restore`: `(state, elapsed)` from a checkpoint directory.

`restore_from` picks the step (a given one, the best by the monitored metric, or
the latest) and reads it (`_read`). A checkpoint that does not read back whole is
never loaded: `restore` names it and the fix; resuming (`fallback`) goes back past
the newer unreadable ones to the newest that reads, with a warning naming them.
Incomplete step folders (`_orbax.survey`: a kill or damage left them without
their `elapsed` item) are never candidates: newer than the step restored, they
are named in a warning.
"""

from __future__ import annotations

import math
import os
from typing import Any

import orbax.checkpoint as ocp

from ciclo._checkpoint import orbax as _orbax
from ciclo._checkpoint.pending import wait_for
from ciclo._checkpoint.ranking import best_key, score
from ciclo._checkpoint.read import Unreadable, read
from ciclo._time import Elapsed
from ciclo._warn import warn

__all__ = ["restore", "restore_from"]


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
    wait_for(path)
    if not path.exists():
        raise ValueError(f"No checkpoint directory {path}.")
    manager = _orbax.manager(path, create=False, enable_async_checkpointing=False)
    try:
        return restore_from(manager, target_state, best, step)
    finally:
        manager.close()


def restore_from(
    mngr: ocp.CheckpointManager,
    target_state: Any,
    best: bool,
    step: int | None,
    with_history: bool = False,
    fallback: bool = False,
) -> tuple[Any, ...]:
    """`(state, elapsed)` of `step`, else the best (`best=True`), else the latest;
    `(state, elapsed, history, data, segments, kept)` with `with_history` (`data`:
    the data iterator's saved state as JSON, or None; `segments`: the history's,
    for the next save to build on, or None for a checkpoint of the earlier
    format; `kept`: the loop's objects' saved states, or None).

    A checkpoint that does not read back whole (a damaged or missing file) is
    never returned in part. With `fallback` (resuming the latest), the newer ones
    that do not read back are skipped with a warning naming them and why, and the
    newest that does is returned; without it, the error names the step and the fix.

    Raises:
        ValueError: no checkpoint, no such step, `best` without monitored ones, a
            checkpoint that does not read back (with `fallback`: none does), or a
            target that does not fit.
    """
    listed = mngr.all_steps()
    where = mngr.directory
    if not listed:
        raise ValueError(f"No checkpoint to restore in {where}.")
    found = _orbax.check_layout(mngr, listed)
    steps = found.complete
    if step is not None:
        if step not in listed:
            raise ValueError(
                f"No checkpoint for step {step} in {where}; steps there: {steps}."
            )
        if step in found.incomplete:
            raise ValueError(
                f"ciclo.restore: the step folder {step}/ in {where} is incomplete "
                f"({found.said([step])}: a save or deletion killed midway, or "
                f"damage); nothing was loaded from it. Restore a complete one "
                f"(steps there: {steps})."
            )
    elif not steps:
        what = "resume from" if fallback else "restore from"
        raise ValueError(
            f"ciclo.checkpoint: cannot {what} {where}: it holds no complete "
            f"checkpoint, only incomplete step folders: "
            f"{found.said(found.incomplete)}. Nothing was loaded, and a run does "
            f"not start fresh on its own: delete them (or use another directory) "
            f"to start fresh."
        )
    elif best:
        scored = [s for s in steps if score(mngr.metrics(s)) > -math.inf]
        if not scored:
            raise ValueError(
                f"best=True, but the checkpoints in {where} (steps {steps}) carry no "
                f"monitored metric: save them with ciclo.checkpoint(..., "
                f"monitor='name'), or restore the latest with best=False."
            )
        step = max(scored, key=lambda s: best_key(s, mngr.metrics(s)))
    else:
        step = steps[-1]
    newer = [s for s in found.incomplete if s > step]
    if not fallback:
        if newer:
            warn(
                f"ciclo.restore: restoring step {step} of {where}: skipped the "
                f"newer incomplete step folder(s) {found.said(newer)} (a save or "
                f"deletion killed midway, or damage)."
            )
        try:
            return read(mngr, step, target_state, with_history)
        except Unreadable as error:
            older = [s for s in steps if s < step]
            fix = (
                f"restore an older one with step={older[-1]} (steps there: "
                f"{steps}), or delete {error.folder} and restore the latest again"
                if older
                else f"it is the only one there up to that step (steps there: "
                f"{steps}); delete {error.folder}"
            )
            raise ValueError(
                f"ciclo.restore: the checkpoint at step {step} in {where} does not "
                f"read back whole ({error.why}); nothing was loaded from it. It is "
                f"damaged or incomplete: {fix}."
            ) from None
    skipped: list[Unreadable] = []
    for candidate in reversed([s for s in steps if s <= step]):
        try:
            restored = read(mngr, candidate, target_state, with_history)
        except Unreadable as error:
            skipped.append(error)
            continue
        if skipped or newer:
            said = [_listed(skipped)] if skipped else []
            if newer:
                said.append(f"incomplete step folder(s) {found.said(newer)}")
            warn(
                f"ciclo.checkpoint: resuming from step {candidate} in {where}: "
                f"skipped the newer checkpoint(s) that do not read back whole "
                f"(damaged or incomplete): {'; '.join(said)}. Nothing was loaded "
                f"from them; they stay on disk until this run's saves replace "
                f"them."
            )
        return restored
    if newer:
        skipped_text = f"{_listed(skipped)}; incomplete: {found.said(newer)}"
    else:
        skipped_text = _listed(skipped)
    raise ValueError(
        f"ciclo.checkpoint: cannot resume from {where}: no checkpoint there reads "
        f"back whole: {skipped_text}. Nothing was loaded, and the run does not "
        f"start fresh on its own: if the target state is right, these checkpoints "
        f"are damaged; delete them (or resume from another directory) to start "
        f"fresh."
    )


def _listed(errors: list[Unreadable]) -> str:
    return "; ".join(f"step {e.step} ({e.why})" for e in errors)
