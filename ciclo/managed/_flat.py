"""A `ManagedState`'s compiled step called with its data fields as arguments.

jax flattens a compiled call's arguments and rebuilds its outputs in C++, but a
Flax dataclass node (`ManagedState`) costs it far more than the dicts and tuples
inside it: rebuilding the output state builds keyword arguments and calls the
class, and flattening the input walks its seven fields. Measured by hand on the
digits MLP (valgrind, a CPU): the managed step's call costs 350k instructions,
the same step with the state's `step`, `params` and `opt_state` passed as three
arguments 319k (the raw jitted step: 294k); flattening 37k against 19k,
rebuilding 23k against 12k.

`flat_step` compiles the same step that way for `jit`-like strategies (a plain
`jax.jit`); the loop's runner of a managed step calls it when the state is a
`ManagedState` whose other fields (`apply_fn`, `tx`, `param_specs`, `strategy`)
are the objects it was built for, and rebuilds the output state on the host from
the input's fields. A step whose output state is not such a state (another
class, other static fields) raises `NotFlat` while it is traced: the runner
then calls the state-in, state-out compiled step, as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from ciclo.managed._state import DATA, ManagedState, flat_fields

__all__ = ["NotFlat", "flat_step", "rebuild"]

_new = object.__new__


class NotFlat(Exception):
    """Raised while tracing a flat step whose output state is not a `ManagedState`
    with the input's static fields (it is then compiled state-in, state-out)."""


def flat_step(
    step: Callable[..., Any], state: ManagedState, *, donate: bool
) -> Callable[..., Any] | None:
    """`step(state, batch, elapsed) -> (logs, state)` compiled as
    `(step, params, opt_state, batch, elapsed) -> (logs, step, params, opt_state)`
    for states with `state`'s static fields (the caller checks them); None when
    `state`'s class has other fields than a `ManagedState` of this Flax."""
    if type(state) is not ManagedState or not flat_fields():
        return None
    # the fields in their order, the data ones filled per call (not kept here)
    template = {k: (None if k in DATA else v) for k, v in state.__dict__.items()}
    static = [(k, v) for k, v in template.items() if k not in DATA]

    def run(step_, params, opt_state, batch, elapsed):
        logs, out = step(rebuild(template, step_, params, opt_state), batch, elapsed)
        if type(out) is not ManagedState or any(
            getattr(out, k, None) is not v for k, v in static
        ):
            raise NotFlat
        return logs, out.step, out.params, out.opt_state

    return jax.jit(run, donate_argnums=(0, 1, 2) if donate else ())


def rebuild(fields: dict[str, Any], step: Any, params: Any, opt_state: Any) -> Any:
    """A `ManagedState` with `fields` (another state's, in their order) and these
    data fields, without `__init__` (the loop's runner writes this out)."""
    state = _new(ManagedState)
    out = state.__dict__
    out.update(fields)
    out["step"], out["params"], out["opt_state"] = step, params, opt_state
    return state
