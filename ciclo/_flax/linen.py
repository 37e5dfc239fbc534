"""`FlaxState` for Flax Linen modules: initialisation and the model adapter."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import optax
from flax import linen as nn
from flax import traverse_util

from ciclo._flax.adapter import Forward, sown_names
from ciclo._flax.objectives import Objectives, reduce_sown
from ciclo._flax.options import as_key, mode_kwargs
from ciclo._flax.partitioning import linen_annotations
from ciclo._flax.state import FlaxState, new_state
from ciclo._strategies.base import Strategy

__all__ = ["LinenModel", "create_linen_state"]

SOWN = ("losses", "metrics")
_NOT_PERSISTED = frozenset({"params", "batch_stats", "intermediates", *SOWN})


@dataclasses.dataclass(frozen=True, eq=False)
class LinenModel:
    """Runs a Linen module for a `FlaxState` (static; compared by identity).

    Attributes:
        module: the Linen module.
        method: the method called (name or function), as in `module.apply`.
        train_kwargs / eval_kwargs: extra keyword arguments of the call.
        mutable_train / mutable_eval: the collections updated by the call.
        rngs_train / rngs_eval: the RNG streams given to the call.
    """

    module: nn.Module
    method: str | Callable[..., Any]
    train_kwargs: Mapping[str, Any]
    eval_kwargs: Mapping[str, Any]
    mutable_train: tuple[str, ...]
    mutable_eval: tuple[str, ...]
    rngs_train: tuple[str, ...]
    rngs_eval: tuple[str, ...]

    def variables(self, state: FlaxState) -> dict[str, Any]:
        """The Linen variables of `state` (for `module.apply`)."""
        variables = {"params": state.params, **state.collections}
        if state.batch_stats:
            variables["batch_stats"] = state.batch_stats
        return variables

    def apply(
        self, state: FlaxState, inputs: Any, *, training: bool, key: Any
    ) -> Forward:
        """Calls the module on `inputs` in training or evaluation mode."""
        mutable = self.mutable_train if training else self.mutable_eval
        names = self.rngs_train if training else self.rngs_eval
        rngs = dict(zip(names, jax.random.split(key, len(names)))) if names else None
        preds, mutated = self.module.apply(
            self.variables(state),
            inputs,
            rngs=rngs,
            mutable=[*mutable, *SOWN],
            method=self.method,
            **(self.train_kwargs if training else self.eval_kwargs),
        )
        collections = dict(state.collections)
        collections.update({c: mutated[c] for c in collections if c in mutated})
        sown = [
            reduce_sown(
                ((path[-1], v) for path, v in _flat(mutated.get(c, {})).items()), c
            )
            for c in SOWN
        ]
        return Forward(
            preds, mutated.get("batch_stats", state.batch_stats), collections, *sown
        )

    def bind(self, state: FlaxState) -> nn.Module:
        """The module bound to the state's variables."""
        return self.module.bind(self.variables(state))


def _flat(tree: Any) -> dict[tuple[str, ...], Any]:
    return traverse_util.flatten_dict(tree) if tree else {}


def _names(value: Any, argument: str) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise TypeError(
            f"`{argument}` must be a list of names, got {type(value).__name__}: "
            f"{value!r}. Example: {argument}=['batch_stats']."
        )
    return tuple(value)


def _mutable(value: bool | Sequence[str], persisted: Sequence[str], argument: str):
    if value is True:
        return tuple(persisted)
    if value is False or value is None:
        return ()
    names = _names(value, argument)
    unknown = sorted(set(names) - set(persisted) - set(SOWN))
    if unknown:
        raise ValueError(
            f"`{argument}` names {unknown}, but the module's variables have only "
            f"the collections {sorted(persisted)} besides 'params'."
        )
    return names


