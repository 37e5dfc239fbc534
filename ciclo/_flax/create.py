"""`create_flax_state`: one entry point for Flax Linen and Flax NNX models."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import optax

from ciclo._flax.state import FlaxState
from ciclo._loop.callback import arity
from ciclo._short import short
from ciclo._strategies.base import Strategy

__all__ = ["create_flax_state"]

_LINEN_ONLY = ("mutable_train", "mutable_eval", "rngs_train", "rngs_eval")


def create_flax_state(
    module: Any,
    inputs: Any = None,
    tx: optax.GradientTransformation | None = None,
    *,
    key: Any = None,
    losses: Mapping[str, Callable[..., Any]] | None = None,
    metrics: Mapping[str, Any] | None = None,
    strategy: str | Strategy = "jit",
    method: str | Callable[..., Any] = "__call__",
    train_kwargs: Mapping[str, Any] | None = None,
    eval_kwargs: Mapping[str, Any] | None = None,
    mutable_train: bool | Sequence[str] | None = None,
    mutable_eval: bool | Sequence[str] | None = None,
    rngs_train: Sequence[str] | None = None,
    rngs_eval: Sequence[str] | None = None,
    log_grad_norm: bool = False,
    grads_fn: Callable[..., Any] | None = None,
    steps_per_call: int = 1,
    fused_logs: str = "all",
) -> FlaxState:
    """Creates a `FlaxState` that trains `module` with `losses` and `metrics`.

    `module` is a Flax Linen module (initialised here on `inputs`) or an
    already-built Flax NNX module (`create_flax_state(model, tx=...)` or
    `create_flax_state(model, tx)`; `inputs` optional, see below). The state's
    `train_step`, `test_step`, `predict_step` and `reset_step` make
    `ciclo.train_loop(state, data, test_dataset=..., epoch_duration=..., stop=...)`
    a one-liner.

    Losses and metrics are called with the keyword arguments they name, from:
    `preds` (the model output; alias `logits`), `target` (alias `labels`),
    `inputs`, `params`, `batch_stats`, `sample_weight`, `mask` (the batch's `mask`
    key, else `sample_weight`), `key` (a fresh PRNG key), each loss computed
    before (by its name; metrics see all losses) and the extra keys of a dict
    batch. A loss returns a scalar or per-sample values, which are averaged
    (weighted by `sample_weight` unless the loss takes it). Values the module
    sows into the `losses` / `metrics` collections are logged too; sown losses are
    added to the loss that is minimised.

    Each loss also gets a running mean, the stateful metric `avg_<name>` (the
    mean of the per-step values since the last `reset_step`, as in Ciclo 0.1), so
    `history.collect("avg_loss")` works after `train_loop`; a metric you name
    `avg_<name>` yourself replaces it (so does a value the module sows under that
    name). Sown losses get one too: the names are found at creation, so the
    state's structure is fixed, by tracing the module on `inputs` abstractly
    (`jax.eval_shape`: shapes only, no FLOPs) with the arguments the steps use.
    Linen: the `init` call and a train-mode call (a loss sown only under
    `if train:` is found). NNX: a `train()` and an `eval()` call, only when sample
    `inputs` are given (`create_flax_state(model, inputs, tx)`); without them,
    only the configured losses get a running mean. A module that cannot be
    traced on `inputs` gets a `UserWarning`, and its sown losses no running mean.

    Args:
        module: a `flax.linen.Module` or a `flax.nnx.Module`.
        inputs: sample inputs (the first positional argument of the module's
            method; a batch of any size): a Linen module is initialised on them;
            for both, a step is traced on them to find the losses the module
            sows. Optional for NNX (needed for the sown losses' `avg_<name>`).
        tx: the optax optimizer.
        key: None (seed 0), an int seed or a `jax.random.key`: initialisation
            (Linen) and the per-step RNG (dropout) derive from it.
        losses: name -> callable; their sum is minimised.
        metrics: name -> callable (computed per batch) or a stateful metric class
            (a `clu.metrics.Metric` subclass, e.g. `clu.metrics.Accuracy`,
            accumulated until `reset_step`, which the loops run every epoch).
        strategy: the managed strategy: `"eager"`, `"jit"`, `"data_parallel"`, ...
        method: the module method to call (Linen: a name or a function).
        train_kwargs / eval_kwargs: extra keyword arguments of the model call in
            training / evaluation. Default: a parameter named `training` or
            `train` gets True / False, one named `deterministic` False / True.
            NNX modules are also switched with `.train()` / `.eval()`.
        mutable_train / mutable_eval: (Linen) the collections the call may
            update: True = all that `init` created (`batch_stats`, ...), False =
            none, or a list of names. Default True in training, False in eval.
        rngs_train / rngs_eval: (Linen) the RNG streams given to the call;
            default `("dropout",)` in training, none in eval. (NNX modules use
            their own `nnx.Rngs`, re-keyed every train step.)
        log_grad_norm: log the gradients' global norm (`optax.tree.norm`) in
            each train step as the metric `grad_norm`.
        grads_fn: `grads_fn(grads)` or `grads_fn(grads, state)` -> logs or None,
            called inside each train step with the gradients (averaged across
            devices) and the state before the update; its logs are added to the
            step's, e.g. `lambda grads: ciclo.logs().add_metric("g", ...)`.
        steps_per_call: fused execution: `ciclo.train_loop` groups this many
            consecutive batches into one compiled call of the train step
            (`jax.lax.scan`); `elapsed` still counts real steps and samples,
            stateful metrics and `avg_<loss>` accumulate per step. Schedules
            (epoch ends, bars) are checked at call boundaries. 1: no fusing.
        fused_logs: what a fused call logs: `"all"` (a history row per step)
            or `"mean"` (a row per call, losses and metrics averaged over its
            steps); see `managed.train_step`.

    Returns:
        A `FlaxState` placed for `strategy`.

    Raises:
        TypeError: for a module that is neither Linen nor NNX, a missing `tx`,
            a Linen-only option given with an NNX module, a non-bool
            `log_grad_norm`, or a `grads_fn` that is not a function of one or
            two positional parameters.

    Example:
        >>> import ciclo, jax.numpy as jnp, optax, flax.linen as nn
        >>> state = ciclo.create_flax_state(
        ...     nn.Dense(10), jnp.ones((1, 64)), optax.adam(1e-3),
        ...     losses={"loss": lambda preds, target: jnp.mean((preds - target) ** 2)})
        >>> state.strategy == "jit", state.params["kernel"].shape
        (True, (64, 10))
        >>> logs, state = state.train_step((jnp.ones((2, 64)), jnp.zeros((2, 10))))
        >>> sorted(logs.stateful_metrics)
        ['avg_loss']

        Fused, 8 steps per compiled call:

        >>> import numpy as np
        >>> state = ciclo.create_flax_state(
        ...     nn.Dense(10), jnp.ones((1, 64)), optax.adam(1e-3), steps_per_call=8,
        ...     losses={"loss": lambda preds, target: jnp.mean((preds - target) ** 2)})
        >>> data = [(np.ones((4, 64)), np.zeros((4, 10)))] * 20
        >>> state, history, elapsed = ciclo.train_loop(state, data)
        >>> int(state.step), elapsed.steps, elapsed.samples, len(history)
        (20, 20, 80, 20)

        An NNX module that sows a loss; with sample `inputs`, it gets `avg_aux`:

        >>> from flax import nnx
        >>> class Net(nnx.Module):
        ...     def __init__(self, rngs):
        ...         self.linear = nnx.Linear(64, 10, rngs=rngs)
        ...     def __call__(self, x):
        ...         y = self.linear(x)
        ...         self.sow("losses", "aux", 1e-3 * jnp.mean(y**2))
        ...         return y
        >>> state = ciclo.create_flax_state(Net(nnx.Rngs(0)), data[0][0], optax.sgd(0.1))
        >>> logs, state = state.train_step(data[0])
        >>> sorted(logs.losses), sorted(logs.stateful_metrics)
        (['aux'], ['avg_aux'])
    """

    from ciclo.managed._fused_steps import check_fused

    check_fused(steps_per_call, fused_logs, "create_flax_state")
    state = _create(
        module, inputs, tx, key, losses, metrics, strategy, method, train_kwargs,
        eval_kwargs, mutable_train, mutable_eval, rngs_train, rngs_eval,
        log_grad_norm, grads_fn,
    )  # fmt: skip
    if steps_per_call == 1 and fused_logs == "all":
        return state
    config = dataclasses.replace(
        state.config, steps_per_call=steps_per_call, fused_logs=fused_logs
    )
    return state.replace(config=config)


def _create(
    module, inputs, tx, key, losses, metrics, strategy, method, train_kwargs,
    eval_kwargs, mutable_train, mutable_eval, rngs_train, rngs_eval,
    log_grad_norm, grads_fn,
):  # fmt: skip
    from flax import linen, nnx

    if not isinstance(log_grad_norm, bool):
        raise TypeError(
            f"create_flax_state: log_grad_norm must be True or False, got "
            f"{short(log_grad_norm)}."
        )
    if grads_fn is not None:
        if not callable(grads_fn):
            raise TypeError(
                f"create_flax_state: grads_fn must be a function (grads[, state]) "
                f"-> logs_or_None, got {type(grads_fn).__name__}: {short(grads_fn)}."
            )
        arity(grads_fn, "create_flax_state(grads_fn=...)", most=2)

    linen_options = dict(
        mutable_train=mutable_train,
        mutable_eval=mutable_eval,
        rngs_train=rngs_train,
        rngs_eval=rngs_eval,
    )
    common = dict(
        key=key,
        losses=losses,
        metrics=metrics,
        strategy=strategy,
        method=method,
        train_kwargs=train_kwargs,
        eval_kwargs=eval_kwargs,
        log_grad_norm=log_grad_norm,
        grads_fn=grads_fn,
    )
    if isinstance(module, nnx.Module):
        from ciclo._flax.nnx import create_nnx_state

        given = [name for name, value in linen_options.items() if value is not None]
        if given:
            raise TypeError(
                f"{given} only apply to Linen modules; an NNX module updates all its "
                f"variables in train() mode and keeps its own nnx.Rngs."
            )
        if tx is None and isinstance(inputs, optax.GradientTransformation):
            inputs, tx = None, inputs
        return create_nnx_state(module, _require_tx(tx), inputs=inputs, **common)
    if isinstance(module, linen.Module):
        from ciclo._flax.linen import create_linen_state

        chosen = {k: v for k, v in linen_options.items() if v is not None}
        return create_linen_state(module, inputs, _require_tx(tx), **common, **chosen)
    raise TypeError(
        f"create_flax_state expects a flax.linen.Module or a flax.nnx.Module, got "
        f"{type(module).__name__}: {short(module)}."
    )


def _require_tx(tx: Any) -> optax.GradientTransformation:
    if tx is None:
        raise TypeError(
            "create_flax_state needs an optimizer: tx=optax.adam(1e-3) (any optax "
            "GradientTransformation)."
        )
    if not (
        callable(getattr(tx, "init", None)) and callable(getattr(tx, "update", None))
    ):
        hint = ""
        name = getattr(tx, "__name__", None)
        if callable(tx) and getattr(tx, "__module__", "").startswith("optax"):
            hint = f" (did you mean optax.{name}(learning_rate=...)?)"
        raise TypeError(
            f"create_flax_state: `tx` must be an optax GradientTransformation "
            f"(with `init` and `update`), e.g. optax.adam(1e-3); got {tx!r:.80} "
            f"({type(tx).__name__}){hint}."
        )
    return tx
