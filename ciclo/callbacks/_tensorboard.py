"""`tensorboard`: a metric writer to TensorBoard event files (tensorboardX)."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Mapping
from typing import Any

from ciclo.callbacks._lagged import SHOWN_COLLECTIONS
from ciclo.callbacks._writer import Row, Tags, Writer, missing

__all__ = ["tensorboard"]

_FILES = itertools.count()  # event files of this process: distinct names


class tensorboard(Writer):
    """Writes the step's losses, metrics and stateful metrics to TensorBoard.

    Each single-number entry becomes a scalar tagged with its bare name (`loss`,
    `accuracy`, `accuracy_test`; see `prefix`) at the number of steps completed
    with its batch (`elapsed.steps + 1`: the 20th batch's values at step 20, an
    epoch-end evaluation at the epoch boundary, as Keras's TensorBoard callback,
    clu and Jaxloop do; `History` and the CSV/JSONL `steps` column count the
    steps before the batch). Values are read lagged: a row is written once the
    device has computed it, never making the host wait during training. At the end
    of the loop (normally, on Ctrl-C or on an error) every remaining row is written
    and the event file is closed, so what was committed to the history is on disk
    when the loop returns. Events are written in the caller's thread and flushed
    at each write (not held in tensorboardX's queue for `flush_secs`), so a killed
    run loses no row it wrote.

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
        max_pending: at most this many rows wait for the device.
        **writer_kwargs: `filename_suffix` of the event files; the rest is passed to
            the `tensorboardX.SummaryWriter` that writes `hparams`.

    Raises:
        ImportError: if tensorboardX is not installed ("install ciclo[tensorboard]").

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
        **writer_kwargs: Any,
    ):
        try:
            import tensorboardX
            from tensorboardX import event_file_writer
            from tensorboardX.proto import event_pb2
            from tensorboardX.summary import scalar
        except ImportError:
            raise missing("tensorboard", "tensorboardX", "tensorboard") from None
        super().__init__(collections=collections, max_pending=max_pending)
        if not isinstance(logdir, str | os.PathLike):
            raise TypeError(f"`logdir` must be a path, got {logdir!r}.")
        if hparams is not None and not isinstance(hparams, Mapping):
            raise TypeError(f"`hparams` must be a dict, got {hparams!r}.")
        self.logdir = os.fspath(logdir)
        self.hparams = dict(hparams) if hparams else None
        self._module, self._files = tensorboardX, event_file_writer
        self._proto, self._scalar = event_pb2, scalar
        self._suffix = str(writer_kwargs.pop("filename_suffix", "") or "")
        self._kwargs = writer_kwargs
        self._tags = Tags(prefix, "tensorboard")
        self._events: Any = None
        self._last: dict[str, float] = {}

    def _write(self, rows: list[Row]) -> None:
        if not rows:
            return
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
        tags, scalar, event = self._tags, self._scalar, self._proto.Event
        now = time.time()
        for row in rows:
            for name, value in row.entries.items():
                tag = tags(name)
                events.write_event(
                    event(wall_time=now, step=row.completed, summary=scalar(tag, value))
                )
                self._last[tag] = value
            self.rows_written += 1
        events.flush()  # on disk (the OS's) now: a killed run keeps its rows

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