def create_linen_state(
    module: nn.Module,
    inputs: Any,
    tx: optax.GradientTransformation,
    *,
    key: Any = None,
    losses: Mapping[str, Callable[..., Any]] | None = None,
    metrics: Mapping[str, Any] | None = None,
    strategy: str | Strategy = "jit",
    method: str | Callable[..., Any] = "__call__",
    train_kwargs: Mapping[str, Any] | None = None,
    eval_kwargs: Mapping[str, Any] | None = None,
    log_grad_norm: bool = False,
    grads_fn: Callable[..., Any] | None = None,
    mutable_train: bool | Sequence[str] = True,
    mutable_eval: bool | Sequence[str] = False,
    rngs_train: Sequence[str] = ("dropout",),
    rngs_eval: Sequence[str] = (),
) -> FlaxState:
    """Initialises a Linen module and returns its `FlaxState`.

    Usually called through `ciclo.create_flax_state`, which documents the
    arguments. The module is initialised with `module.init` on `inputs`, in
    evaluation mode (`eval_kwargs`), with RNG streams `params` and `rngs_train`.
    The losses it sows there or in a train step on `inputs` (traced abstractly,
    `jax.eval_shape`) get an `avg_<name>` running mean.

    Returns:
        The `FlaxState`, placed for `strategy`.

    Raises:
        TypeError: if `module` is not a Linen module or an option has a wrong type.
        ValueError: if a mutable collection is unknown.

    Example:
        >>> import jax.numpy as jnp, optax, flax.linen as nn
        >>> from ciclo._flax.linen import create_linen_state
        >>> state = create_linen_state(nn.Dense(2), jnp.ones((1, 3)), optax.sgd(0.1))
        >>> state.params["kernel"].shape
        (3, 2)
    """
    if not isinstance(module, nn.Module):
        raise TypeError(
            f"create_linen_state expects a flax.linen.Module, got "
            f"{type(module).__name__}."
        )
    if inputs is None:
        raise TypeError(
            "A Linen module needs sample `inputs` to be initialised, e.g. "
            "create_flax_state(module, jnp.ones((1, 28, 28, 1)), tx)."
        )
    fn = getattr(module, method) if isinstance(method, str) else method
    train_kw, eval_kw = mode_kwargs(fn, train_kwargs, eval_kwargs)
    rngs_train = _names(rngs_train, "rngs_train")
    rngs_eval = _names(rngs_eval, "rngs_eval")
    init_key, state_key = jax.random.split(as_key(key))
    streams = tuple(dict.fromkeys(("params", *rngs_train, *rngs_eval)))
    init_rngs = dict(zip(streams, jax.random.split(init_key, len(streams))))
    init = jax.jit(functools.partial(module.init, method=method, **eval_kw))
    variables = dict(init(init_rngs, inputs))
    init_sown = [tuple(path[-1] for path in _flat(variables.get(c, {}))) for c in SOWN]
    params, param_specs = linen_annotations(variables.pop("params", {}))
    variables = nn.meta.unbox(variables)
    batch_stats = variables.pop("batch_stats", {})
    collections = {c: v for c, v in variables.items() if c not in _NOT_PERSISTED}
    persisted = (["batch_stats"] if batch_stats else []) + list(collections)
    model = LinenModel(
        module=module,
        method=method,
        train_kwargs=train_kw,
        eval_kwargs=eval_kw,
        mutable_train=_mutable(mutable_train, persisted, "mutable_train"),
        mutable_eval=_mutable(mutable_eval, persisted, "mutable_eval"),
        rngs_train=rngs_train,
        rngs_eval=rngs_eval,
    )
    # what a train step sows too (e.g. only under `if train:`), traced abstractly
    train_sown = sown_names(
        model,
        inputs,
        state_key,
        params=params,
        batch_stats=batch_stats,
        collections=collections,
    )
    sown_losses, sown_metrics = (
        tuple(dict.fromkeys(a + b)) for a, b in zip(init_sown, train_sown, strict=True)
    )
    objectives = Objectives(losses, metrics, sown_losses, sown_metrics)
    return new_state(
        model,
        objectives,
        log_grad_norm=log_grad_norm,
        grads_fn=grads_fn,
        apply_fn=module.apply,
        params=params,
        tx=tx,
        strategy=strategy,
        batch_stats=batch_stats,
        collections=collections,
        key=state_key,
        param_specs=param_specs,
    )
