"""`inner_loop`: run a loop inside a callback and log its aggregated results."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ciclo._history import ELAPSED, History
from ciclo._logs import Logs

__all__ = ["AGGREGATIONS", "InnerLoop", "inner_loop"]


def _stack(values: list[Any]) -> np.ndarray:
    return np.stack([np.asarray(v) for v in values])


AGGREGATIONS: dict[str, Callable[[list[Any]], Any]] = {
    "last": lambda values: values[-1],
    "first": lambda values: values[0],
    "mean": lambda values: _stack(values).mean(axis=0),
    "sum": lambda values: _stack(values).sum(axis=0),
    "min": lambda values: _stack(values).min(axis=0),
    "max": lambda values: _stack(values).max(axis=0),
}

# The reductions that stack the values (they need equal shapes), by function.
_REDUCTIONS = {AGGREGATIONS[n]: n for n in ("mean", "sum", "min", "max")}

Aggregation = str | Callable[[list[Any]], Any]


def _check_aggregation(value: Any, where: str) -> Callable[[list[Any]], Any]:
    if isinstance(value, str):
        if value not in AGGREGATIONS:
            raise ValueError(
                f"inner_loop: unknown {where} {value!r}; expected one of "
                f"{list(AGGREGATIONS)}, a function of the list of values, or a dict "
                f"collection -> aggregation."
            )
        return AGGREGATIONS[value]
    if callable(value):
        return value
    raise TypeError(
        f"inner_loop: {where} must be one of {list(AGGREGATIONS)}, a function of the "
        f"list of values, or a dict collection -> aggregation; got {value!r} "
        f"({type(value).__name__})."
    )


class InnerLoop:
    """Runs `loop_fn(state) -> (state, history, elapsed)` and logs its aggregated logs.

    Each entry `name` of collection `c` in the inner history becomes entry
    `f"{name}_{suffix}"` of collection `c`, aggregated over the inner steps that
    logged it. Reading the inner history brings its values to the host once per
    call (one sync per inner loop, e.g. per epoch).

    See `inner_loop` for the arguments.
    """

    def __init__(
        self,
        name: str,
        loop_fn: Callable[[Any], tuple[Any, History, Any]],
        *,
        output_state: bool = False,
        aggregation: Aggregation | Mapping[str, Aggregation] = "last",
    ):
        if not isinstance(name, str) or not name:
            raise TypeError(
                f"inner_loop: `name` (the suffix of the logged entries) must be a "
                f"non-empty string, got {name!r}."
            )
        if not callable(loop_fn):
            raise TypeError(
                f"inner_loop: `loop_fn` must be a function state -> (state, history, "
                f"elapsed), e.g. lambda state: ciclo.test_loop(state, data()); got "
                f"{loop_fn!r} ({type(loop_fn).__name__})."
            )
        if isinstance(aggregation, Mapping):
            self._default = AGGREGATIONS["last"]
            self._per_collection = {
                collection: _check_aggregation(agg, f"aggregation[{collection!r}]")
                for collection, agg in aggregation.items()
            }
        else:
            self._default = _check_aggregation(aggregation, "aggregation")
            self._per_collection = {}
        self.name = name
        self.loop_fn = loop_fn
        self.output_state = bool(output_state)
        self.aggregation = aggregation

    def __repr__(self) -> str:
        return f"inner_loop({self.name!r}, aggregation={self.aggregation!r})"

    def aggregate(self, history: History) -> Logs:
        """The aggregated, suffixed logs of an inner `history` (a host sync)."""
        logs = Logs()
        for key in history.keys():  # noqa: SIM118 (iterating a History gives rows)
            collection, _, entry = key.partition(".")
            if collection == ELAPSED:
                continue
            values = history.collect(key)
            if not values:
                continue
            aggregate = self._per_collection.get(collection, self._default)
            try:
                value = aggregate(values)
            except ValueError as error:
                shapes = {tuple(np.shape(v)) for v in values}
                if aggregate not in _REDUCTIONS or len(shapes) < 2:
                    raise
                raise self._uneven(collection, entry, shapes, aggregate) from error
            logs.add_entry(collection, f"{entry}_{self.name}", value)
        return logs

    def _uneven(
        self, collection: str, entry: str, shapes: set[tuple[int, ...]], aggregate: Any
    ) -> ValueError:
        name = _REDUCTIONS[aggregate]
        shapes = sorted(shapes, key=str)
        other = "" if collection == "metrics" else f"'metrics': {name!r}, "
        return ValueError(
            f"inner_loop {self.name!r}: cannot take the {name!r} of "
            f"`{collection}.{entry}` over the inner steps: its values have "
            f"different shapes {shapes} (e.g. a smaller last batch). Aggregate "
            f"that collection another way with a per-collection mapping, e.g. "
            f"aggregation={{{other}{collection!r}: np.concatenate}} "
            f"(or 'last')."
        )

    def __call__(self, state: Any) -> tuple[Logs, Any]:
        """Runs the inner loop on `state`; returns `(logs, state)`.

        The returned state is the inner loop's final state with
        `output_state=True`, else `state` itself.

        Raises:
            TypeError: if `loop_fn` does not return `(state, History, elapsed)`.
            ValueError: if `"mean"`, `"sum"`, `"min"` or `"max"` meets values of
                different shapes; the message names the `collection.entry`.
        """
        output = self.loop_fn(state)
        if (
            not isinstance(output, tuple)
            or len(output) != 3
            or not isinstance(output[1], History)
        ):
            raise TypeError(
                f"inner_loop {self.name!r}: `loop_fn` must return (state, history, "
                f"elapsed) like ciclo.loop / ciclo.test_loop; got {output!r:.200}."
            )
        inner_state, history, _ = output
        return self.aggregate(history), inner_state if self.output_state else state

    def __loop_callback__(self, loop_state: Any) -> tuple[Logs, Any]:
        logs, state = self(loop_state.state)
        return logs, state if self.output_state else None


def inner_loop(
    name: str,
    loop_fn: Callable[[Any], tuple[Any, History, Any]],
    *,
    output_state: bool = False,
    aggregation: Aggregation | Mapping[str, Aggregation] = "last",
) -> InnerLoop:
    """A callback that runs a loop inside the current step and logs its results.

    Args:
        name: suffix of the logged entries (`"accuracy"` -> `"accuracy_{name}"`).
        loop_fn: `state -> (state, history, elapsed)`, e.g. a `ciclo.test_loop` call.
        output_state: use the inner loop's final state as the new state (default:
            the state is left unchanged).
        aggregation: how each entry's values over the inner steps become one value:
            `"last"`, `"first"`, `"mean"`, `"sum"`, `"min"`, `"max"` (the last four
            reduce over the steps, element-wise for arrays), a function of the list
            of values, or a dict collection -> aggregation (collections not in
            the dict use `"last"`).

    Returns:
        An `InnerLoop`, usable in any task list, or by hand: `logs, state =
        inner(state)`.

    Raises:
        TypeError: for a `loop_fn` that is not callable or a bad `aggregation`.
        ValueError: for an unknown aggregation name.

    Example:
        >>> import ciclo
        >>> def count(state, batch):
        ...     logs = ciclo.logs()
        ...     _ = logs.add_metric("x", batch)
        ...     return logs, state
        >>> inner = ciclo.inner_loop(
        ...     "valid", lambda s: ciclo.loop(s, [1, 2, 3], {ciclo.every(1): count}),
        ...     aggregation="sum")
        >>> logs, state = inner(None)
        >>> float(logs.metrics.x_valid)
        6.0
    """
    return InnerLoop(name, loop_fn, output_state=output_state, aggregation=aggregation)
