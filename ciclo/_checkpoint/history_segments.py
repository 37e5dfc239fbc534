"""The `history` item of a checkpoint: the run's history as append-only segments.

A save writes only the rows logged since the previous save of the same run. Its
`history/` folder holds:

- `segments.json`, the manifest: `{"version": 2, "lag", "rows", "segments":
  [{"file", "start", "stop", "crc32"}, ...]}`, the segments covering rows 0 to
  `rows` in order;
- one file per segment, `rows-<start>-<stop>.json` (`history_item.encode`).

Each step folder is whole on its own: the segments it shares with the previous
checkpoint are hard links to that checkpoint's files (copies where links are not
possible, e.g. on `gs://`), so deleting any checkpoint (retention, `keep=`) never
takes rows from another, and nothing outside the step folders needs collecting.
Segments are merged as they pile up: the new rows absorb the trailing segments
shorter than twice them (read back from the previous checkpoint), so that each
segment is at least twice as long as the next — a checkpoint holds at most about
log2(rows) segments (a binary counter when saves are evenly spaced) — and a row is
rewritten only when its segment grows 1.5 times or more: O(log rows) times over a
run. All of it happens in orbax's
background thread (`HistoryHandler`) while the loop trains: the loop's thread only
copies the new rows (`history_item.snapshot`). Everything is written inside
orbax's temporary step folder, renamed when the step is complete: a kill at any
moment leaves the previous checkpoints as they were. Only process 0 writes it.

The step's own row when it is not committed yet (a save by hand before the
commit, or after an error in the batch) is a segment of its own that the next
save does not build on (the row the history then commits is saved again).

Reading (`read_history`) checks each segment against its CRC-32 and that they
cover the rows, so a damaged or missing segment makes that checkpoint unreadable.
A checkpoint written before the history was saved in segments holds it whole in
`history/metadata` (JSON), read as such; the next save then writes all rows.
"""

from __future__ import annotations

import dataclasses
import json
import os
import weakref
import zlib
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath

from ciclo._checkpoint.history_item import (
    Piece,
    decode,
    encode,
    history_from_json,
    join,
    snapshot,
    to_history,
)
from ciclo._history.history import History

__all__ = ["Base", "HistorySave", "Plan", "Segment", "plan", "read_history"]

MANIFEST = "segments.json"
OLD = "metadata"  # the whole history as one JSON, before segments


@dataclasses.dataclass(frozen=True)
class Segment:
    """A file of a checkpoint's history: rows `start` to `stop`."""

    file: str
    start: int
    stop: int
    crc32: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


@dataclasses.dataclass
class Written:
    """The segments a save wrote, covering the committed rows (set by the
    background write once they are written; None before)."""

    segments: list[Segment] | None = None


@dataclasses.dataclass
class Base:
    """What the next save of `history` builds on: the checkpoint of `step`, whose
    segments (`written`) hold its first `rows` rows."""

    step: int
    rows: int
    history: weakref.ref
    written: Written

    def usable(self, history: History, step: int, steps: list[int]) -> bool:
        """Whether a save of `history` at `step` can build on it: the same
        history, grown since, and that checkpoint still there (older than
        `step`, so not cut from the timeline by this save)."""
        return (
            self.history() is history
            and self.written.segments is not None
            and len(history) >= self.rows
            and self.step < step
            and self.step in steps
        )


@dataclasses.dataclass
class Plan:
    """One save's history: link `linked` from `source` (the previous
    checkpoint's `history/`), write `merged` (read from `source`) joined with
    `piece` as one segment, then `tail` (the step's uncommitted rows)."""

    lag: int
    source: epath.Path | None
    linked: list[Segment]
    merged: list[Segment]
    piece: Piece
    tail: Piece | None
    written: Written = dataclasses.field(default_factory=Written)

    def base(self, step: int, history: History) -> Base:
        """What the next save of `history` builds on, once this one is written."""
        return Base(step, self.piece.stop, weakref.ref(history), self.written)


def plan(
    base: Base | None,
    history: History,
    step: int,
    steps: list[int],
    directory: epath.Path,
    row: Any = None,
    batch: Any = None,
) -> Plan | None:
    """The plan of a save of `history` at `step` (`steps`: the checkpoints in
    `directory`), on the loop's thread: the rows since `base` when it is usable,
    else all of them (`history_item.snapshot` for `row`, `batch`). None on a
    process other than process 0, which writes nothing."""
    if jax.process_index() != 0:
        return None
    source, linked, start = None, [], 0
    if base is not None and base.usable(history, step, steps):
        source = directory / str(base.step) / "history"
        linked, start = list(base.written.segments or ()), base.rows
    piece, tail = snapshot(history, start, row, batch)
    merged: list[Segment] = []
    rows = piece.stop - piece.start
    # the new rows absorb the trailing segments shorter than twice them: each
    # segment is then at least twice as long as the next (about log2(rows) of
    # them), and a row is rewritten each time its segment grows 1.5 times or more
    while rows and linked and linked[-1].rows < 2 * rows:
        merged.insert(0, linked.pop())
        rows += merged[0].rows
    return Plan(history.lag, source, linked, merged, piece, tail)


