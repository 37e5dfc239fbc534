"""`wandb_logger`: a metric writer to Weights & Biases."""

from __future__ import annotations

from typing import Any

from ciclo.callbacks._lagged import SHOWN_COLLECTIONS
from ciclo.callbacks._writer import Row, Writer, missing

__all__ = ["wandb_logger"]


class wandb_logger(Writer):
    """Logs the step's losses, metrics and stateful metrics to Weights & Biases.

    Each logged step becomes `run.log({name: value, ..., "samples": ...,
    "time": ...}, step=elapsed.steps)` (the loop's elapsed before the batch, as in
    `History`), written lagged once the device has computed the values. At the end
    of the loop (also on Ctrl-C or an error) the remaining rows are logged and, for
    a run this logger started, `run.finish()` is called; a run passed in is left
    open. Works offline (`WANDB_MODE=offline` or `mode="offline"`).

    As in the original Ciclo, `ciclo.wandb_logger(run)` takes a run from
    `wandb.init(...)`; without one, the first write calls `wandb.init(**init_kwargs)`
    (`project`, `name`, `config`, `dir`, `mode`, ...). Registration and use as
    `ciclo.tensorboard`. Needs `wandb` (`pip install 'ciclo[wandb]'`).

    Args:
        run: a `wandb` run to log to; None starts one at the first write.
        collections: the collections written.
        max_pending: at most this many rows wait for the device.
        **init_kwargs: passed to `wandb.init` when `run` is None.

    Raises:
        ImportError: if wandb is not installed ("install ciclo[wandb]").

    Example:
        >>> import os, tempfile, ciclo
        >>> logger = ciclo.wandb_logger(mode="disabled")  # offline: mode="offline"
        >>> def train_step(state, batch):
        ...     return ciclo.logs().add_loss("loss", float(batch)), state
        >>> _ = ciclo.loop(None, range(3), {ciclo.every(1): train_step, **logger})
        >>> logger.rows_written
        3
    """

    def __init__(
        self,
        run: Any = None,
        *,
        collections: tuple[str, ...] = SHOWN_COLLECTIONS,
        max_pending: int = 256,
        **init_kwargs: Any,
    ):
        try:
            import wandb
        except ImportError:
            raise missing("wandb_logger", "wandb", "wandb") from None
        super().__init__(collections=collections, max_pending=max_pending)
        if run is not None and init_kwargs:
            raise TypeError(
                f"wandb_logger: pass either a `run` or wandb.init arguments "
                f"({sorted(init_kwargs)}), not both."
            )
        self._wandb = wandb
        self.run = run
        self._owned = False
        self._init_kwargs = init_kwargs

    def _write(self, rows: list[Row]) -> None:
        if not rows:
            return
        if self.run is None:
            self.run = self._wandb.init(**self._init_kwargs)
            self._owned = True
        for row in rows:
            self.run.log(
                {**row.entries, "samples": row.samples, "time": row.time},
                step=row.steps,
            )
            self.rows_written += 1

    def _close(self) -> None:
        if self._owned and self.run is not None:
            run, self.run, self._owned = self.run, None, False
            run.finish()
