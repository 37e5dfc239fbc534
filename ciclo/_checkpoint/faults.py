"""A checkpoint that cannot be written because the disk is full, said plainly.

Orbax writes a step into `<step>.orbax-checkpoint-tmp` and renames it when whole,
and deletes older steps (retention) only after that: a save that fails leaves the
previous checkpoints as they were. When it fails for lack of space (ENOSPC or
EDQUOT from a Python write, tensorstore's `RESOURCE_EXHAUSTED`), `disk_full` turns
the failure into one `OSError(ENOSPC)` naming the directory, the step that could
not be saved and the newest checkpoint still there, after removing the partial
temporary folder. `quiet_orbax_logs` keeps orbax's background threads from logging
the same failure as pages of absl errors and tracebacks first.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import sys
import time
import warnings
from typing import Any

from etils import epath

__all__ = ["disk_full", "is_disk_full", "quiet_orbax_logs", "reading", "reported"]

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
_SETTLE = 5.0  # seconds
_MARKERS = ("RESOURCE_EXHAUSTED", "No space left on device", "Disk quota exceeded")


def is_disk_full(error: BaseException | None) -> bool:
    """Whether `error` (or an error it came from) says the disk is full."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in _NO_SPACE:
            return True
        if any(marker in str(error) for marker in _MARKERS):
            return True
        error = error.__cause__ or error.__context__
    return False


def disk_full(directory: epath.Path, step: int, error: BaseException) -> OSError:
    """The one clear error for `step` not saved to `directory` for lack of space
    (its partial temporary folder is removed first)."""
    reported(f"{directory}/{step}.orbax-checkpoint-tmp")
    removed = _remove_partial(directory, step)
    steps = sorted(
        int(p.name) for p in _children(directory) if p.name.isdigit() and p.is_dir()
    )
    older = [s for s in steps if s < step]
    if older:
        others = f", as are the others there (steps {steps})" if len(steps) > 1 else ""
        kept = (
            f"the previous checkpoint (step {older[-1]}) is intact{others}; resume "
            f"from it (train_loop(..., resume=...)) once there is space"
        )
    else:
        kept = "there is no earlier checkpoint there"
    partial = "its partial files were removed" if removed else "nothing was written"
    return OSError(
        errno.ENOSPC,
        f"ciclo.checkpoint: no space left on the device of {directory}: the "
        f"checkpoint of step {step} could not be saved ({partial}); {kept}. Free "
        f"some space, keep fewer checkpoints (keep=) or save to another directory. "
        f"(Underlying error: {_short(error)})",
    )


def _children(directory: epath.Path) -> list[epath.Path]:
    try:
        return list(directory.iterdir())
    except OSError:
        return []


def _remove_partial(directory: epath.Path, step: int) -> bool:
    """Removes orbax's temporary folder(s) of `step`; whether there was one.

    Writes of the failed save may still be in flight (tensorstore's, in the
    background): the folder is removed once it stopped changing, and again until
    it stays gone (for up to `_SETTLE` seconds in all)."""
    found, deadline = False, time.monotonic() + _SETTLE
    last, same, quiet = None, 0, 0
    while quiet < 2 and time.monotonic() < deadline:
        partial = [
            child
            for child in _children(directory)
            if child.name.startswith(f"{step}.orbax-checkpoint-tmp")
        ]
        found = found or bool(partial)
        if not partial:
            quiet += 1
        else:
            quiet = 0
            now = _snapshot(partial)
            same = same + 1 if now == last else 0
            last = now
            if same >= 3:  # no write for a while: remove
                for child in partial:
                    with contextlib.suppress(OSError):
                        if "://" in str(child):
                            child.rmtree()
                        else:
                            shutil.rmtree(str(child), ignore_errors=True)
        time.sleep(0.1)
    return found


def _snapshot(folders: list[epath.Path]) -> list[tuple[str, int]]:
    """The files under `folders` with their sizes (to see whether writes go on)."""
    out = []
    for folder in folders:
        for root, _, files in os.walk(str(folder)):
            for name in files:
                with contextlib.suppress(OSError):
                    out.append((name, os.path.getsize(os.path.join(root, name))))
    return sorted(out)


