"""Strategies: how a managed step runs (`eager`, `jit`, `data_parallel`, `sharded`).

Built-in names: `"eager"`, `"jit"`, `"jit_donate"`, `"data_parallel"`,
`"data_parallel_donate"` and `"sharded"` (`"-"` works as `"_"`);
`sharded(mesh, rules=..., fsdp=...)` builds mesh/rule/FSDP variants of `"sharded"`. Add your own with
`register_strategy(name, strategy)`. The protocol is documented in
`ciclo._strategies.base`.
"""

from ciclo._strategies.base import Collectives, Strategy, is_stateful_metric
from ciclo._strategies.data_parallel import DataParallel
from ciclo._strategies.eager import Eager
from ciclo._strategies.jit import Jit
from ciclo._strategies.mesh import sharded
from ciclo._strategies.registry import (
    get_strategy,
    register_strategy,
    registered_name,
    registered_strategies,
)
from ciclo._strategies.sharded import Sharded

__all__ = [
    "Collectives",
    "DataParallel",
    "Eager",
    "Jit",
    "Sharded",
    "Strategy",
    "get_strategy",
    "is_stateful_metric",
    "register_strategy",
    "registered_name",
    "registered_strategies",
    "sharded",
]

register_strategy("eager", Eager())
register_strategy("jit", Jit())
register_strategy("jit_donate", Jit("jit_donate", donate=True))
register_strategy("data_parallel", DataParallel())
register_strategy(
    "data_parallel_donate", DataParallel("data_parallel_donate", donate=True)
)
register_strategy("sharded", Sharded())
