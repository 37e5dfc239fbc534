"""`keras_bar`: a Keras-style progress bar (pkbar) showing the step's losses and metrics."""

from __future__ import annotations

import sys
import time as _time

import pkbar

from ciclo._time import Period
from ciclo.callbacks._bar import ProgressBar

__all__ = ["keras_bar"]


class keras_bar(ProgressBar):
    """A Keras-style progress bar, drawn with pkbar.

        80/100 [========================>.....] - ETA: 4s - loss: 0.3821 - accuracy: 0.9012

    Shows the losses, metrics and stateful metrics logged so far (by bare name, each
    once, latest value — not averaged, since one bar spans the whole run), with an
    ETA when `total` is known. Values are read lagged: a device array is converted
    only once it is ready, and the bar redraws at most every `interval` seconds, so
    it never makes the host wait for the device during training. The final values
    are shown when the total is reached or the loop ends (also on Ctrl-C or an
    error), and the line is then closed with a newline.

    In `ciclo.loop` put it last (`{**ciclo.keras_bar(total=n)}` runs it every step);
    in `ciclo.train_loop(callbacks=[...])` it runs on `on_train_batch_end` (not in
    its test loop), in `test_loop` / `predict_loop` on their batch ends. It can
    also be called by hand as `bar(elapsed, logs)` after training on the batch
    `elapsed` came with; call `bar.close()` if the run stops before `total`.

    Args:
        total: the length of the run: an int (steps) or a `Period`
            (`ciclo.at(samples=...)`, `ciclo.at(time=...)`: seconds, or
            milliseconds for a total under 10 s); with several fields the one
            closest to being reached is shown. None: no ETA.
        interval: the least seconds between two redraws.
        width: the width of the bar in characters.
        verbose: 1 draws the bar, 2 prints only the final line (also when the
            loop ends before `total`), 0 prints nothing.

    Raises:
        TypeError: if `total` is neither an int nor a `Period`.
        ValueError: if `total` or `interval` is negative, or `verbose` is invalid.

    Example:
        >>> import contextlib, io, ciclo
        >>> def train_step(state, batch):
        ...     logs = ciclo.logs()
        ...     _ = logs.add_loss("loss", 1.0 / (batch + 1))
        ...     return logs, state
        >>> bar = ciclo.keras_bar(total=4)
        >>> out = io.StringIO()
        >>> with contextlib.redirect_stdout(out):  # pkbar prints to sys.stdout
        ...     _ = ciclo.loop(None, range(4), {ciclo.every(1): train_step, **bar})
        >>> final_line = out.getvalue().splitlines()[-1]
        >>> final_line.startswith("4/4 ["), final_line.endswith("loss: 0.2500")
        (True, True)
    """

    def __init__(
        self,
        total: int | Period | None = None,
        *,
        interval: float = 0.1,
        width: int = 30,
        verbose: int = 1,
    ):
        super().__init__(total, interval)
        if verbose not in (0, 1, 2):
            raise ValueError(f"`verbose` must be 0, 1 or 2; got {verbose!r}.")
        if isinstance(width, bool) or not isinstance(width, int) or width < 1:
            raise ValueError(f"`width` must be a positive int; got {width!r}.")
        self.width = width
        self.verbose = verbose
        self._kbar: pkbar.Kbar | None = None
        self._first: tuple[float, float] | None = None  # (current, wall time)

    def _bar(self, target: float | None, unit: str) -> pkbar.Kbar:
        if self._kbar is None:
            self._kbar = pkbar.Kbar(
                target=target,
                width=self.width,
                verbose=self.verbose,
                interval=0.0,  # ciclo throttles (and reads lagged) itself
                always_stateful=True,
                unit_name=unit,
            )
        self._kbar.target, self._kbar.unit_name = target, unit
        return self._kbar

    def _draw(self, current, target, unit, values) -> None:
        current, target, unit = _whole_units(current, target, unit)
        kbar = self._bar(target, unit)
        now = _time.time()
        if self._first is None:
            self._first = (current, now)
        else:
            # pkbar's ETA is (seconds since it started / current) * remaining; when
            # the bar opens mid-run (a resumed run, or after the first compiled step)
            # move its start so that the rate is the one measured by this bar.
            first, started = self._first
            if current > first and current > 0:
                rate = (now - started) / (current - first)
                kbar._start = now - rate * current
        kbar.update(current, values=list(values.items()))

    def _close(self, current, target, unit, values) -> None:
        current, target, unit = _whole_units(current, target, unit)
        if unit == "ms" and target is not None:
            current = min(current, target)  # reached: don't show the read latency
        kbar = self._bar(target, unit)
        kbar.update(current, values=list(values.items()))
        if target is None or current < target:
            # pkbar ends the line (verbose=1) or prints at all (verbose=2) only at
            # its target
            if self.verbose == 1:
                sys.stdout.write("\n")
            elif self.verbose == 2:
                seconds = _time.time() - kbar._start
                sys.stdout.write(_summary(current, target, seconds, values))
            sys.stdout.flush()
        self._kbar, self._first = None, None


def _whole_units(current: float, target: float | None, unit: str):
    """pkbar shows whole units: a time total under 10 s is shown in milliseconds."""
    if unit == "s" and target is not None and target < 10:
        return current * 1000.0, target * 1000.0, "ms"
    return current, target, unit


def _summary(current: float, target: float | None, seconds: float, values) -> str:
    """The final line of verbose=2, as pkbar writes it at its target."""
    parts = [f"{int(current)}/{'Unknown' if target is None else int(target)}"]
    parts.append(f"{seconds:.0f}s")
    for name, value in values.items():
        try:
            number = float(value)
        except (TypeError, ValueError):
            parts.append(f"{name}: {value}")
            continue
        parts.append(
            f"{name}: {number:.4f}" if abs(number) > 1e-3 else f"{name}: {number:.4e}"
        )
    return " - ".join(parts) + "\n"
