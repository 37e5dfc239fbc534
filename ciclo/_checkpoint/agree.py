"""Checkpoint steps on several processes: all of them agree on the outcome.

Under `jax.distributed` each process reads only the shards of its own devices, so
damage to one shard's file fails the read on some processes and not on others.
Orbax's `CheckpointManager.restore` ends with a barrier that a failed read skips:
the processes then fall out of step (one waits in the barrier, another in the next
collective) and the run hangs. So on several processes `read_state` reads the
`state` item with orbax's handler directly (no barrier), and `agreed` tells every
process whether any failed, with the first failure's reason: all of them skip the
step together. One process reads as `CheckpointManager.restore` does. The saver
checks stale steps with `agreed` too, before any process deletes them.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

__all__ = ["Elsewhere", "agreed", "read_state"]

_WIDTH = 512  # bytes of a failure's reason shared between processes


class Elsewhere(ValueError):
    """A read or check failed on another process (the message says which, why)."""


def read_state(
    mngr: ocp.CheckpointManager, step: int, folder: epath.Path, args: Any
) -> Any:
    """The `state` item of `step` (`args`: its `StandardRestore`)."""
    if jax.process_count() == 1:
        return mngr.restore(step, args=ocp.args.Composite(state=args))["state"]
    handler = ocp.StandardCheckpointHandler()
    try:
        return handler.restore(folder / "state", args=args)
    finally:
        handler.close()


def agreed(error: BaseException | None, why: Any) -> BaseException | None:
    """`error` (this process's failure, or None) once every process has shared
    whether it failed: an `Elsewhere` naming the first process that did, for the
    processes whose own read succeeded. `why(error)` is the reason shared."""
    if jax.process_count() == 1:
        return error
    from jax.experimental import multihost_utils

    mine = np.zeros(_WIDTH, np.int32)
    if error is not None:
        raw = why(error).encode()[: _WIDTH - 1]
        mine[: len(raw)] = np.frombuffer(raw, np.uint8)
    every = np.asarray(multihost_utils.process_allgather(mine))
    if error is not None:
        return error
    for index, row in enumerate(every.reshape(-1, _WIDTH)):
        if row.any():
            text = bytes(int(c) for c in row if c).decode(errors="replace")
            return Elsewhere(f"on process {index}: {text}")
    return None
