"""`keras_bar`: a Keras-style progress bar (pkbar) showing the step's losses and metrics."""

from __future__ import annotations

import importlib.util
import io
import re
import sys
import time as _time
from pathlib import Path
from types import ModuleType

from ciclo._period import Period
from ciclo._short import short
from ciclo.callbacks._bar import ProgressBar
from ciclo.callbacks._progress import format_duration


def _load_pkbar() -> ModuleType:
    """pkbar's bar module, without running `pkbar/__init__.py`.

    That `__init__` imports `pkg_resources` only to read pkbar's own version;
    setuptools >= 81 deprecates `pkg_resources` and the newest releases no longer
    ship it, so importing the package fails in any environment where installing
    e.g. tensorboard pulled the newest setuptools. The bar itself (`pkbar.pkbar`)
    needs only numpy. Loaded from pkbar's installed files, the environment is left
    as it is (nothing is installed or stubbed into `sys.modules`).
    """
    loaded = sys.modules.get("pkbar.pkbar")
    if loaded is not None:
        return loaded
    spec = importlib.util.find_spec("pkbar")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("No module named 'pkbar'", name="pkbar")
    path = Path(next(iter(spec.submodule_search_locations))) / "pkbar.py"
    module_spec = importlib.util.spec_from_file_location("ciclo._pkbar", path)
    if module_spec is None or module_spec.loader is None:
        raise ModuleNotFoundError(
            f"pkbar's bar module is missing ({path})", name="pkbar"
        )
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


pkbar = _load_pkbar()

__all__ = ["keras_bar"]


class keras_bar(ProgressBar):
    """A Keras-style progress bar, drawn with pkbar.

        80/100 [========================>.....] - ETA: 4s - loss: 0.3821 - accuracy: 0.9012

    Shows the losses, metrics and stateful metrics logged so far (by bare name, each
    once, latest value — not averaged, since one bar spans the whole run), with an
    ETA when `total` is known, once the bar has timed some progress (no ETA before
    there is a rate). Values are read lagged from the loop's `History` (the run's
    one device-to-host stream; the bar makes no transfer of its own): each redraw
    shows the newest value on the host, and the bar redraws at most every
    `interval` seconds, so it never makes the host wait for the device during
    training. The final values are shown
    when the total is reached or the loop ends (also on Ctrl-C or an error), and
    the line is then closed with a newline.

    When `sys.stdout` is not a terminal (a log file, a pipe, CI), or with
    `plain=True`, the bar is not redrawn: it prints a plain line every
    `plain_interval` seconds, and a final line when the loop ends:

        40/100 - 12s - ETA: 18s - loss: 0.3821 - accuracy: 0.9012

    and at each epoch end of `train_loop` an epoch summary, as Keras prints it:
    every scalar loss and metric the epoch-end step logged (train entries, then
    the test ones, and the `epoch_logs` ones), exact (not lagged), and the
    epoch's seconds per step (wall-clock, over the epoch's steps):

        400/1000 - 12s - 25ms/step - loss: 0.3821 - loss_test: 0.4012

    The summary is printed once its history row is on the host (no wait on the
    device: a few steps later when the device runs behind), in order, and the
    last epoch's summary is the final line. `verbose=2` prints these summary
    lines (and the final line) also on a terminal, as Keras's `verbose=2`.

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
        interval: the least seconds between two redraws (on a terminal).
        plain_interval: the seconds between two plain lines (not a terminal).
        plain: True: always plain lines; False: always redraw in place; None
            (default): plain lines when `sys.stdout` is not a terminal (a Jupyter
            cell counts as one).
        width: the width of the bar in characters.
        verbose: 1 draws the bar, 2 prints only the epoch summaries and the
            final line (also when the loop ends before `total`), 0 prints nothing.

    Raises:
        TypeError: if `total` is neither an int nor a `Period`.
        ValueError: if `total`, `interval` or `plain_interval` is negative, or
            `verbose` is invalid.

    Example:
        >>> import contextlib, io, ciclo
        >>> def train_step(state, batch):
        ...     logs = ciclo.logs()
        ...     _ = logs.add_loss("loss", 1.0 / (batch + 1))
        ...     return logs, state
        >>> bar = ciclo.keras_bar(total=4)
        >>> out = io.StringIO()  # not a terminal: plain lines
        >>> with contextlib.redirect_stdout(out):  # pkbar prints to sys.stdout
        ...     _ = ciclo.loop(None, range(4), {ciclo.every(1): train_step, **bar})
        >>> print(out.getvalue(), end="")  # doctest: +ELLIPSIS
        4/4 - ...s - loss: 0.2500

        In `train_loop`, one summary line per epoch (here with a test set):

        >>> def test_step(state, batch):
        ...     return ciclo.logs().add_loss("loss", 0.5)
        >>> out = io.StringIO()
        >>> with contextlib.redirect_stdout(out):
        ...     _ = ciclo.train_loop(
        ...         None, range(4), {"train_step": train_step, "test_step": test_step},
        ...         callbacks=[ciclo.keras_bar()], test_dataset=lambda: [0],
        ...         epoch_duration=2)
        >>> print(out.getvalue(), end="")  # doctest: +ELLIPSIS
        2/Unknown - 0s - ...s/step - loss: 0.5000 - loss_test: 0.5000
        4/Unknown - 0s - ...s/step - loss: 0.2500 - loss_test: 0.5000
    """

    def __init__(
        self,
        total: int | Period | None = None,
        *,
        interval: float = 0.1,
        plain_interval: float = 10.0,
        plain: bool | None = None,
        width: int = 30,
        verbose: int = 1,
    ):
        super().__init__(total, interval, plain_interval, plain)
        if verbose not in (0, 1, 2):
            raise ValueError(f"`verbose` must be 0, 1 or 2; got {short(verbose)}.")
        if isinstance(width, bool) or not isinstance(width, int) or width < 1:
            raise ValueError(f"`width` must be a positive int; got {short(width)}.")
        self.width = width
        self.verbose = verbose
        self._kbar: pkbar.Kbar | None = None

    def _stream(self):
        return sys.stdout  # pkbar writes there

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
        if self.verbose != 1:  # verbose=2 prints only the final line
            return
        rate = self._rate(current)
        if self._plain:
            eta = None
            if rate is not None and target is not None:
                eta = rate * (target - current)
            current, target, _ = _whole_units(current, target, unit)
            _write(_summary(current, target, self._seconds, values, eta))
            return
        shown, target, unit = _whole_units(current, target, unit)
        kbar = self._bar(target, unit)
        items = list(values.items())
        if rate is not None:
            # pkbar's ETA is (seconds since it started / current) * remaining; move
            # its start so that the rate is the one measured by this bar (which
            # opens mid-run when resumed, and after the first, compiling step).
            kbar._start = _time.time() - rate * current
            kbar.update(shown, values=items)
        elif target is not None and shown < target:
            _update_without_eta(kbar, shown, items)  # no rate: no `ETA: 0s`
        else:
            kbar.update(shown, values=items)

    def _summarizes(self) -> bool:
        # Keras: verbose=2 is one line per epoch, also on a terminal
        return self.verbose == 2 or (self.verbose == 1 and self._plain)

    def _draw_epoch(self, current, target, unit, values, per_step) -> None:
        current, target, _ = _whole_units(current, target, unit)
        _write(_summary(current, target, self._seconds, values, per_step=per_step))

    def _close(self, current, target, unit, values) -> None:
        rate = self._rate(current)
        current, target, unit = _whole_units(current, target, unit)
        if unit == "ms" and target is not None:
            current = min(current, target)  # reached: don't show the read latency
        if self.verbose == 2 or (self.verbose == 1 and self._plain):
            if not self._end_summarized:  # else that line was the last epoch's
                _write(_summary(current, target, self._seconds, values))
        elif self.verbose == 1:
            kbar = self._bar(target, unit)
            items = list(values.items())
            if rate is not None:
                kbar._start = _time.time() - rate * current
            if rate is None and target is not None and current < target:
                _update_without_eta(kbar, current, items)
            else:
                kbar.update(current, values=items)
            if target is None or current < target:
                sys.stdout.write("\n")  # pkbar ends the line only at its target
                sys.stdout.flush()
        self._kbar = None


