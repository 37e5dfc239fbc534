"""`Entries`, one collection of a `Logs` (`name -> value`, with attribute access),
and the dict pytree flattening that `Entries` and `Logs` share."""

from __future__ import annotations

from typing import Any

import jax

__all__ = ["Declared", "Entries", "flatten_dict", "flatten_dict_fast", "unflatten_dict"]


class Entries(dict):
    """One collection of a `Logs`: `name -> value`, with attribute access."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            return self[name]
        except KeyError:
            raise AttributeError(
                f"No entry {name!r} in this collection; entries: {sorted(self)}."
            ) from None


def flatten_dict(d: dict):
    keys = tuple(d.keys())
    return tuple((jax.tree_util.DictKey(k), d[k]) for k in keys), keys


def flatten_dict_fast(d: dict):
    keys = tuple(d.keys())
    return tuple(d[k] for k in keys), keys


class Declared(tuple):
    """A `Logs`'s static pytree data when it declares aggregation modes:
    `(keys, modes)` (`ciclo._logs`); otherwise its keys are a plain tuple."""

    __slots__ = ()


def unflatten_dict(cls):
    new, update = cls.__new__, dict.update

    def unflatten(keys, children):  # every jitted step's output: no __init__ call
        out = new(cls)
        if type(keys) is Declared:  # a Logs that declares modes
            keys, modes = keys
            out._aggregations = dict(modes)
        update(out, zip(keys, children))
        return out

    return unflatten


jax.tree_util.register_pytree_with_keys(
    Entries, flatten_dict, unflatten_dict(Entries), flatten_dict_fast
)
