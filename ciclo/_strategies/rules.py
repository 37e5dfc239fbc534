"""Where each leaf of a state lives on a mesh: rules, annotations, FSDP.

`state_specs(state, ...)` gives a `PartitionSpec` for every leaf of a managed state:

- a parameter: the first `(regex, spec)` rule whose regex `re.search`es its path
  (keys joined by `/`, e.g. `"Dense_0/kernel"`), else its annotation (Flax
  `nn.with_partitioning` / NNX `sharding` metadata, carried by the state's static
  `param_specs`; axis names the mesh lacks are dropped), else with `fsdp` its largest axis divisible by the data-axis size
  (leaves under `FSDP_MIN_SIZE` elements stay replicated), else replicated;
- an optimizer-state leaf whose path ends with a parameter's path and has its
  shape (Adam's `mu`/`nu`, momentum traces, ...): that parameter's spec;
- anything else (step, `batch_stats`, keys, metrics): replicated.

Every spec is checked against the mesh: unknown axis names, more axes than the
leaf has, or a dimension the mesh axes do not divide are `ValueError`s naming the
parameter, its shape, the spec and the mesh.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

__all__ = [
    "FSDP_MIN_SIZE",
    "check_rules",
    "check_spec",
    "path_str",
    "state_specs",
]

# parameters with fewer elements than this stay replicated under fsdp=True
FSDP_MIN_SIZE = 1024

Rules = tuple[tuple[re.Pattern[str], P], ...]


def _entry(key: Any) -> str | None:
    for attribute in ("key", "name", "idx"):
        if hasattr(key, attribute):
            return str(getattr(key, attribute))
    return str(key)


def path_str(path: Sequence[Any]) -> str:
    """A key path as `"a/b/c"` (a trailing NNX `.value` attribute is dropped).

    Example:
        >>> import jax
        >>> path, _ = jax.tree_util.tree_flatten_with_path({"Dense_0": {"kernel": 1}})
        >>> path_str(path[0][0])
        'Dense_0/kernel'
    """
    keys = list(path)
    if (
        keys
        and isinstance(keys[-1], jax.tree_util.GetAttrKey)
        and keys[-1].name
        in (
            "value",
            "raw_value",
        )
    ):
        keys = keys[:-1]
    return "/".join(_entry(k) for k in keys)


def _describe(mesh: Mesh) -> str:
    return "Mesh(" + ", ".join(f"{a!r}: {n}" for a, n in mesh.shape.items()) + ")"


def check_rules(rules: Any, mesh: Mesh | None) -> Rules:
    """`rules` as compiled `(pattern, PartitionSpec)` pairs; TypeError/ValueError
    for anything else, or for an axis name not in `mesh` (when given)."""
    if rules is None:
        return ()
    if isinstance(rules, dict):
        rules = list(rules.items())
    if not isinstance(rules, list | tuple):
        raise TypeError(
            f"ciclo.sharded: rules must be a list of (regex, PartitionSpec) pairs, "
            f"e.g. [('Dense_0/kernel', P(None, 'model'))], got "
            f"{type(rules).__name__}: {rules!r:.80}."
        )
    out = []
    for rule in rules:
        if not (isinstance(rule, tuple | list) and len(rule) == 2):
            raise TypeError(
                f"ciclo.sharded: each rule is a (regex, PartitionSpec) pair, got "
                f"{rule!r:.80}."
            )
        pattern, spec = rule
        if isinstance(spec, tuple | list) and not isinstance(spec, P):
            spec = P(*spec)
        if not isinstance(spec, P):
            raise TypeError(
                f"ciclo.sharded: the rule {pattern!r} gives {spec!r:.60} "
                f"({type(spec).__name__}); expected a jax.sharding.PartitionSpec, "
                f"e.g. P(None, 'model')."
            )
        try:
            compiled = re.compile(pattern)
        except (re.error, TypeError) as error:
            raise ValueError(
                f"ciclo.sharded: the rule pattern {pattern!r} is not a regular "
                f"expression ({error})."
            ) from None
        if mesh is not None:
            _check_axes(spec, mesh, f"rule {pattern!r}")
        out.append((compiled, spec))
    return tuple(out)


def _axes(entry: Any) -> tuple[str, ...]:
    if entry is None:
        return ()
    if isinstance(entry, tuple | list):
        return tuple(entry)
    return (entry,)


def _check_axes(spec: P, mesh: Mesh, where: str) -> None:
    for entry in spec:
        for axis in _axes(entry):
            if axis not in mesh.shape:
                raise ValueError(
                    f"ciclo.sharded: {where} uses the mesh axis {axis!r} (spec "
                    f"{spec}), but the mesh is {_describe(mesh)}; use one of "
                    f"{list(mesh.axis_names)} or None."
                )


def check_spec(path: str, shape: tuple[int, ...], spec: P, mesh: Mesh, why: str) -> P:
    """`spec` if it fits a leaf of `shape` on `mesh`, else a ValueError naming
    the parameter (`path`), its shape, the spec, where it came from and the mesh."""
    _check_axes(spec, mesh, f"the {why} for {path!r}")
    if len(spec) > len(shape):
        raise ValueError(
            f"ciclo.sharded: the {why} gives {path!r} (shape {shape}) the spec "
            f"{spec} with {len(spec)} entries, more than its {len(shape)} axes "
            f"(mesh {_describe(mesh)})."
        )
    for dim, (size, entry) in enumerate(zip(shape, spec, strict=False)):
        parts = math.prod(mesh.shape[a] for a in _axes(entry))
        if size % parts:
            raise ValueError(
                f"ciclo.sharded: the {why} shards axis {dim} of {path!r} (shape "
                f"{shape}) with spec {spec} into {parts} parts on mesh "
                f"{_describe(mesh)}, but {size} is not divisible by {parts}; change "
                f"the spec (e.g. None for that axis) or the layer's size."
            )
    return spec


def _on_mesh(spec: P, mesh: Mesh) -> P:
    """An annotation with the axis names `mesh` lacks dropped (the model's code
    names its axes once; on a mesh without `"model"` that dimension is whole)."""

    def keep(entry: Any) -> Any:
        axes = tuple(a for a in _axes(entry) if a in mesh.shape)
        if not axes:
            return None
        return axes[0] if len(axes) == 1 and not isinstance(entry, tuple) else axes

    return P(*(keep(e) for e in spec))


def _fsdp(shape: tuple[int, ...], axis: str, n: int, min_size: int) -> P:
    """The largest axis of `shape` divisible by `n`, sharded on `axis`."""
    if n <= 1 or math.prod(shape) < min_size:
        return P()
    best = None
    for dim, size in enumerate(shape):
        if size % n == 0 and (best is None or size > shape[best]):
            best = dim
    if best is None:
        return P()
    return P(*([None] * best), axis)


def param_specs(
    params: Any,
    *,
    mesh: Mesh,
    data_axis: str,
    rules: Rules,
    annotations: dict[str, P],
    fsdp: bool,
    fsdp_min_size: int = FSDP_MIN_SIZE,
    used: set[int] | None = None,
) -> Any:
    """A PartitionSpec for every leaf of `params` (see the module docstring);
    `used` collects the indices of the rules that matched something."""
    n = mesh.shape.get(data_axis, 1)

    def spec(path: Any, leaf: Any) -> P:
        name = path_str(path)
        shape = tuple(np.shape(leaf))
        for index, (pattern, rule) in enumerate(rules):
            if pattern.search(name):
                if used is not None:
                    used.add(index)
                return check_spec(name, shape, rule, mesh, f"rule {pattern.pattern!r}")
        if name in annotations:
            spec = _on_mesh(annotations[name], mesh)
            return check_spec(name, shape, spec, mesh, "annotation")
        if fsdp:
            return _fsdp(shape, data_axis, n, fsdp_min_size)
        return P()

    return jax.tree_util.tree_map_with_path(spec, params)


def _factored(shape: tuple[int, ...], param: tuple[int, ...], spec: P) -> P | None:
    """The spec of a factored statistic of a parameter (Adafactor's row / column
    second moments): `shape` is the parameter's with one axis removed, and gets the
    parameter's spec without that axis. None if no axis, or several with different
    specs, fit."""
    if len(shape) != len(param) - 1:
        return None
    entries = list(spec) + [None] * (len(param) - len(spec))
    found = {
        tuple(entries[:axis] + entries[axis + 1 :])
        for axis in range(len(param))
        if param[:axis] + param[axis + 1 :] == shape
    }
    return P(*found.pop()) if len(found) == 1 else None


def _follow(opt_state: Any, params: Any, specs: Any) -> Any:
    """Specs for the optimizer state: a leaf whose key path ends with a parameter's
    path gets that parameter's spec if it has its shape (Adam's moments, momentum),
    or the spec without the removed axis if it has its shape less one axis
    (Adafactor's factored moments); the rest is replicated."""
    by_path: dict[tuple[Any, ...], tuple[tuple[int, ...], P]] = {}
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    spec_leaves = jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, P))
    for (path, leaf), spec in zip(leaves, spec_leaves, strict=True):
        by_path[tuple(path)] = (tuple(np.shape(leaf)), spec)

    def follow(path: Any, leaf: Any) -> P:
        path = tuple(path)
        shape = tuple(np.shape(leaf))
        for start in range(len(path) + 1):
            found = by_path.get(path[start:])
            if found is None:
                continue
            if found[0] == shape:
                return found[1]
            factored = _factored(shape, *found)
            if factored is not None:
                return factored
        return P()

    return jax.tree_util.tree_map_with_path(follow, opt_state)


