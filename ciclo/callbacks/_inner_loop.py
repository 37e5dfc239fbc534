"""`inner_loop`: run a loop inside a callback and log its aggregated results."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

from ciclo._history.history import History
from ciclo._history.store import ELAPSED
from ciclo._logs import (
    LOSSES,
    METRICS,
    SAMPLE_WEIGHT,
    STATEFUL_METRICS,
    WEIGHTS,
    Logs,
)
from ciclo._short import short
from ciclo._time import Elapsed
from ciclo.callbacks._aggregation import (
    AGGREGATIONS,
    REDUCTIONS,
    Aggregation,
    Spec,
    weighted_mean,
)

if TYPE_CHECKING:
    from ciclo._loop.state import LoopState

__all__ = ["AGGREGATIONS", "TEST_AGGREGATION", "InnerLoop", "inner_loop"]


# The test loops' aggregation (`train_loop`'s evaluation; pass it to an
# `inner_loop` running a test loop): stateful metrics accumulate, so their last
# value is the result; losses and per-batch metrics are averaged weighting each
# batch by its size. Read-only. (A plain `inner_loop` defaults to "last", as in
# Ciclo 0.1.)
TEST_AGGREGATION: Mapping[str, str] = MappingProxyType(
    {
        STATEFUL_METRICS: "last",
        LOSSES: "weighted_mean",
        METRICS: "weighted_mean",
    }
)


class InnerLoop:
    """Runs `loop_fn(state) -> (state, history, elapsed)` and logs its aggregated logs.

    Each entry `name` of collection `c` in the inner history becomes entry
    `f"{name}_{suffix}"` of collection `c`, aggregated over the inner steps that
    logged it. Reading the inner history brings its values to the host once per
    call (one sync per inner loop, e.g. per epoch).

    See `inner_loop` for the arguments.
    """

    reads_batch = False  # its hooks never read the loop's batch

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
                f"non-empty string, got {short(name)}."
            )
        if not callable(loop_fn):
            raise TypeError(
                f"inner_loop: `loop_fn` must be a function state -> (state, history, "
                f"elapsed), e.g. lambda state: ciclo.test_loop(state, data()); got "
                f"{short(loop_fn)} ({type(loop_fn).__name__})."
            )
        self._spec = Spec(aggregation, "inner_loop: aggregation", "last")
        self.name = name
        self.loop_fn = loop_fn
        self.output_state = bool(output_state)
        self.aggregation = aggregation

    def __repr__(self) -> str:
        return f"inner_loop({self.name!r}, aggregation={self.aggregation!r})"

    def _aggregation(
        self, collection: str, entry: str, declared: str | None = None
    ) -> Callable[..., Any]:
        mode = self._spec.mode(collection, entry, declared)
        return AGGREGATIONS[mode] if isinstance(mode, str) else mode

    def aggregate(
        self,
        history: History,
        elapsed: Any = None,
        declared: Mapping[tuple[str, str], str] | None = None,
    ) -> Logs:
        """The aggregated, suffixed logs of an inner `history` (a host sync).

        `elapsed` (the inner loop's final one) gives the size of the last batch
        for the weighted mean; `declared`, the modes the inner steps declared
        (`logs.add_metric(..., aggregation=...)`), which win over a collection's
        or the default mode, not over a key naming the entry."""
        declared = declared or {}
        logs = Logs()
        sizes: dict[int, float] | None = None
        for key in history.keys():  # noqa: SIM118 (iterating a History gives rows)
            collection, _, entry = key.partition(".")
            if collection == ELAPSED or (collection, entry) == (WEIGHTS, SAMPLE_WEIGHT):
                continue
            aggregate = self._aggregation(
                collection, entry, declared.get((collection, entry))
            )
            if aggregate is weighted_mean:
                steps, values = history.collect(f"{ELAPSED}.steps", key)
                if sizes is None:
                    sizes = _batch_sizes(history, elapsed)
                args = (values, [sizes.get(s, 0.0) for s in steps])
            else:
                values = history.collect(key)
                args = (values,)
            if not values:
                continue
            try:
                value = aggregate(*args)
            except ValueError as error:
                shapes = {tuple(np.shape(v)) for v in values}
                if aggregate not in REDUCTIONS or len(shapes) < 2:
                    raise
                raise self._uneven(collection, entry, shapes, aggregate) from error
            logs.add_entry(collection, f"{entry}_{self.name}", value)
        return logs

    def _uneven(
        self, collection: str, entry: str, shapes: set[tuple[int, ...]], aggregate: Any
    ) -> ValueError:
        name = REDUCTIONS[aggregate]
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
            TypeError: if `loop_fn` does not return `(state, history, elapsed)`
                with a `History` or a list of log dicts.
            ValueError: if `"mean"`, `"sum"`, `"min"` or `"max"` meets values of
                different shapes; the message names the `collection.entry`.
        """
        output = self.loop_fn(state)
        history = None
        if isinstance(output, tuple) and len(output) == 3:
            history = as_history(output[1])
        if history is None:
            raise TypeError(
                f"inner_loop {self.name!r}: `loop_fn` must return (state, history, "
                f"elapsed) like ciclo.loop / ciclo.test_loop, the history a "
                f"ciclo.History or (as in Ciclo 0.1) a list of log dicts "
                f"{{collection: {{name: value}}}}; got {short(output, 200)}."
            )
        inner_state, _, elapsed = output
        # the modes the inner steps declared, as the history recorded them
        logs = self.aggregate(history, elapsed, history._declared)
        return logs, inner_state if self.output_state else state

    def __loop_callback__(self, loop_state: LoopState) -> tuple[Logs, Any]:
        logs, state = self(loop_state.state)
        step = loop_state.logs
        clash = [
            f"{c}.{n}" for c, entries in logs.items() for n in entries
            if n in step.get(c, ())
        ]  # fmt: skip
        if clash:
            raise ValueError(
                f"inner_loop {self.name!r}: its entries {clash} were already logged "
                f"at this step by another callback, which they would overwrite. "
                f"Rename one of them, or give the inner loop another name (its "
                f"entries are suffixed _{self.name})."
            )
        return logs, state if self.output_state else None


def as_history(history: Any) -> History | None:
    """A `History`, or Ciclo 0.1's history (a list of log dicts `{collection:
    {name: value}}`, each row's `elapsed` collection giving its step and samples,
    else row i at step i with one sample) as one; None for anything else."""
    if isinstance(history, History):
        return history
    if not isinstance(history, list | tuple) or not all(
        isinstance(row, Mapping)
        and all(isinstance(entries, Mapping) for entries in row.values())
        for row in history
    ):
        return None
    out = History()
    for i, row in enumerate(history):
        elapsed = row.get(ELAPSED, {})
        logs = Logs()
        for collection, entries in row.items():
            if collection != ELAPSED:
                logs.add_entries(collection, entries)
        out.commit(
            Elapsed.create(
                steps=int(elapsed.get("steps", i)),
                samples=int(elapsed.get("samples", i)),
            ),
            logs,
        )
    return out


def _batch_sizes(history: History, elapsed: Any) -> dict[int, float]:
    """Each row's weight in a weighted mean, by step: the total sample weight its
    step logged (`weights.sample_weight`: padded rows weigh 0), else its batch
    size, the difference of consecutive `samples` (over a gap of steps that
    logged nothing, the average per step of the gap; for the last row, up to
    `elapsed`, the loop's final one)."""
    steps, samples = history.collect(f"{ELAPSED}.steps", f"{ELAPSED}.samples")
    sizes: dict[int, float] = {}
    if not steps:
        return sizes
    if f"{WEIGHTS}.{SAMPLE_WEIGHT}" in history.keys():  # noqa: SIM118 (a list)
        weighed = history.collect(f"{ELAPSED}.steps", f"{WEIGHTS}.{SAMPLE_WEIGHT}")
        weights = {s: float(np.sum(w)) for s, w in zip(*weighed)}
    else:
        weights = {}
    if elapsed is not None:
        end = (int(elapsed.steps), int(elapsed.samples))
    elif len(steps) > 1:  # unknown: as the row before
        end = (2 * steps[-1] - steps[-2], 2 * samples[-1] - samples[-2])
    else:
        end = (steps[-1] + 1, samples[-1] + 1)
    bounds = [*zip(steps, samples), end]
    for (step, sample), (next_step, next_sample) in itertools.pairwise(bounds):
        gap = next_step - step
        sizes[step] = (next_sample - sample) / gap if gap > 0 else 0.0
    sizes.update(weights)
    return sizes


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
        loop_fn: `state -> (state, history, elapsed)`, e.g. a `ciclo.test_loop` call;
            the history may also be Ciclo 0.1's list of log dicts `{collection:
            {name: value}}` (rows without an `elapsed` collection count as steps
            0, 1, ... of one sample each), aggregated the same way.
        output_state: use the inner loop's final state as the new state (default:
            the state is left unchanged).
        aggregation: how each entry's values over the inner steps become one value:
            `"last"`, `"first"`, `"mean"`, `"weighted_mean"` (each step weighted
            by its batch size, so an uneven last batch counts for what it holds),
            `"sum"`, `"min"`, `"max"`, `"std"` (these reduce over the steps,
            element-wise for arrays), `"concat"` (concatenated along the first
            axis, scalars as 1-element arrays), a function of the list of values,
            or a dict from a collection (`"metrics"`), an entry (`"loss"`) or a
            `"collection.entry"` to an aggregation (the most specific key wins).
            Entries a dict does not cover use `"last"`. A mode the inner steps
            declared (`logs.add_metric(..., aggregation="sum")`) wins over a
            collection's mode and the default. For a test loop, pass
            `ciclo.callbacks.TEST_AGGREGATION` (stateful metrics `"last"`,
            losses and metrics `"weighted_mean"`): `train_loop`'s evaluation
            aggregates with it.

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
        >>> import numpy as np
        >>> def loss(state, batch):  # batches of 2, 2 and 1 samples
        ...     return ciclo.logs().add_loss("loss", batch.mean())
        >>> data = [np.array([1.0, 1.0]), np.array([1.0, 1.0]), np.array([4.0])]
        >>> inner = ciclo.inner_loop(  # the per-sample mean of the loss
        ...     "test", lambda s: ciclo.loop(s, data, {ciclo.every(1): loss}),
        ...     aggregation={"losses": "weighted_mean"})
        >>> float(inner(None)[0].losses.loss_test)  # (1 + 1 + 1 + 1 + 4) / 5
        1.6
    """
    return InnerLoop(name, loop_fn, output_state=output_state, aggregation=aggregation)
