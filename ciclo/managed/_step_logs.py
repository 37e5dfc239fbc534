"""What a managed step does with its logs inside the compiled call.

`REDUCTIONS` declares how each log collection is reduced across the devices a
strategy runs the step on (strategies only provide the collectives); a logged
stateful metric is accumulated into the state's field of the same name; a train
step differentiates the sum of its scalar losses and may log from its gradients
(`grad_logs`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax

from ciclo._logs import (
    LOSSES,
    METRICS,
    OUTPUTS,
    SAMPLE_WEIGHT,
    STATEFUL_METRICS,
    WEIGHTS,
    Logs,
)
from ciclo._loop.callback import describe, inject
from ciclo._strategies.base import Collectives, is_stateful_metric

__all__ = [
    "REDUCTIONS",
    "accumulate",
    "batch_weight",
    "grad_logs",
    "reduce_logs",
    "total_loss",
]

# collection -> how its entries are combined across devices; any other collection
# is averaged, and an entry declared "sum", "min" or "max" is combined that way. Whatever the collection, a stateful metric (anything with `merge`)
# is merged across devices and then computed; outputs without a batch axis (0-d)
# are averaged.
REDUCTIONS = {
    LOSSES: "mean",
    METRICS: "mean",
    STATEFUL_METRICS: "merge",
    OUTPUTS: "concat",
}


def reduce_logs(logs: Logs, collectives: Collectives) -> Logs:
    """Inside the step: each entry reduced across devices as `REDUCTIONS` says,
    or as the step declared it (`add_metric(..., aggregation="sum")`: a `"sum"`,
    `"min"` or `"max"` combines the devices' values that way). When the step
    logged its batch's total sample weight (`weights.sample_weight`, a Flax
    state's test step does), losses and metrics are averaged weighted by it."""
    out = Logs()
    declared = getattr(logs, "_aggregations", None)  # declared modes
    # a batch with sample weights: each device's losses and metrics stand for its
    # slice's total weight (padded rows weigh 0), so they are averaged by it
    weight = batch_weight(logs)
    for collection, name, value in logs.entries():
        mode = declared.get((collection, name)) if declared else None
        if is_stateful_metric(value):
            value = collectives.merge(value).compute()
        elif REDUCTIONS.get(collection, "mean") == "concat" and jnp.ndim(value) > 0:
            value = collectives.concat(value)
        elif mode is not None:
            value = collectives.reduce(value, mode)
        elif weight is not None and collection in (LOSSES, METRICS):
            value = collectives.weighted_mean(value, weight)
        else:
            value = collectives.mean(value)
        out.add_entry(collection, name, value)
    out._aggregations = declared
    return out


def batch_weight(logs: Logs) -> Any:
    """The batch's total sample weight the step logged (`weights.sample_weight`,
    as a Flax state's steps do for a batch with `sample_weight`), else None."""
    weights = logs.get(WEIGHTS)
    return None if weights is None else weights.get(SAMPLE_WEIGHT)


def accumulate(logs: Logs, state: Any) -> tuple[Logs, Any]:
    """Merges each logged stateful metric into the state's field of the same name
    (when the state has one holding a stateful metric); logs the accumulation."""
    metrics = logs.get(STATEFUL_METRICS)
    if not metrics:
        return logs, state
    updates = {}
    for name, value in metrics.items():
        held = getattr(state, name, None)
        if is_stateful_metric(value) and is_stateful_metric(held):
            updates[name] = held.merge(value)
    if not updates:
        return logs, state
    logs = Logs(logs)
    logs[STATEFUL_METRICS] = {**metrics, **updates}
    return logs, state.replace(**updates)


def total_loss(logs: Logs, fn: Callable[..., Any]) -> jax.Array:
    """The sum of the scalar entries of `logs["losses"]`."""
    losses = logs.get(LOSSES) or {}
    if not losses:
        logged = [f"{c}.{n}" for c, n, _ in logs.entries()]
        raise ValueError(
            f"managed.train_step {describe(fn)} logged no loss (logged: {logged}); "
            f"add one with logs.add_loss('loss', value) so there is something to "
            f"differentiate."
        )
    total = 0.0
    for name, value in losses.items():
        shape = jnp.shape(value)
        if shape != ():
            raise TypeError(
                f"Loss 'losses.{name}' logged by {describe(fn)} has shape {shape}; "
                f"losses must be scalars. Reduce it first, e.g. jnp.mean(...)."
            )
        total = total + value
    return jnp.asarray(total)


def grad_logs(
    grads: Any, state: Any, log_grad_norm: bool, grads_fn: Callable[..., Any] | None
) -> Logs:
    """What a train step logs from its gradients: `grad_norm` (with
    `log_grad_norm`) and `grads_fn(grads[, state])`'s logs."""
    logs = Logs()
    if log_grad_norm:
        logs.add_metric("grad_norm", optax.tree.norm(grads))
    if grads_fn is not None:
        extra = inject(grads_fn, grads, state)
        if extra is not None:
            if not isinstance(extra, Mapping):
                raise TypeError(
                    f"grads_fn {describe(grads_fn)} returned a "
                    f"{type(extra).__name__}; expected logs (ciclo.logs()) or None."
                )
            logs.merge(extra)
    return logs
