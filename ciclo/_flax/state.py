"""`FlaxState`: a `ManagedState` for Flax models with Keras-like steps.

The steps are managed steps (`ciclo.managed`), so they run under the state's
strategy; as methods of the class they self-register in `ciclo.train_loop`,
`test_loop` and `predict_loop`, and `logs, state = state.train_step(batch)` works by
hand. What differs between Flax Linen and Flax NNX lives in the model adapter
(`ciclo._flax.linen.LinenModel`, `ciclo._flax.nnx.NNXModel`; their interface is
`ciclo._flax.adapter`) held in `state.config`.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable
from typing import Any

import jax
from flax import struct

from ciclo import managed
from ciclo._flax.adapter import Forward, ModelAdapter
from ciclo._flax.batch import unpack_batch
from ciclo._flax.objectives import RESERVED, Objectives, total_weight
from ciclo._logs import SAMPLE_WEIGHT, WEIGHTS, Logs
from ciclo._strategies.registry import strategy_of
from ciclo.managed._step_logs import grad_logs

__all__ = ["FlaxConfig", "FlaxState", "new_state"]


@dataclasses.dataclass(frozen=True, eq=False)
class FlaxConfig:
    """The static part of a `FlaxState` (compared by identity, so jit caches hit).

    Attributes:
        model: the adapter that runs the Linen or NNX model.
        objectives: the losses and metrics.
        log_grad_norm: log the gradients' global norm as the metric `grad_norm`.
        grads_fn: `grads_fn(grads[, state]) -> logs or None`, called in each
            train step with the gradients; its logs are added to the step's.
        steps_per_call: the train steps `train_loop` fuses into one call.
        fused_logs: `"all"` or `"mean"`: what a fused call logs.
    """

    model: ModelAdapter
    objectives: Objectives
    log_grad_norm: bool = False
    grads_fn: Any = None
    steps_per_call: int = 1
    fused_logs: str = "all"


def _step_keys(state: FlaxState, training: bool, elapsed: Any) -> tuple[Any, Any]:
    """(model key, loss key): fresh each train step (folded from `state.step`);
    in evaluation, fresh per evaluated batch when the loop gives `elapsed`."""
    base = jax.random.fold_in(state.key, state.step)
    if not training:
        base = jax.random.fold_in(base, 1)
        if elapsed is not None:
            base = jax.random.fold_in(base, elapsed.steps)
    model_key, loss_key = jax.random.split(base)
    return model_key, loss_key


def _forward(
    state: FlaxState, batch: Any, *, training: bool, elapsed: Any = None
) -> tuple[Logs, Forward, dict[str, Any]]:
    b = unpack_batch(batch)
    reserved = sorted(set(b.extras) & (RESERVED - {"mask"}))
    if reserved:
        raise TypeError(
            f"The dict batch has keys {reserved}, which are names ciclo gives to "
            f"losses and metrics itself; rename them in the dataset."
        )
    model_key, loss_key = _step_keys(state, training, elapsed)
    out = state.config.model.apply(state, b.inputs, training=training, key=model_key)
    available = dict(b.extras)
    available.update(
        preds=out.preds,
        logits=out.preds,
        inputs=b.inputs,
        params=state.params,
        batch_stats=state.batch_stats,
        key=loss_key,
    )
    if b.target is not None:
        available.update(target=b.target, labels=b.target)
    if b.sample_weight is not None:
        available["sample_weight"] = b.sample_weight
        available.setdefault("mask", b.sample_weight)
    logs, metric_states = state.config.objectives.evaluate(
        available, out.sown_losses, out.sown_metrics, state.metric_states,
        _combine(state, b.sample_weight),
    )  # fmt: skip
    if b.sample_weight is not None:  # the batch's weight, summed across devices:
        # each device's averages (and a train step's gradients) count by their
        # slice's weight, and test averages by the batch's (padded rows weigh 0)
        logs.add_entry(
            WEIGHTS, SAMPLE_WEIGHT, total_weight(b.sample_weight), aggregation="sum"
        )
    return logs, out, metric_states


def _combine(state: FlaxState, sample_weight: Any) -> Callable[[Any], Any] | None:
    """How a value of this device's slice is combined across the devices the
    step runs on (`data_parallel`: weighted by the slices' sample weights, as
    the step's logs are); None when the step is one program."""
    collectives = getattr(getattr(state, "strategy", None), "collectives", None)
    if collectives is None or collectives.axis_name is None:
        return None
    if sample_weight is None:
        return collectives.mean
    weight = total_weight(sample_weight)
    return lambda value: collectives.weighted_mean(value, weight)


def _train(state: FlaxState, batch: Any) -> tuple[Logs, FlaxState]:
    """`logs, state = state.train_step(batch)`: one optimiser step.

    Computes the losses (and the module's sown losses), differentiates their sum,
    updates `params`, `batch_stats` and the mutable collections, and accumulates
    the stateful metrics. Logs `losses`, `metrics` and `stateful_metrics`.
    """
    logs, out, metric_states = _forward(state, batch, training=True)
    if not logs.get("losses"):
        raise ValueError(
            "FlaxState.train_step has no loss to minimise: pass losses={'loss': fn} "
            "to create_flax_state, or sow one in the module into the 'losses' "
            "collection."
        )
    return logs, state.replace(
        batch_stats=out.batch_stats,
        collections=out.collections,
        metric_states=metric_states,
    )


def _test(state: FlaxState, batch: Any, elapsed: Any) -> tuple[Logs, FlaxState]:
    """`logs, state = state.test_step(batch)`: evaluates a batch.

    The model runs in evaluation mode (running BatchNorm averages, no dropout).
    Logs the losses, metrics and accumulated stateful metrics.
    """
    logs, out, metric_states = _forward(state, batch, training=False, elapsed=elapsed)
    return logs, state.replace(
        batch_stats=out.batch_stats,
        collections=out.collections,
        metric_states=metric_states,
    )


def _predict(state: FlaxState, batch: Any, elapsed: Any) -> tuple[Logs, FlaxState]:
    """`logs, state = state.predict_step(batch)`: predicts a batch.

    Logs the model's output as `outputs.preds` (the batch may be inputs alone).
    """
    inputs = unpack_batch(batch).inputs
    model_key, _ = _step_keys(state, False, elapsed)
    out = state.config.model.apply(state, inputs, training=False, key=model_key)
    logs = Logs()
    logs.add_output("preds", out.preds)
    return logs, state


def _grads(grads: Any, state: FlaxState) -> Logs:
    """The train step's `grads_fn`: what `log_grad_norm` / `grads_fn` ask for."""
    config = state.config
    return grad_logs(grads, state, config.log_grad_norm, config.grads_fn)


# FlaxConfig -> the empty metric states, on the host (numpy), for `reset_step`
_EMPTY: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class FlaxState(managed.ManagedState):
    """A managed state for a Flax Linen or NNX model, its losses and metrics.

    Create it with `ciclo.create_flax_state`. Its `train_step`, `test_step`,
    `predict_step` and `reset_step` self-register in `ciclo.train_loop`,
    `test_loop` and `predict_loop`, and can be called by hand.

    Attributes:
        params: the trainable parameters (Linen: the `params` collection; NNX: an
            `nnx.State` of the `nnx.Param` variables).
        batch_stats: BatchNorm statistics (Linen collection / NNX `nnx.BatchStat`
            state); `{}` when the model has none.
        collections: the other variables (Linen: mutable collections other than
            `params` and `batch_stats`; NNX: every other variable, RNG state
            included).
        key: a `jax.random.key`; each train step folds `step` into it, so dropout
            gets a fresh, reproducible key every step.
        metric_states: the accumulated stateful metrics (`clu.metrics.Metric`
            classes given in `metrics`, and the `avg_<loss>` running mean of each
            loss), emptied by `reset_step`.
        config: static: the model adapter, the losses/metrics and the gradient
            options.

    Example:
        >>> import ciclo, jax.numpy as jnp, optax, flax.linen as nn
        >>> state = ciclo.create_flax_state(
        ...     nn.Dense(1), jnp.ones((4, 2)), optax.sgd(0.1),
        ...     losses={"mse": lambda preds, target: ((preds - target) ** 2).mean()})
        >>> logs, state = state.train_step((jnp.ones((4, 2)), jnp.zeros((4, 1))))
        >>> sorted(logs.losses), sorted(logs.stateful_metrics), int(state.step)
        (['mse'], ['avg_mse'], 1)
    """

    batch_stats: Any
    collections: Any
    key: jax.Array
    metric_states: Any
    config: FlaxConfig = struct.field(pytree_node=False)

    train_step = managed.train_step(_train, grads_fn=_grads)
    test_step = managed.step(_test)
    predict_step = managed.step(_predict)

    def reset_step(self) -> FlaxState:
        """Returns the state with every stateful metric emptied (`Metric.empty()`),
        the `avg_<loss>` running means included.

        Example:
            >>> import ciclo, jax.numpy as jnp, optax, flax.linen as nn
            >>> state = ciclo.create_flax_state(nn.Dense(1), jnp.ones((1, 2)),
            ...     optax.sgd(0.1), losses={"loss": lambda preds: (preds**2).mean()})
            >>> _, state = state.train_step(jnp.ones((1, 2)))
            >>> int(state.reset_step().metric_states["avg_loss"].count)
            0
        """
        strategy = strategy_of(self)
        empty = _EMPTY.get(self.config)
        if empty is None:  # built once, kept on the host: no device op per reset
            empty = jax.device_get(self.config.objectives.empty_states())
            _EMPTY[self.config] = empty
        return self.replace(metric_states=strategy.place_state(empty))

    @property
    def steps_per_call(self) -> int:
        """The train steps `ciclo.train_loop` fuses into one compiled call
        (`create_flax_state(..., steps_per_call=K)`); 1: no fusing."""
        return self.config.steps_per_call

    @property
    def fused_logs(self) -> str:
        """What a fused call logs: `"all"` (a row per step) or `"mean"`."""
        return self.config.fused_logs

    @property
    def model(self) -> Any:
        """The model with this state's values, ready to call for inference.

        Linen: the module bound to the variables (`state.model(x, ...)`); NNX: a
        fresh `nnx.Module` (a copy: changing it does not change the state). Under
        `data_parallel`, call `state.with_strategy("jit").model`.

        Example:
            >>> import ciclo, jax.numpy as jnp, optax, flax.linen as nn
            >>> state = ciclo.create_flax_state(nn.Dense(3), jnp.ones((1, 2)),
            ...     optax.sgd(0.1))
            >>> state.model(jnp.ones((5, 2))).shape
            (5, 3)
        """
        return self.config.model.bind(self)


def new_state(
    model: Any,
    objectives: Objectives,
    *,
    log_grad_norm: bool,
    grads_fn: Any,
    **fields: Any,
) -> FlaxState:
    """A `FlaxState` for `model` (Linen or NNX) with `objectives`' empty metric
    states; `fields` are `FlaxState.create`'s (apply_fn, params, tx, strategy,
    batch_stats, collections, key)."""
    config = FlaxConfig(
        model=model,
        objectives=objectives,
        log_grad_norm=log_grad_norm,
        grads_fn=grads_fn,
    )
    empty = _EMPTY[config] = jax.device_get(objectives.empty_states())
    return FlaxState.create(metric_states=empty, config=config, **fields)
