"""The orbax side of `ciclo.checkpoint`: the manager and the on-disk layout.

A checkpoint is an orbax `CheckpointManager` step directory named by the number of
batches trained into the state, with three items: `state` (the pytree,
`StandardSave`; a bare array is wrapped in a one-element list), `elapsed` (JSON)
and `history` (JSON: `_history_item`). Orbax writes a step into a temporary
directory and renames it when complete, so a step killed mid-write is never
listed; its leftovers are removed by the holder of the directory's lock
(`remove_partial_saves`, on URLs by orbax). A step folder without the `elapsed`
item was not written by ciclo: a directory holding one is refused
(`check_layout`) before anything is read from it or deleted in it.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath

from ciclo._checkpoint import faults as _faults
from ciclo._time import Elapsed

__all__ = [
    "ITEMS",
    "check_layout",
    "elapsed_json",
    "foreign_steps",
    "is_leaf",
    "manager",
    "path",
    "remove_partial_saves",
]

ITEMS = ("state", "elapsed", "history")


def path(directory: Any) -> epath.Path:
    """`directory` as an absolute `epath.Path` (URLs such as gs://... kept as is)."""
    if not isinstance(directory, str | os.PathLike):
        raise TypeError(
            f"`directory` must be a path (str or os.PathLike), got {directory!r} "
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
    the directory's lock (`remove_partial_saves`), so that opening a directory
    never removes the save in flight of another run; on URLs (no lock) orbax
    removes them."""
    url = "://" in str(directory)
    options.setdefault("cleanup_tmp_directories", url and not options.get("read_only"))
    _faults.quiet_orbax_logs()  # a failure is said once, by ciclo
    return ocp.CheckpointManager(
        directory,
        item_names=ITEMS,
        options=ocp.CheckpointManagerOptions(**options),
    )


def remove_partial_saves(directory: epath.Path) -> None:
    """Removes the temporary folders that saves killed mid-write left in
    `directory` (called by the holder of its lock)."""
    try:
        children = list(directory.iterdir())
    except OSError:
        return
    for child in children:
        if ".orbax-checkpoint-tmp" in child.name and child.is_dir():
            with contextlib.suppress(OSError):
                child.rmtree()


def _listing(folder: epath.Path, limit: int = 5) -> str:
    """The first `limit` names in `folder`, sorted (for an error message)."""
    try:
        names = sorted(p.name for p in folder.iterdir())
    except OSError:
        return "[?]"
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return f"{names[:limit]}{more}"


def foreign_steps(directory: epath.Path, steps: Any) -> list[int]:
    """The step folders among `steps` that ciclo did not write (no `elapsed` item)."""
    return [s for s in steps if not (directory / str(s) / "elapsed").exists()]


def check_layout(mngr: ocp.CheckpointManager, steps: Any = None) -> None:
    """Refuses a directory whose step folders are not ciclo checkpoints.

    Raises:
        ValueError: naming the directory, the foreign step folders and what the
            first one holds.
    """
    directory = epath.Path(mngr.directory)
    foreign = foreign_steps(directory, mngr.all_steps() if steps is None else steps)
    if not foreign:
        return
    shown = ", ".join(f"{s}/" for s in foreign[:3]) + (
        f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
    )
    raise ValueError(
        f"{directory} holds step folders that are not ciclo checkpoints: {shown} "
        f"({foreign[0]}/ holds {_listing(directory / str(foreign[0]))}; a ciclo "
        f"checkpoint holds the items 'state' and 'elapsed'). ciclo neither reads "
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
