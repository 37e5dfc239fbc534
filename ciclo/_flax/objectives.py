"""Losses and metrics of a `FlaxState`: validated once, evaluated inside each step."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from ciclo._flax.kwargs import KeywordCall
from ciclo._logs import Logs
from ciclo._short import short
from ciclo._strategies.base import is_stateful_metric

__all__ = [
    "RESERVED",
    "Objectives",
    "RunningMean",
    "is_metric_class",
    "reduce_sown",
    "total_weight",
]

# Names every loss/metric can ask for; a loss or metric may not take one of them.
RESERVED = frozenset(
    {"preds", "target", "inputs", "params", "batch_stats", "sample_weight", "key"}
    | {"logits", "labels", "mask"}
)


@struct.dataclass
class RunningMean:
    """The unweighted mean of the values merged since `empty()` (a stateful
    metric: `merge`, `reduce`, `compute`, like `clu.metrics.Average`).

    Example:
        >>> from ciclo._flax.objectives import RunningMean
        >>> m = RunningMean.empty().merge(RunningMean.of(1.0)).merge(RunningMean.of(2.0))
        >>> float(m.compute())
        1.5
    """

    total: jax.Array
    count: jax.Array

    @classmethod
    def empty(cls) -> RunningMean:
        return cls(jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32))

    @classmethod
    def of(cls, value: Any) -> RunningMean:
        """One value (a scalar), counted once."""
        return cls(jnp.asarray(value, jnp.float32), jnp.ones((), jnp.int32))

    def merge(self, other: RunningMean) -> RunningMean:
        return type(self)(self.total + other.total, self.count + other.count)

    def reduce(self) -> RunningMean:
        """Merges along the leading (device) axis."""
        return type(self)(self.total.sum(0), self.count.sum(0))

    def compute(self) -> jax.Array:
        return self.total / jnp.maximum(self.count, 1)


def is_metric_class(obj: Any) -> bool:
    """Whether `obj` is a stateful metric class (a `clu.metrics.Metric` subclass).

    Duck-typed, so clu is only needed by the user who passes one.

    Example:
        >>> from ciclo._flax.objectives import is_metric_class
        >>> is_metric_class(lambda preds: preds)
        False
    """
    return isinstance(obj, type) and all(
        callable(getattr(obj, m, None))
        for m in ("empty", "from_model_output", "merge", "compute")
    )


def _check_names(losses: Mapping[str, Any], metrics: Mapping[str, Any]) -> None:
    for kind, group in (("losses", losses), ("metrics", metrics)):
        if not isinstance(group, Mapping):
            raise TypeError(
                f"`{kind}` must be a dict name -> callable, got "
                f"{type(group).__name__}: {group!r}. Example: {kind}={{'name': fn}}."
            )
        for name in group:
            if not isinstance(name, str) or not name:
                raise TypeError(
                    f"`{kind}` names must be non-empty str, got {short(name)}."
                )
            if name in RESERVED:
                raise ValueError(
                    f"{'loss' if kind == 'losses' else 'metric'} name {name!r} is reserved (it is an argument "
                    f"losses and metrics receive: {sorted(RESERVED)}); rename it."
                )
    both = sorted(set(losses) & set(metrics))
    if both:
        raise ValueError(
            f"{both} are both a loss and a metric; give them different names (a "
            f"loss is shown in the progress bar and usable by metrics already)."
        )


def _per_sample(sample_weight: Any, dtype: Any = jnp.float32) -> jax.Array:
    """One weight per sample (a sample's weights averaged over its other axes)."""
    weights = jnp.asarray(sample_weight, dtype)
    return jnp.mean(weights.reshape(weights.shape[0], -1), axis=1)


def total_weight(sample_weight: Any) -> jax.Array:
    """A batch's total sample weight: what its (weighted) averages stand for."""
    return jnp.sum(_per_sample(sample_weight))


def _reduce(value: Any, call: KeywordCall, sample_weight: Any) -> Any:
    """A scalar from a loss/metric value: per-sample values are (weighted) averaged."""
    value = jnp.asarray(value)
    if value.ndim == 0:
        return value
    weighted = (
        sample_weight is not None
        and not call.takes("sample_weight")
        and value.shape[0] == jnp.shape(sample_weight)[0]
    )
    if not weighted:
        return jnp.mean(value)
    per_sample = jnp.mean(value.reshape(value.shape[0], -1), axis=1)
    weights = _per_sample(sample_weight, per_sample.dtype)
    total = jnp.sum(weights)
    safe = jnp.where(total > 0, total, 1.0)  # all-zero weights: 0, not a NaN gradient
    return jnp.sum(per_sample * weights) / safe


def reduce_sown(items: Iterable[tuple[str, Any]], kind: str) -> dict[str, Any]:
    """Reduces sown values by name: each to its mean; then losses are summed over
    the places they were sown (modules, calls) and metrics averaged."""
    grouped: dict[str, list[Any]] = {}
    for name, value in items:
        values = value if isinstance(value, tuple | list) else (value,)
        grouped.setdefault(name, []).extend(jnp.mean(jnp.asarray(v)) for v in values)
    combine = sum if kind == "losses" else (lambda vs: sum(vs) / len(vs))
    return {name: combine(values) for name, values in grouped.items() if values}


class Objectives:
    """The losses and metrics of a state, with their signatures read once.

    Args:
        losses: name -> callable returning a scalar or per-sample values.
        metrics: name -> callable (per batch), or a stateful metric class
            (`clu.metrics.Metric` subclass) accumulated until `reset_step`.
        sown_losses: the names of losses the module sows (known at creation).
        sown_metrics: the names of metrics the module sows (known at creation).

    Each loss (configured or sown) also gets a running mean `avg_<name>`, a
    stateful metric accumulated like the others (per step, unweighted) and reset
    by `reset_step`, unless a configured loss or metric or a sown value already
    has that name.

    Raises:
        TypeError: for a non-callable, a metric instance instead of its class,
            or a signature ciclo cannot call by name.
        ValueError: for a reserved name or a name used twice.

    Example:
        >>> from ciclo._flax.objectives import Objectives
        >>> o = Objectives({"loss": lambda preds, target: (preds - target) ** 2}, {})
        >>> logs, _ = o.evaluate({"preds": 3.0, "target": 1.0}, {}, {}, {})
        >>> float(logs.losses.loss)
        4.0
    """

    def __init__(
        self,
        losses: Mapping[str, Callable[..., Any]] | None,
        metrics: Mapping[str, Any] | None,
        sown_losses: tuple[str, ...] = (),
        sown_metrics: tuple[str, ...] = (),
    ):
        losses, metrics = losses or {}, metrics or {}
        _check_names(losses, metrics)
        taken = {*losses, *metrics, *sown_losses, *sown_metrics}
        # loss name -> its running mean's name
        self.averages = {
            name: f"avg_{name}"
            for name in dict.fromkeys([*losses, *sown_losses])
            if f"avg_{name}" not in taken
        }
        self.losses = tuple(KeywordCall("loss", n, f) for n, f in losses.items())
        stateless, stateful = [], []
        for name, metric in metrics.items():
            if is_metric_class(metric):
                call = KeywordCall("metric", name, metric.from_model_output)
                stateful.append((name, metric, call))
            elif is_stateful_metric(metric):
                raise TypeError(
                    f"metric {name!r} is a metric object ({type(metric).__name__}); "
                    f"pass its class instead, e.g. metrics={{{name!r}: "
                    f"{type(metric).__name__}}}: ciclo creates and resets its state."
                )
            else:
                stateless.append(KeywordCall("metric", name, metric))
        self.metrics = tuple(stateless)
        self.stateful = tuple(stateful)

    def empty_states(self) -> dict[str, Any]:
        """A fresh (`Metric.empty()`) state for every stateful metric."""
        states = {name: cls.empty() for name, cls, _ in self.stateful}
        states.update({avg: RunningMean.empty() for avg in self.averages.values()})
        return states

    def evaluate(
        self,
        available: dict[str, Any],
        sown_losses: Mapping[str, Any],
        sown_metrics: Mapping[str, Any],
        metric_states: Mapping[str, Any],
        combine: Callable[[Any], Any] | None = None,
    ) -> tuple[Logs, dict[str, Any]]:
        """Computes the losses, the sown values and the metrics of one batch.

        Args:
            available: the arguments losses and metrics may ask for (updated in
                place with each computed loss).
            sown_losses / sown_metrics: reduced values the module sowed.
            metric_states: the accumulated stateful metrics.
            combine: a loss's value combined across the devices the step runs
                on (weighted by their slices' weights), for its running mean
                `avg_<loss>`, which then counts each batch once under every
                strategy; None: the value as it is (one program).

        Returns:
            `(logs, new_metric_states)`; logs hold `losses`, `metrics` and the
            accumulated metric objects in `stateful_metrics`.

        Raises:
            TypeError: if a loss or metric asks for an argument that is missing.
            ValueError: if a sown value has the name of a configured one.
        """
        logs = Logs()
        weight = available.get("sample_weight")
        for call in self.losses:
            value = _reduce(call(available), call, weight)
            logs.add_loss(call.name, value)
            available[call.name] = value
        self._add_sown(logs, available, sown_losses, "losses")
        losses = logs.get("losses", {})
        for call in self.metrics:
            logs.add_metric(call.name, _reduce(call(available), call, weight))
        self._add_sown(logs, available, sown_metrics, "metrics")
        states = dict(metric_states)
        for name, _, call in self.stateful:
            states[name] = states[name].merge(call(available))
            logs.add_stateful_metric(name, states[name])
        for loss, avg in self.averages.items():
            if loss in losses and avg in states:
                value = losses[loss] if combine is None else combine(losses[loss])
                states[avg] = states[avg].merge(RunningMean.of(value))
                logs.add_stateful_metric(avg, states[avg])
        return logs, states

    def _add_sown(self, logs, available, values, collection) -> None:
        configured = {c.name for c in self.losses + self.metrics}
        configured |= {name for name, _, _ in self.stateful}
        configured |= set(self.averages.values())
        for name, value in values.items():
            if name in configured or name in RESERVED:
                raise ValueError(
                    f"The module sowed {name!r} into {collection!r}, but that name "
                    f"is already a configured loss/metric or a reserved argument; "
                    f"rename the sown value."
                )
            logs.add_entry(collection, name, value)
            available[name] = value
