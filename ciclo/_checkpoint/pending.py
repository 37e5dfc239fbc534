"""The checkpoints of this process with saves pending, finished at interpreter exit.

Saves are asynchronous: orbax writes them in background threads. A checkpoint
whose orbax manager is open is tracked here, by id, with a strong reference, so
that a callback dropped by the user still finishes its saves: at normal
interpreter exit, before Python refuses new threads (orbax needs them), each is
closed (one line on stderr for a save that fails then). `ciclo.restore` in the
same process waits for the pending saves to its directory (`wait_for`).
"""

from __future__ import annotations

import atexit
import sys
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ciclo._checkpoint.checkpoint import checkpoint

__all__ = ["finish_pending", "open_checkpoints", "track", "untrack", "wait_for"]

# The checkpoints of this process whose orbax manager is open (saves may be pending),
# by id; strong references, so a callback dropped by the user still finishes.
_OPEN: dict[int, checkpoint] = {}
_exit_hook = False


def track(ckpt: checkpoint) -> None:
    """Remembers `ckpt` until it is closed; at normal interpreter exit its pending
    saves are finished before Python refuses new threads (orbax needs them)."""
    global _exit_hook
    _OPEN[id(ckpt)] = ckpt
    if not _exit_hook:
        _exit_hook = True
        try:  # runs before concurrent.futures shuts its executors down
            threading._register_atexit(finish_pending)  # type: ignore[attr-defined]
        except (AttributeError, RuntimeError):
            atexit.register(finish_pending)


def untrack(ckpt: checkpoint) -> None:
    """Forgets `ckpt` (its manager is closed or dropped: nothing pending)."""
    _OPEN.pop(id(ckpt), None)


def open_checkpoints() -> list[checkpoint]:
    """The checkpoints of this process whose orbax manager is open."""
    return list(_OPEN.values())


def finish_pending() -> None:
    """Finishes every pending save at interpreter exit (and before a preempted
    process ends, `ciclo._interrupts`), quietly (one line on error)."""
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


def wait_for(directory: Any) -> None:
    """Waits for this process's pending saves to `directory`."""
    for ckpt in list(_OPEN.values()):
        if ckpt.directory == directory:
            ckpt.wait()
