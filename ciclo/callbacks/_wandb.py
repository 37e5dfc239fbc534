"""`wandb_logger`: a metric writer to Weights & Biases."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Mapping
from typing import Any

from ciclo._logs import SHOWN_COLLECTIONS
from ciclo.callbacks._rows import Row, Tags
from ciclo.callbacks._writer import Writer, missing

RUN_FILE = "ciclo-run.json"  # in wandb's directory: the run a resumed run continues

__all__ = ["wandb_logger"]


class wandb_logger(Writer):
    """Logs the step's losses, metrics and stateful metrics to Weights & Biases.

    Each logged step becomes `run.log({name: value, ..., "samples": ...,
    "time": ...}, step=completed)`, `completed` being the number of steps done with
    its batch (`elapsed.steps + 1`, as Keras, clu and Jaxloop count; `History`
    counts the steps before the batch), written lagged once the device has
    computed the values. At the end
    of the loop (also on Ctrl-C or an error) the remaining rows are logged and, for
    a run this logger started, `run.finish()` is called; a run passed in is left
    open. Works offline (`WANDB_MODE=offline` or `mode="offline"`).

    As in the original Ciclo, `ciclo.wandb_logger(run)` takes a run from
    `wandb.init(...)`; without one, the first write calls `wandb.init(**init_kwargs)`
    (`project`, `name`, `config`, `dir`, `mode`, ...). Registration and use as
    `ciclo.tensorboard`. Needs `wandb` (`pip install 'ciclo[wandb]'`).

    Resuming continues the same W&B run rather than starting a new one. A run this
    logger starts gets an id (yours with `id=...`, else a new one, remembered in
    `<dir>/wandb/ciclo-run.json`); when the loop starts past step 0 (a run resumed
    from a checkpoint) the logger resumes that run (`resume="allow"`) rewound to
    the checkpoint (`resume_from="<id>?_step=<S + 1>"`, so the steps the crashed run
    logged after it are replaced, not kept twice; W&B's run rewinding). Offline,
    where wandb cannot rewind, it asks for `resume="allow"` on the same id. Pass
    `resume=`, `resume_from=` or `fork_from=` yourself to choose otherwise.

    Args:
        run: a `wandb` run to log to; None starts one at the first write.
        collections: the collections written.
        prefix: None (bare names), a prefix for every key (`"train/"`), or a dict
            from a test name to its prefix (`{"": "train/", "test": "val/"}`
            logs `loss_test` as `val/loss`), as `ciclo.tensorboard`'s.
        max_pending: kept for compatibility (the history bounds the rows that
            wait for the device).
        every: used by hand, the rows between two writes (in a loop, rows are
            written when the loop's history brings them to the host, at its end,
            Ctrl-C and `close()`); never one write per step.
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
        prefix: str | Mapping[str, str] | None = None,
        max_pending: int = 256,
        every: int = 32,
        **init_kwargs: Any,
    ):
        try:
            import wandb
        except ImportError:
            raise missing("wandb_logger", "wandb", "wandb") from None
        super().__init__(collections=collections, max_pending=max_pending, every=every)
        if run is not None and init_kwargs:
            raise TypeError(
                f"wandb_logger: pass either a `run` or wandb.init arguments "
                f"({sorted(init_kwargs)}), not both."
            )
        self._wandb = wandb
        self.run = run
        self._owned = False
        self._init_kwargs = init_kwargs
        self._tags = Tags(prefix, "wandb_logger")

    def _run_file(self) -> str:
        directory = self._init_kwargs.get("dir") or os.getcwd()
        return os.path.join(os.fspath(directory), "wandb", RUN_FILE)

    def _init(self, start: int | None) -> Any:
        """Starts this logger's run: a new one from step 0, else the run a crashed
        one left (same id), rewound to the resume point."""
        kwargs = dict(self._init_kwargs)
        path = self._run_file()
        if start is not None:  # the first write of this logger
            run_id = kwargs.get("id")
            if run_id is None and start > 0:
                try:
                    with open(path) as file:
                        run_id = json.load(file).get("id")
                except (OSError, ValueError):
                    run_id = None
            if run_id is None:
                run_id = uuid.uuid4().hex[:8]
            kwargs["id"] = run_id
            chosen = {"resume", "resume_from", "fork_from"} & set(kwargs)
            if start > 0 and not chosen:  # (wandb takes one of the three)
                mode = kwargs.get("mode", os.environ.get("WANDB_MODE"))
                if mode in ("offline", "disabled", "dryrun"):  # no rewinding there
                    kwargs["resume"] = "allow"
                else:
                    kwargs["resume_from"] = f"{run_id}?_step={start + 1}"
            if kwargs.get("mode", os.environ.get("WANDB_MODE")) != "disabled":
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w") as file:
                    json.dump({"id": run_id}, file)
        return self._wandb.init(**kwargs)

    def _write(self, rows: list[Row]) -> None:
        if not rows:
            return
        if self.run is None:
            start = None if self._opened else self._resume_point(rows)
            self.run = self._init(start)
            self._owned = True
        tags = self._tags
        for row in rows:
            self.run.log(
                {
                    **{tags(k): v for k, v in row.entries.items()},
                    "samples": row.samples,
                    "time": row.time,
                },
                step=row.completed,
            )
            self.rows_written += 1

    def _close(self) -> None:
        if self._owned and self.run is not None:
            run, self.run, self._owned = self.run, None, False
            run.finish()
