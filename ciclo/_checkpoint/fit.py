"""Whether a target state fits a saved checkpoint, said in one line when not.

Before a restore reads the arrays, the target's host layout is compared with the
state's metadata saved at that step: the paths of the leaves (dict keys,
attributes, indices), their shapes and their dtypes: a dtype into which the
saved values would not cast without loss (a saved float32 into an int32 target,
which orbax would cast silently) is an error too; a widening one is read. A difference becomes one `ValueError`
naming the differing paths (orbax's own error is many lines). Typed PRNG keys are
saved as their key data (another shape) and are not compared by shape.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

__all__ = ["check_fits"]


def _key(entry: Any) -> str:
    """A key path entry as a name: dict key, attribute, or index."""
    for attribute in ("key", "name", "idx"):
        if hasattr(entry, attribute):
            return str(getattr(entry, attribute))
    return str(entry)


def _paths(tree: Any) -> dict[str, Any]:
    """`{'a/b': leaf}` over the leaves of `tree` ('' for a bare leaf)."""
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {"/".join(_key(k) for k in path): leaf for path, leaf in leaves}


def _names(paths: list[str], limit: int = 5) -> str:
    more = f" and {len(paths) - limit} more" if len(paths) > limit else ""
    return f"{[p or '(the root)' for p in paths[:limit]]}{more}"


def check_fits(
    mngr: ocp.CheckpointManager,
    step: int,
    target_state: Any,
    target: Any,
    wrapped: bool,
) -> None:
    """Raises a one-line ValueError when the state saved at `step` does not have
    the structure, shapes or dtypes of `target` (the target's host layout)."""
    mismatch = _mismatch(epath.Path(mngr.directory) / str(step), target, wrapped)
    if mismatch is None:
        return
    raise ValueError(
        f"ciclo.restore: the checkpoint at step {step} in {mngr.directory} does not "
        f"fit `target_state` ({type(target_state).__name__}): {mismatch}. Pass a "
        f"target_state built like the saved state (same model, optimizer and "
        f"fields), or target_state=None to get the saved pytree as it is."
    ) from None


def _mismatch(folder: epath.Path, target: Any, wrapped: bool) -> str | None:
    """How the state saved in `folder` differs from `target` (one line), or None
    when no difference in structure, shape or dtype is found."""
    handler = ocp.StandardCheckpointHandler()
    try:
        saved = handler.metadata(folder / "state")
    except Exception:  # no readable metadata: leave it to orbax
        return None
    finally:
        handler.close()
    saved = getattr(saved, "tree", saved)
    if wrapped and isinstance(saved, list | tuple) and len(saved) == 1:
        saved = saved[0]
    saved_paths, target_paths = _paths(saved), _paths(target)
    missing = [p for p in target_paths if p not in saved_paths]
    extra = [p for p in saved_paths if p not in target_paths]
    if missing or extra:
        parts = []
        if missing:
            parts.append(
                f"in `target_state` but not in the checkpoint: {_names(missing)}"
            )
        if extra:
            parts.append(f"only in the checkpoint: {_names(extra)}")
        return "the structure differs; " + "; ".join(parts)
    shapes, dtypes = [], []
    for name, leaf in target_paths.items():
        dtype = getattr(leaf, "dtype", None)
        if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.extended):
            continue  # a typed PRNG key is saved as its key data (another shape)
        shown = repr(name or "(the root)")
        want = tuple(getattr(leaf, "shape", np.shape(leaf)))
        have = getattr(saved_paths[name], "shape", None)
        if have is not None and tuple(have) != want:
            shapes.append(f"{shown}: saved {tuple(have)}, target {want}")
        had = getattr(saved_paths[name], "dtype", None)
        if dtype is not None and had is not None and _lossy(had, dtype):
            dtypes.append(f"{shown}: saved {np.dtype(had)}, target {np.dtype(dtype)}")
    if shapes:
        return f"the shape differs at {_first(shapes)}"
    if dtypes:  # orbax would cast silently (a float32 1.5 into int32 reads 1)
        return (
            f"the dtype differs at {_first(dtypes)} (restoring would cast the "
            f"saved values with loss); build those leaves with the saved dtype"
        )
    return None


def _lossy(saved: Any, target: Any) -> bool:
    """Whether reading `saved` values into `target`'s dtype may change them (a
    float into an int, float32 into bfloat16, int32 into float32); a widening
    cast (float32 into float64) is not."""
    try:
        return not np.can_cast(np.dtype(saved), np.dtype(target), casting="safe")
    except TypeError:  # a dtype numpy cannot compare: only an equal one is safe
        return np.dtype(saved) != np.dtype(target)


def _first(differences: list[str], limit: int = 3) -> str:
    more = f" and {len(differences) - limit} more" if len(differences) > limit else ""
    return f"{'; '.join(differences[:limit])}{more}"
