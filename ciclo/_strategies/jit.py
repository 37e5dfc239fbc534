"""The `jit` and `jit_donate` strategies: `jax.jit` on the default device."""

from __future__ import annotations

from typing import Any

import jax

from ciclo._strategies.base import Step, Strategy

__all__ = ["Jit"]


class Jit(Strategy):
    """Compiles the step with `jax.jit`; `donate=True` donates the state's buffers.

    With donation the state passed in to a training step is consumed: keep only
    the returned one. `place_state` (`ManagedState.create`, `with_strategy`) copies
    the arrays it is given, so the caller's arrays are never donated.

    Example:
        >>> import ciclo
        >>> ciclo.get_strategy("jit_donate").donate
        True
    """

    def __init__(self, name: str = "jit", *, donate: bool = False):
        super().__init__(name, donate=donate)

    def place_state(self, state: Any) -> Any:
        # committed device arrays (not Python/numpy leaves), so that donation works
        # and the first step is traced with the same types as the following ones;
        # a donating strategy copies: the caller's arrays must not be consumed, and
        # a buffer shared by two leaves can't be donated twice
        return jax.device_put(state, may_alias=False if self.donate else None)

    def wrap(self, fn: Step, *, donate: bool = False) -> Step:
        return jax.jit(fn, donate_argnums=(0,) if donate else ())
