"""A managed state's compiled step called with its data fields as arguments.

jax flattens a compiled call's arguments and rebuilds its outputs in C++, but a
Flax dataclass node (`ManagedState`, `FlaxState`, a subclass of the user's)
costs it far more than the dicts and tuples inside it: rebuilding the output
state builds keyword arguments and calls the class, and flattening the input
walks its fields. Measured by hand on the digits MLP (valgrind, a CPU): the
managed step's call costs 350k instructions, the same step with the state's
`step`, `params` and `opt_state` passed as arguments 319k (the raw jitted step:
294k); flattening 37k against 19k, rebuilding 23k against 12k.

`Flat` compiles the same step that way for `jit`-like strategies (a plain
`jax.jit`): `(*data, batch, elapsed) -> (logs, *changed)`, `data` the state's
data fields (its pytree nodes, a `Layout`), each an argument (a tuple of them
as one argument costs jax's dispatch more: 375k instructions a step of
`ciclo.loop` against 369k). The loop's runner of a
managed step calls it when the state's class and its other fields (`apply_fn`,
`tx`, `param_specs`, `strategy`, a `FlaxState`'s `config`) are those it was
built for, and rebuilds the output state on the host from the input's fields.
A data field the step returns as it got it (the very object: a `FlaxState`'s
`key`, which each step folds `step` into without changing it) is not an output:
the host keeps the input's (a typed PRNG key is rebuilt in Python, ~6 µs a
step), unless the call donates its inputs. A step whose output state is not
such a state (another class, other static fields), or whose kept fields differ
between two traces, raises `NotFlat` while it is traced: the runner then calls
the state-in, state-out compiled step, as before.
"""

from __future__ import annotations

import dataclasses
import operator
import weakref
from collections.abc import Callable
from typing import Any

import jax

from ciclo.managed._state import DATA, ManagedState, flat_fields

__all__ = ["Flat", "Layout", "NotFlat", "layout_of"]

_new = object.__new__


class NotFlat(Exception):
    """Raised while tracing a flat step whose output state is not of the input's
    class with the input's static fields, or keeps other fields than its first
    trace did (it is then compiled state-in, state-out)."""


class Layout:
    """A state class's fields as a flat call takes them: `data`, the names of its
    pytree nodes (in their order), and `static`, the others but `strategy`
    (the flat calls are kept per strategy)."""

    __slots__ = ("cls", "data", "static")

    def __init__(self, cls: type, data: tuple[str, ...], static: tuple[str, ...]):
        self.cls, self.data, self.static = cls, data, static

    def static_of(self, fields: dict[str, Any]) -> tuple[Any, ...]:
        """The static fields' values in a state's `__dict__`."""
        return tuple(map(fields.__getitem__, self.static))


# a class -> its Layout, or None when its states are not rebuilt from fields
_LAYOUTS: weakref.WeakKeyDictionary[type, Layout | None] = weakref.WeakKeyDictionary()


def layout_of(cls: type) -> Layout | None:
    """The `Layout` of `cls`'s states, or None: a class that is not a
    `ManagedState` dataclass, has a `__post_init__` or `__slots__` (a state
    rebuilt from another's fields skips `__init__`), or `ManagedState` itself
    when this Flax's `TrainState` has other fields than ciclo knows."""
    try:
        return _LAYOUTS[cls]
    except KeyError:
        pass
    layout = None
    if (
        issubclass(cls, ManagedState)
        and (cls is not ManagedState or flat_fields())
        and dataclasses.is_dataclass(cls)
        and not hasattr(cls, "__post_init__")
        and all("__slots__" not in vars(c) for c in cls.__mro__[:-1])
    ):
        fields = dataclasses.fields(cls)
        data = tuple(f.name for f in fields if f.metadata.get("pytree_node", True))
        static = tuple(
            f.name for f in fields if f.name not in data and f.name != "strategy"
        )
        if set(DATA) <= set(data) and "strategy" not in data:
            layout = Layout(cls, data, static)
    _LAYOUTS[cls] = layout
    return layout


class Flat:
    """`step(state, batch, elapsed) -> (logs, state)` compiled as
    `call(*data, batch, elapsed) -> (logs, *changed)` for states of `state`'s
    class with `state`'s static fields and strategy (the caller checks them:
    `built_for`); `changed` are the values of the data fields named in
    `self.changed` (known once the call was traced: every data field when the
    call donates its inputs)."""

    __slots__ = ("built_for", "call", "changed", "cls", "layout")

    def __init__(
        self, step: Callable[..., Any], state: Any, layout: Layout, *, donate: bool
    ):
        cls, names = layout.cls, layout.data
        fields = state.__dict__
        self.cls, self.layout = cls, layout
        self.built_for = layout.static_of(fields)
        self.changed: tuple[str, ...] | None = None
        # the fields in their order, the data ones filled per call (not kept here)
        template = {k: (None if k in names else v) for k, v in fields.items()}
        static = [(k, fields[k]) for k in (*layout.static, "strategy")]

        def run(*args):
            *data, batch, elapsed = args
            inner = _new(cls)
            inner_fields = inner.__dict__
            inner_fields.update(template)
            inner_fields.update(zip(names, data))
            logs, out = step(inner, batch, elapsed)
            if type(out) is not cls or any(
                getattr(out, k, None) is not v for k, v in static
            ):
                raise NotFlat
            got = out.__dict__
            changed = (
                names
                if donate
                else tuple(k for k, v in zip(names, data) if got[k] is not v)
            )
            if self.changed is None:
                self.changed = changed
            elif changed != self.changed:  # this trace keeps other fields
                raise NotFlat
            return (logs, *(got[k] for k in changed))

        donated = tuple(range(len(names))) if donate else ()
        self.call = jax.jit(run, donate_argnums=donated)

    def takes(self, state: Any) -> bool:
        """Whether `state` is of the class and has the static fields this call
        was built for."""
        return type(state) is self.cls and all(
            map(operator.is_, self.built_for, self.layout.static_of(state.__dict__))
        )

    def data(self, fields: dict[str, Any]) -> map:
        """The data fields' values in a state's `__dict__`: `call(*data, ...)`."""
        return map(fields.__getitem__, self.layout.data)

    def rebuild(self, fields: dict[str, Any], result: tuple[Any, ...]) -> Any:
        """The state of a call's `result` (`(logs, *changed)`): `fields` (the
        input's, in their order) with the changed data fields, without
        `__init__` (the loop's runner writes this out)."""
        state = _new(self.cls)
        out = state.__dict__
        out.update(fields)
        out.update(zip(self.changed, result[1:]))
        return state
