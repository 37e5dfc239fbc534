"""Reading one checkpoint step back whole, or not at all.

`read` restores the `elapsed` item, then the `state` (into the host layout of the
target, its saved fields only with `items`, then placed with the target's
strategy: `_state_layout`) and the `history` item (`history_segments`: its
segments, or the whole history in one JSON in earlier checkpoints). A checkpoint that does not read
back whole, a damaged or missing file or array bytes that differ from the
checksums saved beside them (`_integrity`), or one saved with a history whose
`history` item is gone, raises `Unreadable` and nothing of it is returned; a target that does not fit raises its own `ValueError` (`_fit`).
"""

from __future__ import annotations

import re
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath

from ciclo._checkpoint import faults as _faults
from ciclo._checkpoint import integrity as _integrity
from ciclo._checkpoint import orbax as _orbax
from ciclo._checkpoint.agree import Elsewhere, agreed, read_state
from ciclo._checkpoint.fit import check_fits
from ciclo._checkpoint.history_item import history_from_json
from ciclo._checkpoint.history_segments import read_history
from ciclo._checkpoint.layout import host_layout, put, select, strategy_of
from ciclo._time import Elapsed, mark_counted

__all__ = ["Unreadable", "read", "why"]


class Unreadable(Exception):
    """A checkpoint step that does not read back whole: `step`, `folder`, `why`."""

    def __init__(self, step: int, folder: epath.Path, error: BaseException):
        self.step, self.folder, self.why = step, folder, why(error)
        _faults.reported(f"{folder}/")  # orbax's leftover tasks: said here
        super().__init__(f"step {step}: {self.why}")


def why(error: BaseException) -> str:
    """The root cause of `error` in one short line (for a message)."""
    inner = error
    while inner.__cause__ is not None:
        inner = inner.__cause__
    if isinstance(inner, Elsewhere):
        return str(inner)
    if isinstance(inner, KeyError) and inner.args:
        text = str(inner.args[0])
    else:
        text = " ".join(str(inner).split())
    text = re.sub(r"\s*\[tensorstore_spec.*", "", text)
    text = f"{type(inner).__name__}: {text}" if text else type(inner).__name__
    if len(text) > 200:  # tensorstore: "CODE: Error ... at "file": the reason"
        code = re.match(r"\w+: ([A-Z_]{4,}: )?", text)
        text = (code.group(0) if code else "") + "... " + text.rsplit('": ', 1)[-1]
    return text[:300]


def read(
    mngr: ocp.CheckpointManager, step: int, target_state: Any, with_history: bool
) -> tuple[Any, ...]:
    """Reads the checkpoint at `step` whole, or raises `Unreadable` (a target that
    does not fit raises its own ValueError)."""
    folder = epath.Path(mngr.directory) / str(step)
    with _faults.reading(f"{folder}/"):
        return _read(mngr, step, folder, target_state, with_history)


def _read(
    mngr: ocp.CheckpointManager,
    step: int,
    folder: epath.Path,
    target_state: Any,
    with_history: bool,
) -> tuple[Any, ...]:
    try:
        items = mngr.restore(
            step, args=ocp.args.Composite(elapsed=ocp.args.JsonRestore())
        )
        e = items["elapsed"]
        wrapped = bool(e.get("wrapped", False))
        saved_items = None if e.get("items") is None else tuple(e["items"])
        elapsed = Elapsed(
            int(e["steps"]), int(e["samples"]), e["date"], e["date_start"]
        )
    except Exception as error:
        raise Unreadable(step, folder, error) from None
    if (
        with_history
        and not (folder / "history").exists()
        and (e.get("history") or "history" in (_orbax.saved_items(folder) or ()))
    ):
        raise Unreadable(
            step,
            folder,
            FileNotFoundError(
                "its 'history' item is missing (saved with the checkpoint, "
                "since deleted)"
            ),
        )
    strategy = strategy_of(target_state)
    host = None
    if target_state is None:
        state_args = ocp.args.StandardRestore()
    else:
        host = host_layout(target_state)
        abstract = jax.tree.map(
            ocp.utils.to_shape_dtype_struct, select(host, saved_items)
        )
        state_args = ocp.args.StandardRestore([abstract] if wrapped else abstract)
    if host is not None:  # checked first: orbax's own error is many lines
        check_fits(mngr, step, target_state, select(host, saved_items), wrapped)
    failed = None
    try:
        state = read_state(mngr, step, folder, state_args)
    except Exception as error:
        failed = error
    failed = agreed(failed, why)  # on several processes: all skip it, or none
    if failed is not None:
        if host is not None:  # a difference the metadata did not show first
            check_fits(mngr, step, target_state, select(host, saved_items), wrapped)
        raise Unreadable(step, folder, failed) from None
    damaged = _integrity.differs(state, e.get("checksums"))
    if damaged is not None:
        raise Unreadable(
            step,
            folder,
            ValueError(
                f"the bytes read back for {damaged!r} differ from those saved "
                f"(checksum): its data files were changed"
            ),
        )
    state = state[0] if wrapped else state
    if saved_items is not None and host is not None:  # the rest is the target's
        state = put(host, state)
    if strategy is not None:
        state = strategy.place_state(state)
    if not with_history:
        return state, mark_counted(elapsed, "ciclo.restore returned")
    segments = None
    if (folder / "history").exists():
        try:
            history, segments = read_history(folder / "history")
        except Exception as error:
            raise Unreadable(step, folder, error) from None
    else:
        history = history_from_json(None)
    return state, elapsed, history, e.get("data"), segments, e.get("callbacks")
