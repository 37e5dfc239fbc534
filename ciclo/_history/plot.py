"""`History.plot`: learning curves with matplotlib (the `[plot]` extra).

The figure is made through pyplot, so `plt.show()` shows it in a script and
Jupyter's inline backend at the end of the cell; it is a `LearningCurves` (a
matplotlib `Figure`) that, shown as a cell's last expression, is not shown a
second time at the cell's end (`_ipython_display_`).
"""

from __future__ import annotations

import functools
import io
from typing import Any

import numpy as np

from ciclo._locate import locate

__all__ = ["plot"]

ELAPSED = "elapsed"


def plot(history: Any, keys: tuple[str, ...], path: Any, x: str) -> Any:
    """The figure of `History.plot` (see there), written to `path` when given."""
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError(
            "History.plot needs matplotlib, which is not installed: install "
            "ciclo[plot] (pip install 'ciclo[plot]')."
        ) from None
    pairs = [tuple(key.split(".", 1)) for key in history.keys()]  # noqa: SIM118 (a list)
    logged = [(c, n) for c, n in pairs if c != ELAPSED]
    groups = _groups(keys, logged)
    figure = plt.figure(
        figsize=(5.0 * len(groups) or 5.0, 3.6),
        layout="constrained",
        FigureClass=_figure_class(),
    )
    axes = figure.subplots(1, max(len(groups), 1), squeeze=False)[0]
    for axis, (title, series) in zip(axes, groups):
        for collection, name in series:
            xs, ys = history.collect(f"{ELAPSED}.{x}", f"{collection}.{name}")
            ys = [float(np.mean(y)) for y in ys]
            axis.plot(xs, ys, marker="o" if len(xs) < 30 else None, label=name)
        axis.set_title(title)
        axis.set_xlabel(x)
        axis.grid(True, alpha=0.3)
        axis.legend()
    if path is not None:
        figure.savefig(path, format="png", dpi=100)
    return figure


def _groups(
    keys: tuple[str, ...], logged: list[tuple[str, str]]
) -> list[tuple[str, list[tuple[str, str]]]]:
    """`(title, [(collection, name), ...])` per axis: a key's series, then its
    suffixed ones (`loss_test`); a series is plotted once."""
    if not keys:  # every loss and metric whose name does not extend another's
        first: dict[str, str] = {}  # name -> "collection.name", first collection
        for c, n in logged:
            if c in ("losses", "metrics"):
                first.setdefault(n, f"{c}.{n}")
        keys = tuple(
            key
            for n, key in first.items()
            if not any(n.startswith(f"{m}_") for m in first)
        )
    groups, used = [], set()
    for key in keys:
        found = locate(logged, key, "history")
        if found is None:
            raise ValueError(
                f"History.plot: {key!r} was never logged; logged: "
                f"{sorted({n for _, n in logged})}."
            )
        name = found[1]
        series = [found] + [
            (c, n) for c, n in logged if n.startswith(f"{name}_") and c == found[0]
        ]
        series = [s for s in dict.fromkeys(series) if s not in used]
        used.update(series)
        if series:
            groups.append((name, series))
    return groups


def __getattr__(name: str) -> Any:
    if name == "LearningCurves":  # made when matplotlib is first needed
        return _figure_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _figure_class() -> type:
    """`LearningCurves`: a matplotlib `Figure` shown once in a notebook."""
    import matplotlib
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    class LearningCurves(Figure):
        """The figure of `History.plot`: a matplotlib `Figure`, held by pyplot."""

        def _ipython_display_(self) -> None:
            # Shown as a cell's result, by `display(figure)` or `plt.show()`.
            # The inline backend (Jupyter, Colab) would show it again at the
            # cell's end, as it does every figure pyplot holds: once shown, it
            # is closed, as that backend closes the figures it has shown (it
            # still draws, e.g. as another cell's result).
            from IPython.display import Image, display

            buffer = io.BytesIO()
            self.savefig(buffer, format="png", bbox_inches="tight")
            display(Image(buffer.getvalue()))
            inline = "inline" in str(matplotlib.get_backend()).lower()
            if inline and self.canvas.manager is not None:
                plt.close(self)

    LearningCurves.__module__ = (
        __name__  # picklable: `ciclo._history.plot.LearningCurves`
    )
    LearningCurves.__qualname__ = "LearningCurves"
    return LearningCurves