def state_specs(
    state: Any,
    *,
    mesh: Mesh,
    data_axis: str,
    rules: Rules,
    fsdp: bool,
    fsdp_min_size: int = FSDP_MIN_SIZE,
) -> Any:
    """A PartitionSpec per leaf of `state` (a tree of the same structure).

    A state with `params` and `opt_state` (a managed / Flax state) gets the
    parameter placement; anything else is replicated.

    Raises:
        ValueError: a spec that does not fit its parameter or the mesh, or a rule
            that matches no parameter.
    """
    replicated = jax.tree.map(lambda _: P(), state)
    if not (hasattr(state, "params") and hasattr(state, "opt_state")):
        return replicated
    annotations = dict(getattr(state, "param_specs", None) or ())
    used: set[int] = set()
    specs = param_specs(
        state.params,
        mesh=mesh,
        data_axis=data_axis,
        rules=rules,
        annotations=annotations,
        fsdp=fsdp,
        fsdp_min_size=fsdp_min_size,
        used=used,
    )
    unused = [p.pattern for i, (p, _) in enumerate(rules) if i not in used]
    if unused:
        paths = [
            path_str(p)
            for p, _ in jax.tree_util.tree_flatten_with_path(state.params)[0]
        ]
        raise ValueError(
            f"ciclo.sharded: the rule(s) {unused} match no parameter; the "
            f"parameters are {paths[:12]}{' ...' if len(paths) > 12 else ''} "
            f"(paths are keys joined by '/', matched with re.search). Fix or drop "
            f"the rule."
        )
    opt = _follow(state.opt_state, state.params, specs)
    return replicated.replace(params=specs, opt_state=opt)
