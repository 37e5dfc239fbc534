"""`tqdm_bar`: a tqdm progress bar showing the step's losses and metrics."""

from __future__ import annotations

from typing import Any

import tqdm as _tqdm

from ciclo._time import Period
from ciclo.callbacks._bar import ProgressBar

__all__ = ["tqdm_bar"]

_OWNED = ("total", "initial", "unit", "mininterval", "miniters")


class tqdm_bar(ProgressBar):
    """A tqdm progress bar; the losses and metrics logged so far are its postfix.

        80%|████████  | 80/100 [00:04<00:01, 19.9step/s, loss=0.382, accuracy=0.901]

    Same behaviour as `keras_bar`: values read lagged (a device array is converted
    only once it is ready), redraws at most every `interval` seconds, final values
    and `close()` when the total is reached or the loop ends (also on Ctrl-C or an
    error); runs on `on_train_batch_end` in `ciclo.train_loop(callbacks=[...])`;
    spread it into a `ciclo.loop` task dict with `**`; call it by hand as
    `bar(elapsed, logs)`.

    Args:
        total: the length of the run: an int (steps) or a `Period`; None: no ETA.
        interval: the least seconds between two redraws.
        file: where to write (tqdm's default: `sys.stderr`).
        desc: a label in front of the bar.
        leave: keep the finished bar on screen.
        **tqdm_kwargs: any other `tqdm.tqdm` argument (`ncols`, `colour`, ...).

    Raises:
        TypeError: if `total` is neither an int nor a `Period`, or a `tqdm_kwargs`
            entry is one ciclo sets itself (`total`, `initial`, `unit`, ...).

    Example:
        >>> import io, ciclo
        >>> out = io.StringIO()
        >>> bar = ciclo.tqdm_bar(total=3, file=out)
        >>> for elapsed, batch in ciclo.elapse(range(3)):
        ...     logs = ciclo.logs()
        ...     _ = logs.add_metric("accuracy", batch / 2)
        ...     bar(elapsed, logs)
        >>> bar.closed, "3/3" in out.getvalue(), "accuracy=1" in out.getvalue()
        (True, True, True)
    """

    def __init__(
        self,
        total: int | Period | None = None,
        *,
        interval: float = 0.1,
        file: Any = None,
        desc: str | None = None,
        leave: bool = True,
        **tqdm_kwargs: Any,
    ):
        super().__init__(total, interval)
        owned = sorted(set(tqdm_kwargs) & set(_OWNED))
        if owned:
            raise TypeError(
                f"tqdm_bar sets {owned} itself; pass `total` as the first argument "
                f"(an int or a ciclo.Period) and drop the others."
            )
        self._kwargs = dict(file=file, desc=desc, leave=leave, **tqdm_kwargs)
        self._tqdm: _tqdm.tqdm | None = None

    def _bar(self, current: float, target: float | None, unit: str) -> _tqdm.tqdm:
        if self._tqdm is None:
            self._tqdm = _tqdm.tqdm(
                total=target,
                initial=current,
                unit=unit,
                mininterval=0,  # ciclo throttles (and reads lagged) itself
                miniters=0,
                **self._kwargs,
            )
        bar = self._tqdm
        if bar.total != target or bar.unit != unit:
            bar.total, bar.unit = target, unit
        return bar

    def _draw(self, current, target, unit, values) -> None:
        if unit == "s":
            current, target = round(current, 1), target and round(target, 1)
        bar = self._bar(current, target, unit)
        bar.set_postfix(values, refresh=False)
        bar.update(current - bar.n)

    def _close(self, current, target, unit, values) -> None:
        self._draw(current, target, unit, values)
        self._tqdm.close()
        self._tqdm = None
