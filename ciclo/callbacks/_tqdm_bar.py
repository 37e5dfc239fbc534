"""`tqdm_bar`: a tqdm progress bar showing the step's losses and metrics: tqdm's
notebook widget in a Jupyter kernel (as `tqdm.auto` chooses), text elsewhere."""

from __future__ import annotations

import sys
from typing import Any

import tqdm as _tqdm

from ciclo._period import Period
from ciclo.callbacks._bar import ProgressBar

__all__ = ["tqdm_bar"]

_OWNED = ("total", "initial", "unit", "mininterval", "miniters")
# tqdm's own formats, without the bar
_PLAIN = "{n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"
_PLAIN_UNKNOWN = "{n_fmt}{unit} [{elapsed}, {rate_fmt}{postfix}]"


def _notebook_tqdm() -> type[_tqdm.tqdm] | None:
    """tqdm's notebook widget bar in a Jupyter kernel (Jupyter, Colab, VS Code)
    whose environment has ipywidgets (the `[bars]` extra installs it), as
    `tqdm.auto` picks it; None elsewhere, or without ipywidgets, where the text
    bar (redrawn in place by the kernel) stands in, without tqdm's warning."""
    ipython = sys.modules.get("IPython")
    if ipython is None:  # no IPython imported: not a kernel
        return None
    try:
        shell = ipython.get_ipython()
        if shell is None or "IPKernelApp" not in shell.config:  # a terminal IPython
            return None
        import ipywidgets  # noqa: F401  (the widget's library)
        from tqdm.notebook import IProgress
        from tqdm.notebook import tqdm as notebook
    except Exception:  # no (working) ipywidgets
        return None
    return None if IProgress is None else notebook


class tqdm_bar(ProgressBar):
    """A tqdm progress bar; the losses and metrics logged so far are its postfix.

        80%|████████  | 80/100 [00:04<00:01, 19.9step/s, loss=0.382, accuracy=0.901]

    Same behaviour as `keras_bar`: values read lagged from the loop's `History`
    (the newest on the host), redraws at most every `interval` seconds, final values
    and `close()` when the total is reached or the loop ends (also on Ctrl-C or an
    error); runs on `on_train_batch_end` in `ciclo.train_loop(callbacks=[...])`;
    spread it into a `ciclo.loop` task dict with `**`; call it by hand as
    `bar(elapsed, logs)`. In a Jupyter kernel (Jupyter, Colab, VS Code) it is
    tqdm's notebook widget, as with `tqdm.auto` (it needs ipywidgets, which the
    `[bars]` extra installs; without it, or with a `file`, the text bar). When
    `file` is not a terminal (a log file, a pipe, CI), or with `plain=True`, it
    writes one plain line (no `\\r`) every
    `plain_interval` seconds, and a final line when the loop ends:

        train: 80/100 [00:04<00:01, 19.90step/s, loss=0.382, accuracy=0.901]

    and at each epoch end of `train_loop` an epoch summary in the same form:
    every scalar loss and metric of the epoch-end step (train, then test and
    `epoch_logs` entries), exact, with the epoch's rate (as `keras_bar`:
    printed once its history row is on the host, without waiting on the device).

    Args:
        total: the length of the run: an int (steps) or a `Period`; None: no ETA.
        interval: the least seconds between two redraws (on a terminal).
        plain_interval: the seconds between two plain lines (not a terminal).
        plain: True: always plain lines; False: always a tqdm bar; None
            (default): plain lines when `file` is not a terminal (a Jupyter cell
            counts as one: there the widget, or the text bar redrawn in place).
        file: where to write (tqdm's default: `sys.stderr`).
        desc: a label in front of the bar.
        leave: keep the finished bar on screen.
        **tqdm_kwargs: any other `tqdm.tqdm` argument (`ncols`, `colour`, ...).

    Raises:
        TypeError: if `total` is neither an int nor a `Period`, or a `tqdm_kwargs`
            entry is one ciclo sets itself (`total`, `initial`, `unit`, ...).

    Example:
        >>> import io, ciclo
        >>> out = io.StringIO()  # not a terminal: plain lines
        >>> bar = ciclo.tqdm_bar(total=3, file=out)
        >>> for elapsed, batch in ciclo.elapse(range(3)):
        ...     logs = ciclo.logs()
        ...     _ = logs.add_metric("accuracy", batch / 2)
        ...     bar(elapsed, logs)
        >>> bar.closed
        True
        >>> print(out.getvalue(), end="")  # doctest: +ELLIPSIS
        3/3 [00:00<00:00, ...step/s, accuracy=1]
    """

    def __init__(
        self,
        total: int | Period | None = None,
        *,
        interval: float = 0.1,
        plain_interval: float = 10.0,
        plain: bool | None = None,
        file: Any = None,
        desc: str | None = None,
        leave: bool = True,
        **tqdm_kwargs: Any,
    ):
        super().__init__(total, interval, plain_interval, plain)
        owned = sorted(set(tqdm_kwargs) & set(_OWNED))
        if owned:
            raise TypeError(
                f"tqdm_bar sets {owned} itself; pass `total` as the first argument "
                f"(an int or a ciclo.Period) and drop the others."
            )
        self._kwargs = dict(file=file, desc=desc, leave=leave, **tqdm_kwargs)
        self._tqdm: _tqdm.tqdm | None = None

    def _stream(self) -> Any:
        file = self._kwargs["file"]
        return sys.stderr if file is None else file

    def _bar(self, current: float, target: float | None, unit: str) -> _tqdm.tqdm:
        if self._tqdm is None:
            notebook = _notebook_tqdm() if self._kwargs["file"] is None else None
            self._tqdm = (notebook or _tqdm.tqdm)(
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
        if self._plain:
            self._line(current, target, unit, values)
            return
        bar = self._bar(current, target, unit)
        bar.set_postfix(values, refresh=False)
        bar.update(current - bar.n)

    def _draw_epoch(self, current, target, unit, values, per_step) -> None:
        if unit == "s":
            current, target = round(current, 1), target and round(target, 1)
        self._line(current, target, unit, values, per_step)

    def _close(self, current, target, unit, values) -> None:
        if not self._end_summarized:  # else that line was the last epoch's
            self._draw(current, target, unit, values)
        if self._tqdm is not None:
            self._tqdm.close()
            self._tqdm = None

    def _line(self, current, target, unit, values, per_step=None) -> None:
        """One plain line: tqdm's text without the bar (and no `\\r`); an epoch
        summary's rate is the epoch's (`per_step`: seconds per step)."""
        disable = self._kwargs.get("disable", False)
        if disable or disable is None:  # None: tqdm's "disable when not a tty"
            return
        rate = self._rate(current) if per_step is None else per_step
        kwargs = self._kwargs
        line = _tqdm.tqdm.format_meter(
            current,
            target,
            self._seconds,
            unit=unit,
            unit_scale=kwargs.get("unit_scale", False),
            unit_divisor=kwargs.get("unit_divisor", 1000),
            rate=None if not rate else 1.0 / rate,
            initial=current,  # no rate measured yet: `?`, not an average
            postfix=", ".join(
                f"{name}={_tqdm.tqdm.format_num(value)}"
                for name, value in values.items()
            ),
            bar_format=_PLAIN if target is not None else _PLAIN_UNKNOWN,
        )
        desc = kwargs.get("desc")
        stream = self._stream()
        stream.write(f"{desc}: {line}\n" if desc else f"{line}\n")
        stream.flush()
