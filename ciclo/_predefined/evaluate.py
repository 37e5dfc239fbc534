"""`test_loop` and `predict_loop`: the tables `tables.TEST` and `tables.PREDICT`
compiled to an ordinary task dict and run as one `ciclo.loop` call
(`ciclo._predefined.assemble`), with a warning when the data yielded no batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ciclo._history.history import History
from ciclo._period import as_period
from ciclo._predefined.assemble import run_table
from ciclo._predefined.register import register
from ciclo._predefined.tables import PREDICT, TEST
from ciclo._time import Elapsed
from ciclo._warn import warn

__all__ = ["predict_loop", "test_loop"]


def _warn_if_empty(where: str, result: Any, loop_kwargs: Mapping[str, Any]) -> None:
    """Warns when a test/predict loop ran no batch (its stop not already reached)."""
    start = loop_kwargs.get("elapsed") or Elapsed.create()
    stop = loop_kwargs.get("stop")
    if result[2].steps != start.steps or (
        stop is not None and as_period(stop, "stop").reached(start)
    ):
        return
    warn(
        f"{where}: `dataset` yielded no batch (starting at step {start.steps}), so "
        f"there is nothing in the history. Expected at least one batch: check that "
        f"it is not an exhausted iterator or generator, or an empty list."
    )


def test_loop(
    state: Any,
    dataset: Iterable[Any],
    tasks: Mapping[Any, Any] | None = None,
    *,
    callbacks: list[Any] | None = None,
    **loop_kwargs: Any,
) -> tuple[Any, History, Elapsed]:
    """Evaluates: the reset steps and `on_test_begin` first; per batch
    `on_test_batch_begin`, `on_test_step`, the ordinary `tasks`, `on_test_batch_end`;
    `on_test_end` after the last batch. Registration as in `train_loop`;
    `loop_kwargs` (`stop`, `history`, `elapsed`, `catch_keyboard_interrupt`,
    `metadata`, `batch_size_fn`, `prefetch`) as in `ciclo.loop`.

    Raises:
        ValueError: if nothing would run per batch: no `on_test_step` (or other
            per-batch) callback and no ordinary schedule in `tasks`.

    Example:
        >>> import ciclo
        >>> def test_step(state, batch):
        ...     return ciclo.logs().add_metric("double", 2 * batch)
        >>> _, history, _ = ciclo.test_loop(None, [1, 2], {ciclo.on_test_step: test_step})
        >>> history.collect("double")
        [2, 4]
    """
    named, ordinary = register(TEST, state, tasks, callbacks)
    result = run_table(TEST, state, dataset, named, ordinary, **loop_kwargs)
    _warn_if_empty("ciclo.test_loop", result, loop_kwargs)
    return result


def predict_loop(
    state: Any,
    dataset: Iterable[Any],
    tasks: Mapping[Any, Any] | None = None,
    *,
    callbacks: list[Any] | None = None,
    **loop_kwargs: Any,
) -> tuple[Any, History, Elapsed]:
    """Runs inference: `on_predict_begin` first; per batch `on_predict_batch_begin`,
    `on_predict_step`, the ordinary `tasks`, `on_predict_batch_end`;
    `on_predict_end` after the last batch. Outputs logged with `logs.add_output`
    are in `history.collect("outputs.<name>")`. Arguments as in `test_loop`.

    Example:
        >>> import ciclo
        >>> def predict_step(state, batch):
        ...     return ciclo.logs().add_output("y", state * batch)
        >>> _, history, _ = ciclo.predict_loop(3, [1, 2], {"predict_step": predict_step})
        >>> history.collect("y")
        [3, 6]
    """
    named, ordinary = register(PREDICT, state, tasks, callbacks)
    result = run_table(PREDICT, state, dataset, named, ordinary, **loop_kwargs)
    _warn_if_empty("ciclo.predict_loop", result, loop_kwargs)
    return result


test_loop.__test__ = False  # not a pytest test, even when imported into a test module
