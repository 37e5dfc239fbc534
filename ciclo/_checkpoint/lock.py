"""One run per checkpoint directory: the lock file `ciclo.lock`.

A run that writes checkpoints (`ciclo.checkpoint` saving, or about to: resuming or
starting a loop) holds `<directory>/ciclo.lock`, a JSON file naming its host, pid
and start time. A second run opening the directory for writing is refused with a
`RuntimeError` naming the holder. The lock is released when the checkpoint closes
(at the end of each loop it runs in, or at interpreter exit); a run that dies
leaves it behind, stale, and the next run takes it over with a warning: on the same
host when the holder's pid is gone (or now names a process started after the lock),
from another host when the lock was not refreshed for `STALE_AFTER` seconds (the
holder refreshes it every `HEARTBEAT` seconds while it holds it).

Within one process the lock is shared: checkpoint objects of the same directory
count their holds, and the file goes when the last is released. Under
`jax.distributed` the run is one: process 0 holds the lock for all, and every
process learns whether it got it. Reading (`ciclo.restore`) takes no lock.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from typing import Any

from etils import epath

from ciclo._warn import warn

__all__ = ["HEARTBEAT", "NAME", "STALE_AFTER", "acquire", "release"]

NAME = "ciclo.lock"
HEARTBEAT = 60.0  # seconds between refreshes of a held lock's modification time
STALE_AFTER = 600.0  # a lock of another host not refreshed for this long is stale

# this process's holds, by lock path: [lock info, number of holds, heartbeat stop]
_HELD: dict[str, list[Any]] = {}
_GUARD = threading.Lock()


def acquire(directory: epath.Path, then: Any = None) -> None:
    """Takes the lock of `directory` for this run (a no-op if this process holds
    it already: the hold is counted), then calls `then(directory)` (on process 0
    only, before the others go on).

    Raises:
        RuntimeError: another live run holds it (the message names it).
    """
    import jax

    if jax.process_count() > 1:  # one run: process 0 holds it, all learn the result
        from jax.experimental import multihost_utils

        refused = ""
        if jax.process_index() == 0:
            try:
                if _acquire(directory) and then is not None:
                    then(directory)
            except RuntimeError as error:
                refused = str(error)
        code = multihost_utils.broadcast_one_to_all(
            _encode(refused[:2000]), is_source=jax.process_index() == 0
        )
        refused = bytes(bytearray(int(c) for c in code if c)).decode()
        if refused:
            raise RuntimeError(refused)
        return
    if _acquire(directory) and then is not None:
        then(directory)


def release(directory: epath.Path) -> None:
    """Releases one hold of this process on the lock of `directory` (the file is
    removed with the last one; never a lock held by another run)."""
    key = str(directory / NAME)
    with _GUARD:
        held = _HELD.get(key)
        if held is None:
            return
        held[1] -= 1
        if held[1] > 0:
            return
        del _HELD[key]
        held[2].set()
    lock = directory / NAME
    if _read(lock) == held[0]:  # still ours: not taken over meanwhile
        with contextlib.suppress(OSError):
            lock.unlink()


def _encode(text: str) -> Any:
    import numpy as np

    data = np.zeros(2048, np.int32)
    raw = np.frombuffer(text.encode(), np.uint8)
    data[: raw.size] = raw
    return data


def _acquire(directory: epath.Path) -> bool:
    """Takes the lock; True if this process did not hold it already."""
    lock = directory / NAME
    key = str(lock)
    with _GUARD:
        if key in _HELD:
            _HELD[key][1] += 1
            return False
        mine = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "since": time.time(),
            "token": uuid.uuid4().hex,
        }
        for _ in range(30):  # a race with another run taking a stale lock: retry
            if _create(lock, mine):
                stop = threading.Event()
                _HELD[key] = [mine, 1, stop]
                threading.Thread(
                    target=_heartbeat, args=(lock, mine, stop), daemon=True
                ).start()
                return True
            holder = _read(lock)
            if holder is None:  # removed meanwhile, being written, or damaged
                time.sleep(0.2)
                holder = _read(lock)
            if holder is None:
                if _unreadable_for(lock) > 5.0 and _take_over(lock, None):
                    warn(
                        f"ciclo.checkpoint: replacing the unreadable lock file {lock} "
                        f"(a run died while writing it)."
                    )
                continue
            reason = _stale(lock, holder)
            if reason is None:
                raise RuntimeError(
                    f"ciclo.checkpoint: {directory} is in use by another run: "
                    f"{_who(holder)} holds its lock ({lock}). Two runs writing one "
                    f"checkpoint directory would interleave their checkpoints. Wait "
                    f"for that run to end, stop it, or use another directory; if "
                    f"that run is in fact dead, delete {lock}."
                )
            if _take_over(lock, holder):
                warn(
                    f"ciclo.checkpoint: taking over the stale lock of {directory} "
                    f"left by {_who(holder)}: {reason}."
                )
        raise RuntimeError(
            f"ciclo.checkpoint: could not take the lock {lock} (another run keeps "
            f"changing it); delete it if no other run uses {directory}."
        )


def _create(lock: epath.Path, mine: dict[str, Any]) -> bool:
    """Writes `mine` to `lock` if there is no lock; False if there is one."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(str(lock), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        json.dump(mine, f)
    return True


