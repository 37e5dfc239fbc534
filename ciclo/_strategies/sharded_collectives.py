"""`ShardedCollectives`: the `sharded` strategy's collectives, inside its one
`jax.jit` program. Nothing to combine across devices (XLA inserts the reductions);
values are only laid out on the strategy's mesh."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from ciclo._strategies.base import Collectives

if TYPE_CHECKING:
    from ciclo._strategies.sharded import Sharded

__all__ = ["ShardedCollectives"]


class ShardedCollectives(Collectives):
    """One program over the global batch: nothing to combine, only to lay out.

    `mean` and `merge` keep values replicated over the mesh (readable by every
    process); `concat` keeps per-sample values sharded on the batch axis, so each
    process gets back the rows of its local batch; `mean_grads` keeps the
    gradients in their parameters' sharding (no gather of a sharded model).
    """

    def __init__(self, strategy: Sharded):
        self._strategy = strategy

    def _constrain(self, tree: Any, spec: P) -> Any:
        sharding = NamedSharding(self._strategy.mesh, spec)
        return jax.tree.map(
            lambda x: jax.lax.with_sharding_constraint(x, sharding), tree
        )

    def mean(self, tree: Any) -> Any:
        return self._constrain(tree, P())

    def mean_grads(self, grads: Any, state: Any) -> Any:
        """The gradients laid out as `state.params` (replicated by default)."""
        shardings = self._strategy.shardings(state)
        params = getattr(shardings, "params", None)
        if params is None or jax.tree.structure(params) != jax.tree.structure(grads):
            return self.mean(grads)
        return jax.lax.with_sharding_constraint(grads, params)

    def merge(self, metric: Any) -> Any:
        return self._constrain(metric, P())

    def concat(self, tree: Any) -> Any:
        strategy = self._strategy
        n = strategy.mesh.shape[strategy.data_axis]

        def shard(x: Any) -> Any:
            shape = np.shape(x)
            spec = P(strategy.data_axis) if shape and shape[0] % n == 0 else P()
            return jax.lax.with_sharding_constraint(
                x, NamedSharding(strategy.mesh, spec)
            )

        return jax.tree.map(shard, tree)
