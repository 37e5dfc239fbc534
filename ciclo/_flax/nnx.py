"""`FlaxState` for Flax NNX modules: `nnx.split` into a pytree, `nnx.merge` per step.

The state keeps the module's static `GraphDef` (in `state.config`) and its
variables as pytrees: `params` (`nnx.Param`), `batch_stats` (`nnx.BatchStat`) and
`collections` (everything else, RNG state included). Each step rebuilds a fresh
copy of the module with `nnx.merge`, switches it to `train()` or `eval()`, calls
it, and reads the updated variables back with `nnx.state`, so the state stays a
functional pytree that every strategy can place, replicate and compile.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import optax
from flax import nnx

from ciclo._flax.adapter import Forward, sown_names
from ciclo._flax.objectives import Objectives, reduce_sown
from ciclo._flax.options import as_key, mode_kwargs
from ciclo._flax.partitioning import nnx_annotations
from ciclo._flax.state import FlaxState, new_state
from ciclo._short import short
from ciclo._strategies.base import Strategy, tree_is_key

__all__ = ["LOSSES", "METRICS", "NNXModel", "create_nnx_state"]

# `self.sow("losses", name, value)` / `self.sow("metrics", name, value)` in a module
LOSSES = nnx.variable_type_from_name("losses", allow_register=True)
METRICS = nnx.variable_type_from_name("metrics", allow_register=True)
_OTHER = nnx.Not(nnx.Any(nnx.Param, nnx.BatchStat, LOSSES, METRICS))


def _fresh_rngs(tree: Any, key: jax.Array) -> Any:
    """Replaces every PRNG key leaf (the modules' RNG streams) by one from `key`."""
    leaves, treedef = jax.tree.flatten(tree)
    out, index = [], 0
    for leaf in leaves:
        if tree_is_key(leaf):
            new = jax.random.fold_in(key, index)
            out.append(new if leaf.shape == () else jax.random.split(new, leaf.shape))
            index += 1
        else:
            out.append(leaf)
    return jax.tree.unflatten(treedef, out)


def _sown(state: nnx.State, kind: str) -> dict[str, Any]:
    items = ((path[-1], var.get_value()) for path, var in nnx.to_flat_state(state))
    return reduce_sown(items, kind)


@dataclasses.dataclass(frozen=True, eq=False)
class NNXModel:
    """Runs an NNX module for a `FlaxState` (static; compared by identity).

    Attributes:
        graphdef: the module's static structure (from `nnx.split`).
        method: the name of the method called.
        train_kwargs / eval_kwargs: extra keyword arguments of the call.
    """

    graphdef: nnx.GraphDef
    method: str
    train_kwargs: Mapping[str, Any]
    eval_kwargs: Mapping[str, Any]

    def merge(self, state: FlaxState, collections: Any = None) -> nnx.Module:
        """A fresh module holding copies of the state's variables."""
        other = state.collections if collections is None else collections
        return nnx.merge(
            self.graphdef, state.params, state.batch_stats, other, copy=True
        )

    def apply(
        self, state: FlaxState, inputs: Any, *, training: bool, key: Any
    ) -> Forward:
        """Calls the module on `inputs` in `train()` or `eval()` mode."""
        collections = _fresh_rngs(state.collections, key) if training else None
        module = self.merge(state, collections)
        module.train() if training else module.eval()
        call = nnx.capture(getattr(module, self.method), LOSSES, METRICS)
        kwargs = self.train_kwargs if training else self.eval_kwargs
        preds, losses, metrics = call(inputs, **kwargs)
        return Forward(
            preds,
            nnx.state(module, nnx.BatchStat),
            nnx.state(module, _OTHER),
            _sown(losses, "losses"),
            _sown(metrics, "metrics"),
        )

    def bind(self, state: FlaxState) -> nnx.Module:
        """A fresh module with the state's values, in evaluation mode."""
        module = self.merge(state)
        module.eval()
        return module


def create_nnx_state(
    module: nnx.Module,
    tx: optax.GradientTransformation,
    *,
    inputs: Any = None,
    key: Any = None,
    losses: Mapping[str, Callable[..., Any]] | None = None,
    metrics: Mapping[str, Any] | None = None,
    strategy: str | Strategy = "jit",
    method: str = "__call__",
    train_kwargs: Mapping[str, Any] | None = None,
    eval_kwargs: Mapping[str, Any] | None = None,
    log_grad_norm: bool = False,
    grads_fn: Callable[..., Any] | None = None,
) -> FlaxState:
    """Splits an already-built NNX module into a `FlaxState`.

    Usually called through `ciclo.create_flax_state`, which documents the
    arguments. `module` is not changed: the state holds copies of its variables.
    With sample `inputs`, a train and an evaluation step on them are traced
    abstractly (`jax.eval_shape`, no FLOPs) to find the losses the module sows,
    which then get an `avg_<name>` running mean; without, only the configured
    losses get one.

    Returns:
        The `FlaxState`, placed for `strategy`.

    Raises:
        TypeError: if `module` is not an `nnx.Module` or `method` is not one of its
            methods.

    Example:
        >>> import optax
        >>> from flax import nnx
        >>> from ciclo._flax.nnx import create_nnx_state
        >>> state = create_nnx_state(nnx.Linear(3, 2, rngs=nnx.Rngs(0)), optax.sgd(0.1))
        >>> state.params["kernel"].shape
        (3, 2)
    """
    if not isinstance(module, nnx.Module):
        raise TypeError(
            f"create_nnx_state expects a flax.nnx.Module, got {type(module).__name__}."
        )
    fn = getattr(module, method, None) if isinstance(method, str) else None
    if not callable(fn):
        raise TypeError(
            f"`method` must name a method of {type(module).__name__}, got {short(method)}."
        )
    train_kw, eval_kw = mode_kwargs(fn, train_kwargs, eval_kwargs)
    graphdef, params, batch_stats, collections = nnx.split(
        nnx.clone(module), nnx.Param, nnx.BatchStat, _OTHER
    )
    model = NNXModel(graphdef, method, train_kw, eval_kw)
    key = as_key(key)
    sown_losses, sown_metrics = (), ()
    if inputs is not None:
        sown_losses, sown_metrics = sown_names(
            model,
            inputs,
            key,
            params=params,
            batch_stats=batch_stats,
            collections=collections,
            modes=(True, False),
        )
    objectives = Objectives(losses, metrics, sown_losses, sown_metrics)
    return new_state(
        model,
        objectives,
        log_grad_norm=log_grad_norm,
        grads_fn=grads_fn,
        apply_fn=model.merge,
        params=params,
        tx=tx,
        strategy=strategy,
        batch_stats=batch_stats,
        collections=collections,
        key=key,
        param_specs=nnx_annotations(params),
    )
