"""Options shared by the Linen and NNX factories: the key and the training flag."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["TRAINING_FLAGS", "as_key", "mode_kwargs"]

# parameter name -> value it gets in (train, eval)
TRAINING_FLAGS = {
    "training": (True, False),
    "train": (True, False),
    "deterministic": (False, True),
}


def as_key(key: Any) -> jax.Array:
    """A typed `jax.random.key` from None (seed 0), an int seed or a key.

    Raises:
        TypeError: for anything else.

    Example:
        >>> from ciclo._flax.options import as_key
        >>> as_key(3).shape
        ()
    """
    if key is None:
        return jax.random.key(0)
    if isinstance(key, int) and not isinstance(key, bool):
        return jax.random.key(key)
    dtype = getattr(key, "dtype", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return key
    if dtype == jnp.uint32 and getattr(key, "shape", None) == (2,):
        return jax.random.wrap_key_data(key)
    raise TypeError(
        f"`key` must be None, an int seed or a jax.random.key(...), got "
        f"{type(key).__name__}: {key!r}."
    )


def _flag_parameters(fn: Callable[..., Any]) -> list[str]:
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return []
    return [name for name in TRAINING_FLAGS if name in parameters]


def mode_kwargs(
    fn: Callable[..., Any],
    train_kwargs: Mapping[str, Any] | None,
    eval_kwargs: Mapping[str, Any] | None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Keyword arguments for the model call in training and in evaluation.

    When not given, they are derived from `fn`'s signature (as Keras does): a
    parameter named `training` or `train` gets True in training and False in
    evaluation; one named `deterministic` gets the opposite.

    Args:
        fn: the model method that will be called.
        train_kwargs: explicit keyword arguments for training, or None.
        eval_kwargs: explicit keyword arguments for evaluation, or None.

    Returns:
        `(train_kwargs, eval_kwargs)` as dicts.

    Example:
        >>> from ciclo._flax.options import mode_kwargs
        >>> mode_kwargs(lambda x, training=False: x, None, None)
        ({'training': True}, {'training': False})
    """
    flags = _flag_parameters(fn)
    derived = (
        {name: TRAINING_FLAGS[name][0] for name in flags},
        {name: TRAINING_FLAGS[name][1] for name in flags},
    )
    for argument, given in (
        ("train_kwargs", train_kwargs),
        ("eval_kwargs", eval_kwargs),
    ):
        if given is not None and not isinstance(given, Mapping):
            raise TypeError(
                f"`{argument}` must be a dict of keyword arguments for the model "
                f"call, got {type(given).__name__}: {given!r}."
            )
    return (
        dict(derived[0] if train_kwargs is None else train_kwargs),
        dict(derived[1] if eval_kwargs is None else eval_kwargs),
    )
