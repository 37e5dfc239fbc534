"""`managed.train_step` and `managed.step`: make a function a `ManagedStep`.

`train_step` differentiates the step's logged losses and applies the gradients;
`step` runs without gradients. Both run under the state's strategy
(`ciclo.managed._managed_step`).
"""

from __future__ import annotations

import functools
from typing import Any

from ciclo.managed._managed_step import GradsFn, ManagedStep, UserStep

__all__ = ["step", "train_step"]


def train_step(
    fn: UserStep | None = None,
    *,
    log_grad_norm: bool = False,
    grads_fn: GradsFn | None = None,
    steps_per_call: int | None = None,
    fused_logs: str | None = None,
) -> Any:
    """Makes `fn` a training step: ciclo differentiates its losses and applies them.

    `fn(state)`, `fn(state, batch)` or `fn(state, batch, elapsed)` returns logs, a
    state, or `(logs, state)` (as any callback), with at least one scalar loss
    (`logs.add_loss(...)`). ciclo sums the entries of `losses`, differentiates the
    sum w.r.t. `state.params` (`fn` runs on `state.replace(params=...)`), averages
    the gradients (and a `batch_stats` field) across devices as the strategy
    requires, and applies them with `apply_gradients` to the state `fn` returned
    (the state it got when it returned only logs).

    Logs come back reduced across devices: losses and metrics averaged, stateful
    metrics merged and computed, outputs concatenated. A stateful metric logged
    under the name of a state field holding one is merged into that field first,
    so the logged value is accumulated since the field was last reset.

    Use it as `@managed.train_step` or with options,
    `@managed.train_step(log_grad_norm=True)` / `managed.train_step(fn, ...)`.

    Args:
        fn: the step.
        log_grad_norm: also log the gradients' global norm
            (`optax.tree.norm`, formerly `optax.global_norm`, after averaging
            across devices) as the metric `grad_norm`.
        grads_fn: `grads_fn(grads)` or `grads_fn(grads, state)` -> logs or None,
            called inside the compiled step with the averaged gradients and the
            state `fn` returned (before the update); the logs it returns are
            added to the step's (e.g. per-layer norms). The step stays unchanged.
        steps_per_call: the steps a loop fuses into one compiled call (None or
            1: no fusing).
        fused_logs: what a fused call logs: `"all"` (default; the last step's
            values, and one history row per step with its real `steps` and
            `samples`) or `"mean"` (one row per call: losses and metrics
            averaged over the call's steps, stateful metrics as accumulated at
            its last step, outputs concatenated). A state with a `fused_logs`
            attribute (`create_flax_state(..., fused_logs=...)`) sets the
            default.

    Returns:
        A `ManagedStep` callable as `logs, state = step(state, batch[, elapsed])`,
        usable as a loop callback or spread with `**` into a task dict (or, with
        `fn` omitted, a decorator that makes one).

    Raises:
        TypeError: if `fn` or `grads_fn` is not a function of the right arity;
            (when called) if a loss is not a scalar or the return value has the
            wrong shape.
        ValueError: (when called) if `fn` logs no loss.

    Example:
        >>> import ciclo, jax.numpy as jnp, optax
        >>> from ciclo import managed
        >>> @managed.train_step(log_grad_norm=True)
        ... def fit(state, batch):
        ...     return ciclo.logs().add_loss("mse", jnp.mean((state.params * batch - 1) ** 2))
        >>> state = managed.ManagedState.create(params=jnp.zeros(()), tx=optax.sgd(0.1))
        >>> logs, state = fit(state, jnp.ones(4))
        >>> float(logs.losses.mse), float(logs.metrics.grad_norm), int(state.step)
        (1.0, 2.0, 1)

        Fused: 4 steps per compiled call, `elapsed` and history still per step:

        >>> fused = managed.train_step(fit.fn, steps_per_call=4)
        >>> _, history, elapsed = ciclo.loop(state, [jnp.ones(4)] * 10, {**fused})
        >>> elapsed.steps, history.collect("steps")[:5], len(history)
        (10, [0, 1, 2, 3, 4], 10)
    """
    options = dict(
        log_grad_norm=log_grad_norm,
        grads_fn=grads_fn,
        steps_per_call=steps_per_call,
        fused_logs=fused_logs,
    )
    if fn is None:
        return functools.partial(train_step, **options)
    return ManagedStep(fn, grad=True, **options)


def step(fn: UserStep) -> ManagedStep:
    """Makes `fn` a step that runs under the state's strategy, without gradients
    (evaluation, prediction, metric updates).

    `fn` takes `(state)`, `(state, batch)` or `(state, batch, elapsed)` and returns
    logs, a state, or `(logs, state)`. Logs are reduced across devices and
    stateful metrics accumulated into state fields of the same name, as in
    `train_step`. Never donates the state's buffers.

    Args:
        fn: the step.

    Returns:
        A `ManagedStep` callable as `logs, state = step(state, batch[, elapsed])`,
        usable as a loop callback or spread with `**` into a task dict.

    Raises:
        TypeError: if `fn` is not a function of one to three positional
            parameters; (when called) if its return value has the wrong shape.

    Example:
        >>> import ciclo, jax.numpy as jnp, optax
        >>> from ciclo import managed
        >>> @managed.step
        ... def evaluate(state, batch):
        ...     return ciclo.logs().add_metric("mean", jnp.mean(state.params * batch))
        >>> state = managed.ManagedState.create(params=jnp.ones(()), tx=optax.sgd(0.1))
        >>> logs, _ = evaluate(state, jnp.arange(4.0))
        >>> float(logs.metrics.mean)
        1.5
        >>> _, history, _ = ciclo.loop(state, [jnp.ones(2)] * 3, {**evaluate})
        >>> history.collect("mean")
        [1.0, 1.0, 1.0]
    """
    return ManagedStep(fn, grad=False)
