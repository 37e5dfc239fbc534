"""`tensorboard`: a metric writer to TensorBoard event files (tensorboardX)."""

from __future__ import annotations

import itertools
import math
import os
import struct
import time
from collections.abc import Mapping
from typing import Any

from ciclo._logs import SHOWN_COLLECTIONS
from ciclo._short import short
from ciclo.callbacks._rows import Row, Tags
from ciclo.callbacks._writer import Writer, missing

__all__ = ["tensorboard"]

_FILES = itertools.count()  # event files of this process: distinct names


class tensorboard(Writer):
    """Writes the step's losses, metrics and stateful metrics to TensorBoard.

    Each single-number entry becomes a scalar tagged with its bare name (`loss`,
    `accuracy`, `accuracy_test`; see `prefix`) at the number of steps completed
    with its batch (`elapsed.steps + 1`: the 20th batch's values at step 20, an
    epoch-end evaluation at the epoch boundary, as Keras's TensorBoard callback,
    clu and Jaxloop do; `History` and the CSV/JSONL `steps` column count the
    steps before the batch). Rows are read from the loop's `History` once it has
    brought them to the host, never making the host wait during training. At the end
    of the loop (normally, on Ctrl-C or on an error) every remaining row is written
    and the event file is closed, so what was committed to the history is on disk
    when the loop returns. Events are written in the caller's thread and flushed
    once per batch of rows (see below), without an fsync (the OS has them: a
    killed process loses none it wrote; the file is synced when it closes).

    Rows are written in batches, never one per step: when the loop's history
    has brought rows to the host (every `lag` = 64 commits by default, and at
    each checkpoint save), at the loop's end, at Ctrl-C and at `close()` (by
    hand, every `every` calls). A SIGKILL loses at most the rows since the last
    batch. Each row is one event holding all its scalars.

    One writer per `logdir` at a time: a second `ciclo.tensorboard` on the same
    `logdir` while the first writes (in a running loop, or by hand from its first
    call to its `close()`) is an error naming both, since each event file starts with a
    restart marker and TensorBoard would hide one's points. Give each its own
    `logdir` (`runs/train`, `runs/eval`), or one writer with `prefix`.

    Across interruptions each step is in TensorBoard once: the writer's event file
    starts with a restart marker at the step its loop starts from (what
    tensorboardX's `purge_step` writes), so a run
    resumed from a checkpoint (`train_loop(..., resume=dir)`, same `logdir`) hides
    what the crashed run logged after that checkpoint and keeps what it logged
    before. (A fresh run in a `logdir` holding an earlier run's events hides them
    too, as a CSV log is truncated; use another `logdir` to compare runs.)

    In `ciclo.train_loop(callbacks=[tb])` it runs on `on_train_batch_end`, after the
    epoch end; in `ciclo.loop` spread it last, `{..., **ciclo.tensorboard(d)}`, or
    give it any schedule. By hand: `tb(elapsed, logs)` per step, `tb.close()` at
    the end. Needs `tensorboardX` (`pip install 'ciclo[tensorboard]'`).

    Args:
        logdir: the directory of the event files (created if needed).
        hparams: optional hyperparameters (`{name: bool | str | float | int}`),
            written with the final value of every scalar when the writer closes
            (TensorBoard's HParams tab, run `logdir/hparams`).
        collections: the collections written (default: losses, metrics,
            stateful metrics).
        prefix: None (bare names), a prefix for every tag (`"train/"`), or a
            dict from a test name to its prefix, `""` for the other entries:
            `{"": "train/", "test": "val/"}` writes `loss` as `train/loss` and
            `loss_test` as `val/loss`.
        max_pending: kept for compatibility (the history bounds the rows that
            wait for the device).
        every: used by hand, the rows between two writes (see above).
        **writer_kwargs: `filename_suffix` of the event files; the rest is passed to
            the `tensorboardX.SummaryWriter` that writes `hparams`.

    Raises:
        ImportError: if tensorboardX is not installed ("install ciclo[tensorboard]").
        ValueError: (when its loop starts or it first writes) if another
            `ciclo.tensorboard` of this process writes to the same `logdir`.

    Example:
        >>> import os, tempfile, ciclo
        >>> logdir = tempfile.mkdtemp()
        >>> def train_step(state, batch):
        ...     return ciclo.logs().add_loss("loss", 1.0 / (batch + 1)), state
        >>> _ = ciclo.loop(
        ...     None, range(3), {ciclo.every(1): train_step, **ciclo.tensorboard(logdir)})
        >>> any(name.startswith("events.out.tfevents") for name in os.listdir(logdir))
        True
    """

    def __init__(
        self,
        logdir: str | os.PathLike,
        *,
        hparams: Mapping[str, Any] | None = None,
        collections: tuple[str, ...] = SHOWN_COLLECTIONS,
        prefix: str | Mapping[str, str] | None = None,
        max_pending: int = 256,
        every: int = 32,
        **writer_kwargs: Any,
    ):
        try:
            import tensorboardX
            from tensorboardX import event_file_writer
            from tensorboardX.proto import event_pb2, summary_pb2
            from tensorboardX.record_writer import masked_crc32c
        except ImportError:
            raise missing("tensorboard", "tensorboardX", "tensorboard") from None
        super().__init__(collections=collections, max_pending=max_pending, every=every)
        if not isinstance(logdir, str | os.PathLike):
            raise TypeError(f"`logdir` must be a path, got {short(logdir)}.")
        if hparams is not None and not isinstance(hparams, Mapping):
            raise TypeError(f"`hparams` must be a dict, got {short(hparams)}.")
        self.logdir = os.fspath(logdir)
        self.hparams = dict(hparams) if hparams else None
        self._module, self._files = tensorboardX, event_file_writer
        self._proto, self._summary = event_pb2, summary_pb2.Summary
        self._crc = _masked(masked_crc32c)
        # entry name -> (its tag, its Summary.Value encoded up to the value)
        self._prefixes: dict[str, tuple[str, bytes]] = {}
        # a record's length -> its header (the length and the length's CRC)
        self._headers: dict[int, bytes] = {}
        self._suffix = str(writer_kwargs.pop("filename_suffix", "") or "")
        self._kwargs = writer_kwargs
        self._tags = Tags(prefix, "tensorboard")
        self._events: Any = None
        self._last: dict[str, float] = {}

    def _target(self) -> str:
        return self.logdir

    def _clash(self, other: Writer) -> str:
        return (
            f"Two TensorBoard writers on one logdir: {self!r} and {other!r}, "
            f"which is still writing there. Each event file starts with a "
            f"restart marker, so TensorBoard would hide one writer's points. "
            f"Use one writer per logdir (e.g. {self.logdir}/train and "
            f"{self.logdir}/eval), one writer with `prefix=`, or close() the "
            f"first before the second starts."
        )

    def _begin(self) -> None:
        self._events_file([])

    def _write(self, rows: list[Row]) -> None:
        if not rows:
            return
        events = self._events_file(rows)
        file = _file_of(events)
        if file is not None:  # the rows' records encoded here, one write
            file.write(self._records(rows))
        else:  # another tensorboardX layout: an event proto per row
            self._write_events(events, rows)
        self.rows_written += len(rows)
        _flush(events)  # to the OS now: a killed process keeps its rows

    def _events_file(self, rows: list[Row]) -> Any:
        """The writer's event file, opened at its first write (`rows`: that
        write's), which starts with a restart marker hiding what a crashed run
        logged from the start step on."""
        events = self._events
        if events is None:  # an event file of its own (a resumed run: a new one)
            os.makedirs(self.logdir, exist_ok=True)
            suffix = f".{os.getpid()}.{next(_FILES)}{self._suffix}"
            events = self._events = self._files.EventsWriter(
                os.path.join(self.logdir, "events"), suffix
            )
            if not self._opened:  # the first write: hide what a crashed run logged
                start = self._resume_point(rows)  # from the start step on
                events.write_event(
                    self._proto.Event(
                        wall_time=time.time(),
                        step=start + 1 if start else 0,  # in completed steps
                        session_log=self._proto.SessionLog(
                            status=self._proto.SessionLog.START
                        ),
                    )
                )
                _flush(events)
        return events

    def _records(self, rows: list[Row]) -> bytes:
        """The TFRecord-framed `Event`s of `rows` (each a `Summary` of its
        scalars, `simple_value`), encoded directly: what `write_event` writes,
        without a proto object per value."""
        tags, heads, last = self._tags, self._prefixes, self._last
        headers = self._headers
        crc, pack = self._crc, struct.pack
        wall = b"\x09" + pack("<d", time.time())  # Event.wall_time
        out = []
        for row in rows:
            values = []
            for name, value in row.entries.items():
                cached = heads.get(name)
                if cached is None:  # Summary.Value: tag (1), simple_value (2)
                    tag = tags(name)
                    encoded = tag.encode()
                    prefix = b"\x0a" + _varint(len(encoded)) + encoded + b"\x15"
                    # the value's own header: its length is the prefix's plus 4
                    cached = heads[name] = (
                        tag,
                        b"\x0a" + _varint(len(prefix) + 4) + prefix,
                    )
                tag, head = cached
                try:
                    values.append(head + pack("<f", value))
                except OverflowError:
                    values.append(head + _float32(value))
                last[tag] = value
            if not values:
                continue
            body = b"".join(values)  # Summary.value (1), each length-delimited
            event = (
                wall
                + b"\x10"  # Event.step
                + _varint(row.completed)
                + b"\x2a"  # Event.summary
                + _varint(len(body))
                + body
            )
            size = len(event)
            header = headers.get(size)  # the record's length and its CRC
            if header is None:
                length = pack("<Q", size)
                header = headers[size] = length + pack("<I", crc(length))
            out.append(header + event + pack("<I", crc(event)))
        return b"".join(out)

    def _write_events(self, events: Any, rows: list[Row]) -> None:
        tags, event, last = self._tags, self._proto.Event, self._last
        summary, value_of = self._summary, self._summary.Value
        now = time.time()
        for row in rows:
            values = []
            for name, value in row.entries.items():
                tag = tags(name)
                values.append(value_of(tag=tag, simple_value=value))
                last[tag] = value
            if values:
                events.write_event(
                    event(
                        wall_time=now, step=row.completed, summary=summary(value=values)
                    )
                )

    def _close(self) -> None:
        events, self._events = self._events, None
        if events is None:
            return
        try:
            if self.hparams:
                writer = self._module.SummaryWriter(self.logdir, **self._kwargs)
                try:
                    writer.add_hparams(
                        self.hparams,
                        {f"hparams/{k}": float(v) for k, v in self._last.items()},
                        name="hparams",
                    )
                finally:
                    writer.close()
        finally:
            events.close()