def _short(error: BaseException) -> str:
    inner = error
    while inner.__cause__ is not None:
        inner = inner.__cause__
    text = " ".join(str(inner).split())
    return f"{type(inner).__name__}: {text[:200]}{'...' if len(text) > 200 else ''}"


_FAILED: set[str] = set()  # the folders of saves / reads that failed: said already
_READING: list[str] = []  # the folders being read now (see `reading`)
# orbax's metadata coroutines that a failed read leaves unstarted (its tasks
# cancelled with their event loop) warn when collected: said once by ciclo
_UNAWAITED = r"coroutine 'Store\._get_array_metadatas' was never awaited"


def _about_failed(text: str) -> bool:
    return any(folder in text for folder in (*_FAILED, *_READING))


def _text(record: logging.LogRecord) -> str:
    try:
        message = record.getMessage()
    except Exception:  # a record that cannot format: nothing to match
        message = ""
    error = record.exc_info[1] if record.exc_info else None
    return f"{message} {error or ''}"


class _DiskFullFilter(logging.Filter):
    """Drops orbax's log records about a write that failed for lack of space, and
    any about a save or read that ciclo reported already (as one clear error or
    warning): a failed step's folder."""

    def filter(self, record: logging.LogRecord) -> bool:
        if "orbax" not in record.pathname or record.levelno < logging.WARNING:
            return True
        if record.exc_info and is_disk_full(record.exc_info[1]):
            return False
        text = _text(record)
        return not (any(m in text for m in _MARKERS) or _about_failed(text))


class _LeftoverFilter(logging.Filter):
    """Drops asyncio's "Task exception was never retrieved" about a failed folder
    (orbax's tasks left behind by a failed read or save), or about an orbax write
    that failed for lack of space (said by ciclo as one error, maybe later)."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = _text(record)
        full = "orbax" in text and any(m in text for m in _MARKERS)
        return not (full or _about_failed(text))


def reported(folder: Any) -> None:
    """Marks `folder` (a step's, or its temporary one) as failed and said: orbax's
    and asyncio's later reports about it are dropped."""
    _FAILED.add(str(folder))


@contextlib.contextmanager
def reading(folder: Any):
    """While `folder` is read, asyncio's reports about it are dropped too: orbax's
    sibling tasks of a read that fails may be collected (and reported as "Task
    exception was never retrieved") before the failure reaches ciclo, which then
    says it once (`reported`); so are the "never awaited" warnings of its
    coroutines left unstarted. A read that succeeds leaves no such task."""
    quiet_orbax_logs()
    # (added at each read: a caller's `catch_warnings` may have dropped it since)
    warnings.filterwarnings("ignore", _UNAWAITED, RuntimeWarning)
    _READING.append(str(folder))
    try:
        yield
    finally:
        _READING.remove(str(folder))


def _quiet_leftovers() -> None:
    """Orphaned tensorstore callbacks of a failed save or read report "Event loop
    is closed" (or their orbax coroutine's error) as unraisable errors; those are
    dropped, any other goes to the hook in place before."""
    global _hooked
    if _hooked:
        return
    _hooked = True
    logging.getLogger("asyncio").addFilter(_LeftoverFilter())
    previous = sys.unraisablehook  # not captured at import: pytest swaps it

    def hook(unraisable: Any) -> None:
        code = getattr(unraisable.object, "cr_code", None)
        error = str(unraisable.exc_value)
        if (
            "Event loop is closed" in error
            or _about_failed(error)
            or "orbax" in str(getattr(code, "co_filename", ""))
        ):
            return
        previous(unraisable)

    sys.unraisablehook = hook


_installed = _hooked = False


def quiet_orbax_logs() -> None:
    """Installs the filters on absl's and asyncio's loggers and the unraisable
    hook (once; before any save or read, as leftovers may come at once)."""
    global _installed
    if not _installed:
        _installed = True
        logging.getLogger("absl").addFilter(_DiskFullFilter())
        _quiet_leftovers()