def _read(lock: epath.Path) -> dict[str, Any] | None:
    try:
        holder = json.loads(lock.read_text())
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) else None


def _unreadable_for(lock: epath.Path) -> float:
    """Seconds since an unreadable lock file was written (0 if it is gone)."""
    try:
        return time.time() - os.stat(str(lock)).st_mtime
    except OSError:
        return 0.0


def _who(holder: dict[str, Any]) -> str:
    since = holder.get("since")
    when = (
        time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(since)))
        if isinstance(since, int | float)
        else "an unknown time"
    )
    return f"pid {holder.get('pid')} on host {holder.get('host')!r} (since {when})"


def _stale(lock: epath.Path, holder: dict[str, Any]) -> str | None:
    """Why the lock of `holder` is stale, or None while it may still be held."""
    pid, since = holder.get("pid"), holder.get("since")
    if holder.get("host") == socket.gethostname() and isinstance(pid, int):
        if not _alive(pid):
            return f"its process {pid} is gone"
        started = _started(pid)
        if started is not None and isinstance(since, int | float) and started > since:
            return f"pid {pid} now names a process started after the lock"
        return None
    try:
        age = time.time() - os.stat(str(lock)).st_mtime
    except OSError:
        return None
    if age > STALE_AFTER:
        return (
            f"it was not refreshed for {age:.0f} s (a live run refreshes it every "
            f"{HEARTBEAT:.0f} s; stale after {STALE_AFTER:.0f} s)"
        )
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    except OSError:
        return True
    return True


def _started(pid: int) -> float | None:
    """When process `pid` started (seconds since the epoch), where /proc says."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/stat") as f:
            boot = next(float(x.split()[1]) for x in f if x.startswith("btime"))
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def _take_over(lock: epath.Path, holder: dict[str, Any] | None) -> bool:
    """Removes the stale `lock` if it still holds `holder` (moved aside first, so
    that of two runs taking it over, one does); True if the way is free."""
    aside = lock.parent / f"{NAME}.stale-{uuid.uuid4().hex}"
    try:
        os.rename(str(lock), str(aside))
    except FileNotFoundError:
        return True  # gone already: try to create it again
    except OSError:
        return False
    if holder is not None and _read(aside) != holder:  # a fresh lock: put it back
        with contextlib.suppress(OSError):
            os.link(str(aside), str(lock))
    with contextlib.suppress(OSError):
        aside.unlink()
    return True


def _heartbeat(lock: epath.Path, mine: dict[str, Any], stop: threading.Event) -> None:
    """Refreshes the lock's modification time while it is held (so that another
    host does not take it for stale)."""
    while not stop.wait(HEARTBEAT):
        if _read(lock) != mine:
            return
        with contextlib.suppress(OSError):
            os.utime(str(lock))