_ETA = re.compile(r" - ETA: [^ ]+")


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _per_step(seconds: float) -> str:
    """`2s/step`, `25ms/step` or `310us/step`, as Keras writes it."""
    if seconds >= 1:
        return f"{seconds:.0f}s/step"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.0f}ms/step"
    return f"{seconds * 1e6:.0f}us/step"


def _update_without_eta(kbar: pkbar.Kbar, current: float, values: list) -> None:
    """`kbar.update` with its ETA (computed from no measured rate) left out."""
    stdout = sys.stdout
    sys.stdout = buffer = io.StringIO()
    try:
        kbar.update(current, values=values)
    finally:
        sys.stdout = stdout
    text = buffer.getvalue()
    shown = _ETA.sub("", text, count=1)
    # blank the columns the ETA took: the previous line may have been that long
    _write(shown + " " * (len(text) - len(shown)))


def _whole_units(current: float, target: float | None, unit: str):
    """pkbar shows whole units: a time total under 10 s is shown in milliseconds."""
    if unit == "s" and target is not None and target < 10:
        return current * 1000.0, target * 1000.0, "ms"
    return current, target, unit


def _summary(
    current: float,
    target: float | None,
    seconds: float,
    values,
    eta: float | None = None,
    per_step: float | None = None,
) -> str:
    """One plain line, as pkbar writes its final line with verbose=2:
    `40/100 - 12s - ETA: 18s - loss: 0.3821 - accuracy: 0.9012`; an epoch's,
    as Keras: `40/100 - 12s - 25ms/step - loss: 0.3821 - loss_test: 0.4012`."""
    parts = [f"{int(current)}/{'Unknown' if target is None else int(target)}"]
    parts.append(f"{seconds:.0f}s")
    if eta is not None:
        parts.append(f"ETA: {format_duration(eta)}")
    if per_step is not None:
        parts.append(_per_step(per_step))
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