# -- writing (orbax's background thread) ------------------------------------------------
def write(plan: Plan, folder: epath.Path) -> None:
    """Writes the `history/` folder of a save (`folder`, in orbax's temporary step
    folder) and records the segments written in `plan.written`."""
    folder.mkdir(parents=True, exist_ok=True)
    segments = []
    source = plan.source
    if source is not None:
        for segment in plan.linked:
            _link(source / segment.file, folder / segment.file)
            segments.append(segment)
    piece = plan.piece
    if source is not None and plan.merged:
        piece = join([*(_read_segment(source, s) for s in plan.merged), piece])
    if piece.stop > piece.start:
        segments.append(_write_segment(folder, piece))
    committed = list(segments)
    if plan.tail is not None and plan.tail.stop > plan.tail.start:
        segments.append(_write_segment(folder, plan.tail))
    manifest = {
        "version": 2,
        "lag": plan.lag,
        "rows": segments[-1].stop if segments else 0,
        "segments": [dataclasses.asdict(s) for s in segments],
    }
    (folder / MANIFEST).write_text(json.dumps(manifest))
    plan.written.segments = committed


def _link(source: epath.Path, target: epath.Path) -> None:
    """`target` as a hard link to `source`; a copy where links are not possible."""
    if "://" not in str(source):
        try:
            os.link(source, target)
            return
        except OSError:  # another filesystem, or links not supported: a copy
            pass
    target.write_bytes(source.read_bytes())


def _write_segment(folder: epath.Path, piece: Piece) -> Segment:
    data = encode(piece)
    name = f"rows-{piece.start}-{piece.stop}.json"
    (folder / name).write_bytes(data)
    return Segment(name, piece.start, piece.stop, zlib.crc32(data))


def _read_segment(folder: epath.Path, segment: Segment) -> Piece:
    """The piece of `segment` in `folder`, checked whole.

    Raises:
        ValueError: if its bytes are not those saved, or not its rows."""
    data = (folder / segment.file).read_bytes()
    if zlib.crc32(data) != segment.crc32:
        raise ValueError(
            f"the bytes of {folder / segment.file} differ from those saved "
            f"(CRC-32): the file was changed"
        )
    piece = decode(data)
    if (piece.start, piece.stop) != (segment.start, segment.stop):
        raise ValueError(f"{folder / segment.file} does not hold the rows it names")
    return piece


class HistoryHandler(ocp.AsyncCheckpointHandler):
    """Orbax's handler of the `history` item: writes a `Plan` (process 0), in
    orbax's background thread when saves are asynchronous."""

    async def async_save(self, directory: epath.Path, args: HistorySave) -> Any:
        return [
            ocp.future.CommitFutureAwaitingContractedSignals(
                self._write(directory, args.plan), name="ciclo_history"
            )
        ]

    async def _write(self, directory: epath.Path, plan: Plan | None) -> None:
        if plan is not None:
            write(plan, directory)

    def save(self, directory: epath.Path, args: HistorySave) -> None:
        if args.plan is not None:
            write(args.plan, directory)

    def restore(self, directory: epath.Path, args: Any = None) -> History:
        return read_history(directory)[0]

    def metadata(self, directory: epath.Path) -> None:
        return None


@ocp.checkpoint_args.register_with_handler(HistoryHandler, for_save=True)
@dataclasses.dataclass
class HistorySave(ocp.args.CheckpointArgs):
    """The `history` item of a save: its `Plan` (None: nothing to write here)."""

    plan: Plan | None


@ocp.checkpoint_args.register_with_handler(HistoryHandler, for_restore=True)
@dataclasses.dataclass
class HistoryRestore(ocp.args.CheckpointArgs):
    """Restores the `history` item with orbax (ciclo reads it with
    `read_history`); orbax asks for one to know the handler."""


# -- reading -------------------------------------------------------------------------------
def read_history(folder: epath.Path) -> tuple[History, list[Segment] | None]:
    """The history in a step's `history/` folder, and its segments (None for the
    one-JSON format of earlier checkpoints).

    Raises:
        OSError: a file is missing or unreadable.
        ValueError: a segment is damaged, or they do not cover the rows."""
    manifest_path = folder / MANIFEST
    if not manifest_path.exists():
        return history_from_json(json.loads((folder / OLD).read_text())), None
    manifest = json.loads(manifest_path.read_text())
    segments = [Segment(**s) for s in manifest["segments"]]
    pieces = [_read_segment(folder, s) for s in segments]
    piece = join(pieces) if pieces else Piece.empty()
    if piece.start != 0 or piece.stop != int(manifest["rows"]):
        raise ValueError(
            f"the segments of {folder} hold rows {piece.start}-{piece.stop}, not "
            f"0-{manifest['rows']}"
        )
    return to_history(piece, int(manifest["lag"])), segments