def _file_of(events: Any) -> Any:
    """The local file tensorboardX's `EventsWriter` writes to, or None (another
    layout, or a remote file)."""
    writer = getattr(events, "_py_recordio_writer", None)
    file = getattr(writer, "_writer", None)
    if type(writer).__name__ != "RecordWriter" or not hasattr(file, "fileno"):
        return None
    return file


def _flush(events: Any) -> None:
    """The event file's buffer to the OS, without tensorboardX's fsync (which costs
    milliseconds; a killed process loses nothing the OS has)."""
    file = _file_of(events)
    if file is not None:
        file.flush()
    else:  # another tensorboardX layout: its own flush
        events.flush()


def _masked(fallback: Any) -> Any:
    """TFRecord's masked CRC-32C of bytes: the native `crc32c` package's
    (`ciclo[tensorboard]`) with the mask inlined, else tensorboardX's own."""
    try:
        from crc32c import crc32c
    except ImportError:
        return fallback

    def masked(data: bytes) -> int:
        x = crc32c(data)
        return (((x >> 15) | ((x << 17) & 0xFFFFFFFF)) + 0xA282EAD8) & 0xFFFFFFFF

    return masked


def _varint(n: int) -> bytes:
    """A non-negative int as a protobuf varint."""
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _float32(value: float) -> bytes:
    """`value` as a little-endian float32 (out of range: an infinity, as a proto
    float field stores it)."""
    try:
        return struct.pack("<f", value)
    except OverflowError:
        return struct.pack("<f", math.copysign(math.inf, value))
