"""The orbax side of `ciclo.checkpoint`: the manager and the on-disk layout.

A checkpoint is an orbax `CheckpointManager` step directory named by the number of
batches trained into the state, with three items: `state` (the pytree,
`StandardSave`; a bare array is wrapped in a one-element list), `elapsed` (JSON)
and `history` (append-only segments: `history_segments`). Orbax writes a step into a temporary
directory and renames it when complete, so a step killed mid-write is never
listed; its leftovers are removed by the holder of the directory's lock (`tidy`,
on URLs by orbax).

Kills never leave a directory that cannot resume. An older checkpoint is deleted
by first renaming its step folder out of the step namespace (`.deleting-<step>-…`,
one atomic rename: the step is whole or gone), then removing it (`kill_safe`);
what a kill leaves of it is removed by the next holder of the lock. A step folder
that lost items (a deletion by another tool killed midway, files deleted by hand:
no `elapsed` item, or empty) beside ciclo's checkpoints is incomplete: it is
skipped with a warning naming it, and removed by the lock holder when it is older
than the newest complete checkpoint (`survey`). A step folder holding anything
else, or only `state`-like items in a directory with no ciclo checkpoint, was not
written by ciclo: such a directory is refused (`check_layout`) before anything is
read from it or deleted in it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import uuid
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath

from ciclo._checkpoint import faults as _faults
from ciclo._short import short
from ciclo._time import Elapsed
from ciclo._warn import warn

__all__ = [
    "ITEMS",
    "Survey",
    "check_layout",
    "elapsed_json",
    "is_leaf",
    "kill_safe",
    "manager",
    "path",
    "saved_items",
    "survey",
    "tidy",
]

ITEMS = ("state", "elapsed", "history")
_ORBAX_OWN = ("_CHECKPOINT_METADATA", "commit_success.txt", "metrics")  # in a step
_STEP = re.compile(r"0|[1-9]\d*")  # orbax's step folder names
DELETING = ".deleting-"  # a step folder being deleted: out of the step namespace


def path(directory: Any) -> epath.Path:
    """`directory` as an absolute `epath.Path` (URLs such as gs://... kept as is)."""
    if not isinstance(directory, str | os.PathLike):
        raise TypeError(
            f"`directory` must be a path (str or os.PathLike), got {short(directory)} "
            f"({type(directory).__name__})."
        )
    result = epath.Path(directory)
    if "://" in str(directory):
        return result
    result = result.absolute()
    for folder in (result, *result.parents):  # a file where a folder must be
        if folder.exists():
            if not folder.is_dir():
                where = (
                    "is" if folder == result else f"is inside {str(folder)!r}, which is"
                )
                raise ValueError(
                    f"The checkpoint directory {os.fspath(directory)!r} {where} an "
                    f"existing file, not a directory. Pass a directory path (created "
                    f"if missing), e.g. {str(folder.parent / 'checkpoints')!r}."
                )
            break
    return result


def manager(directory: epath.Path, **options: Any) -> ocp.CheckpointManager:
    """A `CheckpointManager` of the `state` + `elapsed` layout.

    Orbax's removal of a killed save's temporary folders is left to the holder of
    the directory's lock (`tidy`), so that opening a directory never removes the
    save in flight of another run; on URLs (no lock) orbax removes them. Its
    deletions are kill-safe (`kill_safe`)."""
    url = "://" in str(directory)
    options.setdefault("cleanup_tmp_directories", url and not options.get("read_only"))
    _faults.quiet_orbax_logs()  # a failure is said once, by ciclo
    for step in survey(directory).incomplete:  # said by ciclo, not by orbax's logs
        _faults.reported(f"{directory}/{step}/")
    mngr = ocp.CheckpointManager(
        directory,
        item_names=ITEMS,
        options=ocp.CheckpointManagerOptions(**options),
    )
    kill_safe(mngr)
    return mngr


def kill_safe(mngr: ocp.CheckpointManager) -> None:
    """Makes `mngr` delete a step folder by renaming it out of the step namespace
    first (`.deleting-<step>-<id>`, one atomic rename), then removing it: a kill at
    any moment of a deletion leaves the step whole or not listed. (Local
    directories; orbax's own deletion elsewhere.)"""
    deleter = getattr(mngr, "_checkpoint_deleter", None)
    if "://" in str(mngr.directory) or not hasattr(deleter, "_delete_step_permanently"):
        return
    directory = epath.Path(mngr.directory)

    deleter._delete_step_permanently = lambda step, target: _remove(
        directory, step, target
    )


def _remove(directory: epath.Path, step: int, folder: epath.Path) -> None:
    """Renames `folder` (step `step`'s) out of the step namespace, then removes it
    (what a kill leaves of it: `tidy`)."""
    aside = directory / f"{DELETING}{step}-{uuid.uuid4().hex[:8]}"
    os.rename(str(folder), str(aside))
    shutil.rmtree(str(aside), ignore_errors=True)


def tidy(directory: epath.Path) -> None:
    """Removes what kills left in `directory`: the temporary folders of saves
    killed mid-write, step folders killed while being deleted, and incomplete
    step folders older than the newest complete checkpoint (with a warning naming
    them). Called by the holder of the directory's lock; removes nothing in a
    directory holding step folders ciclo did not write."""
    try:
        children = list(directory.iterdir())
    except OSError:
        return
    for child in children:
        name = child.name
        if (".orbax-checkpoint-tmp" in name or name.startswith(DELETING)) and (
            child.is_dir()
        ):
            shutil.rmtree(str(child), ignore_errors=True)
    found = survey(directory)
    if found.foreign or not found.complete:
        return
    old = [s for s in found.incomplete if s < found.complete[-1]]
    for step in old:
        with contextlib.suppress(OSError):
            _remove(directory, step, directory / str(step))
    if old:
        warn(
            f"ciclo.checkpoint: removed incomplete step folder(s) in {directory} "
            f"(left by a deletion or a save killed midway, or damaged): "
            f"{found.said(old)}; the complete checkpoints there are kept (steps "
            f"{found.complete})."
        )


@dataclasses.dataclass
class Survey:
    """The step folders of a checkpoint directory, by kind: `complete` (with an
    `elapsed` item; whether they read back is for `_read`), `incomplete` (ciclo's,
    lacking items: step -> what the folder holds) and `foreign` (not ciclo's)."""

    complete: list[int]
    incomplete: dict[int, list[str]]
    foreign: dict[int, list[str]]

    def said(self, steps: Any) -> str:
        """`16/ (holds ['state'])`, ... for a message."""
        return ", ".join(f"step {s} ({_holds(self.incomplete[s])})" for s in steps)


def _holds(names: list[str]) -> str:
    return f"holds {names}" if names else "empty"


def saved_items(folder: epath.Path) -> set[str] | None:
    """The items orbax's metadata of a step folder lists (None when unreadable)."""
    try:
        meta = json.loads((folder / "_CHECKPOINT_METADATA").read_text())
        return set(meta["item_handlers"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def survey(directory: epath.Path, steps: Any = None) -> Survey:
    """Sorts the step folders of `directory` (those among `steps`, when given)
    into complete ciclo checkpoints, incomplete ones and foreign ones.

    A folder is ciclo's when it holds the `elapsed` item, or when orbax's metadata
    in it lists ciclo's items (`elapsed` among them); one holding anything else
    (another item, a file orbax does not write, metadata listing other items) is
    foreign; one holding nothing or only ciclo-named
    items without metadata (`state` alone, as a killed deletion leaves it) is an
    incomplete ciclo checkpoint when the directory holds ciclo checkpoints, and
    foreign otherwise."""
    try:
        names = [p.name for p in directory.iterdir()]
    except OSError:
        names = []
    every = sorted(int(n) for n in names if _STEP.fullmatch(n))
    complete, incomplete, foreign, unsure = [], {}, {}, {}
    for step in every:
        folder = directory / str(step)
        try:
            held = sorted(p.name for p in folder.iterdir())
        except OSError:
            held = []
        items = saved_items(folder)
        strange = [n for n in held if n not in ITEMS and n not in _ORBAX_OWN]
        ours = items is None or (items <= {*ITEMS, *_ORBAX_OWN} and "elapsed" in items)
        if strange or not ours:
            foreign[step] = held
        elif "elapsed" in held:
            complete.append(step)
        elif items is not None:  # its metadata lists ciclo's items
            incomplete[step] = held
        else:
            unsure[step] = held
    if complete or incomplete:
        incomplete.update(unsure)
    else:
        foreign.update(unsure)
    wanted = set(every if steps is None else steps)
    return Survey(
        [s for s in complete if s in wanted],
        {s: incomplete[s] for s in sorted(incomplete) if s in wanted},
        {s: foreign[s] for s in sorted(foreign) if s in wanted},
    )


def _listing(folder: epath.Path, limit: int = 5) -> str:
    """The first `limit` names in `folder`, sorted (for an error message)."""
    try:
        names = sorted(p.name for p in folder.iterdir())
    except OSError:
        return "[?]"
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return f"{names[:limit]}{more}"


def check_layout(mngr: ocp.CheckpointManager, steps: Any = None) -> Survey:
    """Refuses a directory whose step folders are not ciclo checkpoints; else its
    `Survey` (of `steps`, or of every step there).

    Raises:
        ValueError: naming the directory, the foreign step folders and what the
            first one holds.
    """
    directory = epath.Path(mngr.directory)
    found = survey(directory, mngr.all_steps() if steps is None else steps)
    foreign = list(found.foreign)
    if not foreign:
        return found
    shown = ", ".join(f"{s}/" for s in foreign[:3]) + (
        f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
    )
    raise ValueError(
        f"{directory} holds step folders that are not ciclo checkpoints: {shown} "
        f"({foreign[0]}/ holds {_listing(directory / str(foreign[0]))}; a ciclo "
        f"checkpoint holds the items 'state' and 'elapsed', and a damaged one "
        f"beside ciclo checkpoints is skipped). ciclo neither reads "
        f"nor deletes them: give ciclo.checkpoint / ciclo.restore / resume= a "
        f"directory of its own (a new or empty one), or move those folders out."
    )


def is_leaf(state: Any) -> bool:
    """True for a bare array / number, which `StandardSave` cannot store alone."""
    # orbax's StandardSave needs a container; a bare array / number is wrapped.
    return jax.tree_util.treedef_is_leaf(jax.tree.structure(state))


def elapsed_json(elapsed: Elapsed, wrapped: bool) -> dict[str, Any]:
    """The `elapsed` item (and whether the state was wrapped in a list)."""
    return {
        "steps": int(elapsed.steps),
        "samples": int(elapsed.samples),
        "date": float(elapsed.date),
        "date_start": float(elapsed.date_start),
        "wrapped": wrapped,
    }
