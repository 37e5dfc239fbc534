"""Flax partitioning annotations as `(path, PartitionSpec)` pairs for `ciclo.sharded`.

Linen: `nn.with_partitioning(init, names)` boxes parameters in `nn.Partitioned`
(`nn.LogicallyPartitioned` names are mapped with its rules,
`nn.logical_to_mesh_axes`); NNX: a variable's `sharding` metadata (`out_sharding`
in Flax >= 0.12, `sharding_names` / `sharding` before). `create_flax_state` reads
them into `state.param_specs` and hands the user's functions unboxed arrays.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import PartitionSpec as P

from ciclo._strategies.rules import path_str

__all__ = ["linen_annotations", "nnx_annotations"]

_NNX_KEYS = ("out_sharding", "sharding_names", "sharding")


def linen_annotations(params: Any) -> tuple[Any, tuple[tuple[str, P], ...]]:
    """`(unboxed params, annotations)` of a Linen `params` collection.

    Example:
        >>> import jax, jax.numpy as jnp, flax.linen as nn
        >>> dense = nn.Dense(4, kernel_init=nn.with_partitioning(
        ...     nn.initializers.lecun_normal(), (None, "model")))
        >>> params = dense.init(jax.random.key(0), jnp.ones((1, 2)))["params"]
        >>> linen_annotations(params)[1]
        (('kernel', P(None, 'model')),)
    """
    from flax import linen as nn

    def boxed(x: Any) -> bool:
        return isinstance(x, nn.meta.AxisMetadata)

    out = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(params, is_leaf=boxed)[0]:
        if isinstance(leaf, nn.LogicallyPartitioned):
            spec = nn.logical_to_mesh_axes(leaf.names, leaf.rules)
        elif isinstance(leaf, nn.Partitioned):
            spec = P(*leaf.names)
        else:
            continue
        out.append((path_str(path), spec))
    return nn.meta.unbox(params), tuple(out)


def nnx_annotations(params: Any) -> tuple[tuple[str, P], ...]:
    """The annotations of an `nnx.State` of parameters (variables' metadata).

    Example:
        >>> from flax import nnx
        >>> with nnx.use_eager_sharding(False):
        ...     layer = nnx.Linear(2, 4, rngs=nnx.Rngs(0), kernel_init=nnx.with_partitioning(
        ...         nnx.initializers.lecun_normal(), (None, "model")))
        >>> nnx_annotations(nnx.state(layer, nnx.Param))
        (('kernel', P(None, 'model')),)
    """
    from flax import nnx

    out = []
    for path, var in nnx.to_flat_state(params):
        metadata = var.get_metadata() if hasattr(var, "get_metadata") else {}
        names = next((metadata[k] for k in _NNX_KEYS if metadata.get(k)), None)
        if names is None:
            continue
        spec = names if isinstance(names, P) else P(*names)
        out.append(("/".join(str(k) for k in path), spec))
    return tuple(out)
