"""The orbax side of `ciclo.checkpoint`: the on-disk layout and restoring from it.

A checkpoint is an orbax `CheckpointManager` step directory named by the number of
batches trained into the state, with three items: `state` (the pytree,
`StandardSave`; a bare array is wrapped in a one-element list), `elapsed` (JSON) and
`history` (JSON: the run's `History` up to the save, numeric columns as base64 of
their raw bytes so values come back bit for bit; checkpoints written before ciclo
saved it have no `history` item and restore an empty one). Orbax writes a step into a
temporary directory and renames it when complete, so a step killed mid-write is
never listed, and the next run's manager removes its leftovers. A step folder without
the `elapsed` item was not written by ciclo: a directory holding one is refused
(`check_layout`) before anything is read from it or deleted in it. Checkpoints
saved with a monitor carry orbax metrics `{"score", "value", "monitor", "mode"}`,
`score` oriented so that higher is better; an unranked one (the monitored entry was
not logged at that save) carries `{"monitor", "mode"}` without a score, so orbax
gets metrics for every save (no "did not provide metrics" warning) and ranks it
nowhere. `BestRanked` keeps the best scored ones, the earliest of equal scores.

A managed state (one whose `strategy` attribute names a registered strategy, such
as `ManagedState` / `FlaxState`) is saved in its single-device host layout
(`strategy.to_host`) and restored into the host layout of the target, then placed
with the target's strategy (`place_state`): a checkpoint moves freely between
strategies and device counts (e.g. saved under `data_parallel` on 8 devices,
restored under `jit` on one). A strategy with a `checkpoint_layout(state)` method
saves that layout instead: `ciclo.sharded` keeps a sharded state's arrays as they
are, so orbax writes each process's shards (no host gathers the model) and restores
them straight into the shardings of the target (another mesh or device count).
"""

from __future__ import annotations

import array
import base64
import contextlib
import dataclasses
import math
import os
import re
import warnings
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from ciclo._history import History
from ciclo._logs import Logs
from ciclo._time import Elapsed
from ciclo.callbacks import _faults, _integrity

__all__ = [
    "ITEMS",
    "BestRanked",
    "best_key",
    "check_layout",
    "elapsed_json",
    "history_from_json",
    "history_json",
    "host_layout",
    "is_leaf",
    "manager",
    "path",
    "restore_from",
    "score",
]

ITEMS = ("state", "elapsed", "history")


def score(metrics: Any) -> float:
    """Higher is better; checkpoints saved with a monitor store it as `score`."""
    if isinstance(metrics, Mapping) and "score" in metrics:
        return float(metrics["score"])
    return -math.inf


def best_key(step: int, metrics: Any) -> tuple[float, int]:
    """The ranking key of a checkpoint, larger is better: its score, then the
    EARLIER step among equal scores (as Keras' and Lightning's checkpoints, where
    only a strict improvement replaces the best)."""
    return score(metrics), -int(step)


@dataclasses.dataclass
class BestRanked:
    """Orbax preservation policy: the `n` best checkpoints that carry a score.

    Orbax's `BestN(keep_checkpoints_without_metrics=False)` but for two points: a
    checkpoint whose metrics have no score (an unranked save, or none at all) is
    never among the best, and among equal scores the earliest step wins
    (`best_key`). As `BestN`, it keeps everything while there are at most `n`
    checkpoints (orbax calls it with them in step order).
    """

    n: int

    def should_preserve(self, checkpoints: Any, *, context: Any) -> list[bool]:
        if len(checkpoints) <= self.n:
            return [True] * len(checkpoints)
        ranked = [
            (best_key(info.step, info.metrics), i)
            for i, info in enumerate(checkpoints)
            if isinstance(info.metrics, Mapping) and "score" in info.metrics
        ]
        best = {i for _, i in sorted(ranked)[-self.n :]}
        return [i in best for i in range(len(checkpoints))]


def path(directory: Any) -> epath.Path:
    """`directory` as an absolute `epath.Path` (URLs such as gs://... kept as is)."""
    if not isinstance(directory, str | os.PathLike):
        raise TypeError(
            f"`directory` must be a path (str or os.PathLike), got {directory!r} "
            f"({type(directory).__name__})."
        )
    result = epath.Path(directory)
    if "://" in str(directory):
        return result
    result = result.absolute()
    for folder in (result, *result.parents):  # a file where a folder must be
        if folder.exists():
            if not folder.is_dir():
                where = (
                    "is" if folder == result else f"is inside {str(folder)!r}, which is"
                )
                raise ValueError(
                    f"The checkpoint directory {os.fspath(directory)!r} {where} an "
                    f"existing file, not a directory. Pass a directory path (created "
                    f"if missing), e.g. {str(folder.parent / 'checkpoints')!r}."
                )
            break
    return result


def manager(directory: epath.Path, **options: Any) -> ocp.CheckpointManager:
    """A `CheckpointManager` of the `state` + `elapsed` layout.

    Orbax's removal of a killed save's temporary folders is left to the holder of
    the directory's lock (`remove_partial_saves`), so that opening a directory
    never removes the save in flight of another run; on URLs (no lock) orbax
    removes them."""
    url = "://" in str(directory)
    options.setdefault("cleanup_tmp_directories", url and not options.get("read_only"))
    _faults.quiet_orbax_logs()  # a failure is said once, by ciclo
    return ocp.CheckpointManager(
        directory,
        item_names=ITEMS,
        options=ocp.CheckpointManagerOptions(**options),
    )


def remove_partial_saves(directory: epath.Path) -> None:
    """Removes the temporary folders that saves killed mid-write left in
    `directory` (called by the holder of its lock)."""
    try:
        children = list(directory.iterdir())
    except OSError:
        return
    for child in children:
        if ".orbax-checkpoint-tmp" in child.name and child.is_dir():
            with contextlib.suppress(OSError):
                child.rmtree()


def _listing(folder: epath.Path, limit: int = 5) -> str:
    """The first `limit` names in `folder`, sorted (for an error message)."""
    try:
        names = sorted(p.name for p in folder.iterdir())
    except OSError:
        return "[?]"
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return f"{names[:limit]}{more}"


def foreign_steps(directory: epath.Path, steps: Any) -> list[int]:
    """The step folders among `steps` that ciclo did not write (no `elapsed` item)."""
    return [s for s in steps if not (directory / str(s) / "elapsed").exists()]


def check_layout(mngr: ocp.CheckpointManager, steps: Any = None) -> None:
    """Refuses a directory whose step folders are not ciclo checkpoints.

    Raises:
        ValueError: naming the directory, the foreign step folders and what the
            first one holds.
    """
    directory = epath.Path(mngr.directory)
    foreign = foreign_steps(directory, mngr.all_steps() if steps is None else steps)
    if not foreign:
        return
    shown = ", ".join(f"{s}/" for s in foreign[:3]) + (
        f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
    )
    raise ValueError(
        f"{directory} holds step folders that are not ciclo checkpoints: {shown} "
        f"({foreign[0]}/ holds {_listing(directory / str(foreign[0]))}; a ciclo "
        f"checkpoint holds the items 'state' and 'elapsed'). ciclo neither reads "
        f"nor deletes them: give ciclo.checkpoint / ciclo.restore / resume= a "
        f"directory of its own (a new or empty one), or move those folders out."
    )


def strategy_of(state: Any) -> Any:
    """The registered strategy a managed state names in `state.strategy`, or None.

    Duck-typed (any object with a `str` `strategy` attribute naming a registered
    strategy), so that this module needs no import of `ciclo.managed`.
    """
    name = getattr(state, "strategy", None)
    if not isinstance(name, str):
        return None
    # imported here: ciclo.callbacks is imported before ciclo.strategies
    from ciclo._strategies.registry import get_strategy

    try:
        return get_strategy(name)
    except ValueError:
        return None


def host_layout(state: Any) -> Any:
    """The state as saved: a managed state in its single-device host layout, or
    in the layout its strategy's `checkpoint_layout` gives."""
    strategy = strategy_of(state)
    if strategy is None:
        return state
    # a strategy may keep its layout (e.g. `ciclo.sharded`: sharded arrays, each
    # process writing its own shards, restored in the target's shardings)
    return getattr(strategy, "checkpoint_layout", strategy.to_host)(state)


def is_leaf(state: Any) -> bool:
    """True for a bare array / number, which `StandardSave` cannot store alone."""
    # orbax's StandardSave needs a container; a bare array / number is wrapped.
    return jax.tree_util.treedef_is_leaf(jax.tree.structure(state))


def elapsed_json(elapsed: Elapsed, wrapped: bool) -> dict[str, Any]:
    """The `elapsed` item (and whether the state was wrapped in a list)."""
    return {
        "steps": int(elapsed.steps),
        "samples": int(elapsed.samples),
        "date": float(elapsed.date),
        "date_start": float(elapsed.date_start),
        "wrapped": wrapped,
    }


def as_items(items: Any) -> tuple[str, ...] | None:
    """`checkpoint(items=...)` as a tuple of field names (None: the whole state)."""
    if items is None:
        return None
    names = (items,) if isinstance(items, str) else items
    if (
        not isinstance(names, list | tuple)
        or not names
        or not all(isinstance(n, str) for n in names)
    ):
        raise TypeError(
            f"checkpoint: `items` must be a field name or a list of them (attributes "
            f"of the state, or keys of a dict state), e.g. items=['params']; got "
            f"{items!r:.80} ({type(items).__name__})."
        )
    return tuple(names)


def select(state: Any, items: tuple[str, ...] | None) -> Any:
    """The fields `items` of `state` as a dict (the whole state for None)."""
    if items is None:
        return state
    missing = [n for n in items if not _has(state, n)]
    if missing:
        raise ValueError(
            f"checkpoint(items={list(items)}): the state "
            f"({type(state).__name__}) has no field {missing}; use attribute names "
            f"of the state (e.g. 'params') or keys of a dict state."
        )
    return {
        n: state[n] if isinstance(state, Mapping) else getattr(state, n) for n in items
    }


def _has(state: Any, name: str) -> bool:
    return name in state if isinstance(state, Mapping) else hasattr(state, name)


def put(target: Any, fields: Mapping[str, Any]) -> Any:
    """`target` with `fields` replaced (a dict, a Flax struct / dataclass, or any
    object with `replace(**fields)`)."""
    if isinstance(target, Mapping):
        return type(target)({**target, **fields})
    if hasattr(target, "replace"):
        return target.replace(**fields)
    if dataclasses.is_dataclass(target):
        return dataclasses.replace(target, **fields)
    raise TypeError(
        f"ciclo.restore: cannot put the saved items {sorted(fields)} into a "
        f"{type(target).__name__}; the target must be a dict, a dataclass or have "
        f"`replace(**fields)` (as Flax TrainState)."
    )


def logged(logs: Any, name: str) -> bool:
    """Whether the entry `name` (bare or `collection.name`) is in `logs`."""
    if not logs:
        return False
    pairs = [(c, n) for c, values in logs.items() for n in values]
    from ciclo._logs import locate

    return locate(pairs, name, "the monitored logs") is not None


def restore_from(
    mngr: ocp.CheckpointManager,
    target_state: Any,
    best: bool,
    step: int | None,
    with_history: bool = False,
    fallback: bool = False,
) -> tuple[Any, ...]:
    """`(state, elapsed)` of `step`, else the best (`best=True`), else the latest;
    `(state, elapsed, history, data)` with `with_history` (`data`: the data
    iterator's saved state as JSON, or None).

    A checkpoint that does not read back whole (a damaged or missing file) is
    never returned in part. With `fallback` (resuming the latest), the newer ones
    that do not read back are skipped with a warning naming them and why, and the
    newest that does is returned; without it, the error names the step and the fix.

    Raises:
        ValueError: no checkpoint, no such step, `best` without monitored ones, a
            checkpoint that does not read back (with `fallback`: none does), or a
            target that does not fit.
    """
    steps = mngr.all_steps()
    where = mngr.directory
    if not steps:
        raise ValueError(f"No checkpoint to restore in {where}.")
    check_layout(mngr, steps)
    if step is not None:
        if step not in steps:
            raise ValueError(
                f"No checkpoint for step {step} in {where}; steps there: {steps}."
            )
    elif best:
        scored = [s for s in steps if score(mngr.metrics(s)) > -math.inf]
        if not scored:
            raise ValueError(
                f"best=True, but the checkpoints in {where} (steps {steps}) carry no "
                f"monitored metric: save them with ciclo.checkpoint(..., "
                f"monitor='name'), or restore the latest with best=False."
            )
        step = max(scored, key=lambda s: best_key(s, mngr.metrics(s)))
    else:
        step = steps[-1]
    if not fallback:
        try:
            return _read(mngr, step, target_state, with_history)
        except Unreadable as error:
            older = [s for s in steps if s < step]
            fix = (
                f"restore an older one with step={older[-1]} (steps there: "
                f"{steps}), or delete {error.folder} and restore the latest again"
                if older
                else f"it is the only one there up to that step (steps there: "
                f"{steps}); delete {error.folder}"
            )
            raise ValueError(
                f"ciclo.restore: the checkpoint at step {step} in {where} does not "
                f"read back whole ({error.why}); nothing was loaded from it. It is "
                f"damaged or incomplete: {fix}."
            ) from None
    skipped: list[Unreadable] = []
    for candidate in reversed([s for s in steps if s <= step]):
        try:
            restored = _read(mngr, candidate, target_state, with_history)
        except Unreadable as error:
            skipped.append(error)
            continue
        if skipped:
            warnings.warn(
                f"ciclo.checkpoint: resuming from step {candidate} in {where}: "
                f"skipped the newer checkpoint(s) that do not read back whole "
                f"(damaged or incomplete): {_listed(skipped)}. Nothing was loaded "
                f"from them; they stay on disk until this run's saves replace "
                f"them.",
                stacklevel=5,  # the train_loop / loop call
            )
        return restored
    raise ValueError(
        f"ciclo.checkpoint: cannot resume from {where}: no checkpoint there reads "
        f"back whole: {_listed(skipped)}. Nothing was loaded, and the run does not "
        f"start fresh on its own: if the target state is right, these checkpoints "
        f"are damaged; delete them (or resume from another directory) to start "
        f"fresh."
    )


class Unreadable(Exception):
    """A checkpoint step that does not read back whole: `step`, `folder`, `why`."""

    def __init__(self, step: int, folder: epath.Path, error: BaseException):
        self.step, self.folder, self.why = step, folder, why(error)
        _faults.reported(f"{folder}/")  # orbax's leftover tasks: said here
        super().__init__(f"step {step}: {self.why}")


def why(error: BaseException) -> str:
    """The root cause of `error` in one short line (for a message)."""
    inner = error
    while inner.__cause__ is not None:
        inner = inner.__cause__
    if isinstance(inner, KeyError) and inner.args:
        text = str(inner.args[0])
    else:
        text = " ".join(str(inner).split())
    text = re.sub(r"\s*\[tensorstore_spec.*", "", text)
    text = f"{type(inner).__name__}: {text}" if text else type(inner).__name__
    if len(text) > 200:  # tensorstore: "CODE: Error ... at "file": the reason"
        code = re.match(r"\w+: ([A-Z_]{4,}: )?", text)
        text = (code.group(0) if code else "") + "... " + text.rsplit('": ', 1)[-1]
    return text[:300]


def _listed(errors: list[Unreadable]) -> str:
    return "; ".join(f"step {e.step} ({e.why})" for e in errors)


def _read(
    mngr: ocp.CheckpointManager, step: int, target_state: Any, with_history: bool
) -> tuple[Any, ...]:
    """Reads the checkpoint at `step` whole, or raises `Unreadable` (a target that
    does not fit raises its own ValueError)."""
    folder = epath.Path(mngr.directory) / str(step)
    try:
        items = mngr.restore(
            step, args=ocp.args.Composite(elapsed=ocp.args.JsonRestore())
        )
        e = items["elapsed"]
        wrapped = bool(e.get("wrapped", False))
        saved_items = None if e.get("items") is None else tuple(e["items"])
        elapsed = Elapsed(
            int(e["steps"]), int(e["samples"]), e["date"], e["date_start"]
        )
    except Exception as error:
        raise Unreadable(step, folder, error) from None
    strategy = strategy_of(target_state)
    host = None
    if target_state is None:
        state_args = ocp.args.StandardRestore()
    else:
        host = host_layout(target_state)
        abstract = jax.tree.map(
            ocp.utils.to_shape_dtype_struct, select(host, saved_items)
        )
        state_args = ocp.args.StandardRestore([abstract] if wrapped else abstract)
    if host is not None:  # checked first: orbax's own error is many lines
        _check_fits(mngr, step, target_state, select(host, saved_items), wrapped)
    try:
        state = mngr.restore(step, args=ocp.args.Composite(state=state_args))
        state = state["state"]
    except Exception as error:
        if host is not None:  # a difference the metadata did not show first
            _check_fits(mngr, step, target_state, select(host, saved_items), wrapped)
        raise Unreadable(step, folder, error) from None
    damaged = _integrity.differs(state, e.get("checksums"))
    if damaged is not None:
        raise Unreadable(
            step,
            folder,
            ValueError(
                f"the bytes read back for {damaged!r} differ from those saved "
                f"(checksum): its data files were changed"
            ),
        )
    state = state[0] if wrapped else state
    if saved_items is not None and host is not None:  # the rest is the target's
        state = put(host, state)
    if strategy is not None:
        state = strategy.place_state(state)
    if not with_history:
        return state, elapsed
    saved = None
    if (folder / "history").exists():
        try:
            saved = mngr.restore(
                step, args=ocp.args.Composite(history=ocp.args.JsonRestore())
            )["history"]
            history = history_from_json(saved)
        except Exception as error:
            raise Unreadable(step, folder, error) from None
    else:
        history = history_from_json(None)
    return state, elapsed, history, e.get("data")


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


def _check_fits(
    mngr: ocp.CheckpointManager,
    step: int,
    target_state: Any,
    target: Any,
    wrapped: bool,
) -> None:
    """Raises a one-line ValueError when the state saved at `step` does not have
    the structure or shapes of `target` (the target's host layout)."""
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
    when no difference in structure or shape is found."""
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
    shapes = []
    for name, leaf in target_paths.items():
        dtype = getattr(leaf, "dtype", None)
        if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.extended):
            continue  # a typed PRNG key is saved as its key data (another shape)
        want = tuple(getattr(leaf, "shape", np.shape(leaf)))
        have = getattr(saved_paths[name], "shape", None)
        if have is not None and tuple(have) != want:
            shapes.append(
                f"{name or '(the root)'!r}: saved {tuple(have)}, target {want}"
            )
    if shapes:
        more = f" and {len(shapes) - 3} more" if len(shapes) > 3 else ""
        return f"the shape differs at {'; '.join(shapes[:3])}{more}"
    return None


# -- the history item ---------------------------------------------------------------
def _bytes(values: array.array) -> dict[str, str]:
    return {"typecode": values.typecode, "b64": base64.b64encode(values).decode()}


def _from_bytes(item: Mapping[str, str]) -> array.array:
    values = array.array(item["typecode"])
    values.frombytes(base64.b64decode(item["b64"]))
    return values


def _encode(value: Any, where: str) -> Any:
    """A logged value (already on the host) as JSON, exactly."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int | float):
        return {"float": value.hex()} if isinstance(value, float) else value
    if isinstance(value, np.ndarray | np.generic):
        if value.dtype.hasobject:
            raise TypeError(
                f"ciclo.checkpoint: history entry {where} holds a numpy array of "
                f"Python objects, which a checkpoint cannot store; log numbers or "
                f"numeric arrays."
            )
        data = np.asarray(value)  # tobytes() is C order
        kind = "ndarray" if isinstance(value, np.ndarray) else "scalar"
        return {
            kind: base64.b64encode(data.tobytes()).decode(),
            "dtype": data.dtype.name,  # bfloat16 & co. by name
            "shape": list(data.shape),
        }
    if isinstance(value, list | tuple):
        items = [_encode(v, where) for v in value]
        return {"list": items} if isinstance(value, list) else {"tuple": items}
    if isinstance(value, Mapping):
        return {"dict": [[str(k), _encode(v, where)] for k, v in value.items()]}
    raise TypeError(
        f"ciclo.checkpoint: history entry {where} holds a {type(value).__name__}, "
        f"which a checkpoint cannot store (it saves the history beside the state); "
        f"log numbers, strings or arrays (lists/dicts of them) to resume it."
    )


def _decode(item: Any) -> Any:
    if not isinstance(item, dict):
        return item
    (kind, data), *_ = item.items()
    if kind == "float":
        return float.fromhex(data)
    if kind in ("ndarray", "scalar"):
        dtype = jax.numpy.dtype(item["dtype"])
        value = np.frombuffer(base64.b64decode(data), dtype=dtype)
        value = value.reshape(
            tuple(item["shape"])
        ).copy()  # writable, like a fetched one
        return value if kind == "ndarray" else value[()]
    if kind == "list":
        return [_decode(v) for v in data]
    if kind == "tuple":
        return tuple(_decode(v) for v in data)
    return {k: _decode(v) for k, v in data}


def history_json(
    history: History, row: tuple[Elapsed, Logs] | None = None
) -> dict[str, Any]:
    """`history` (its lagged values fetched first), plus `row` — the current step's
    `(elapsed, logs)`, not committed yet — as the JSON of the `history` item."""
    state = history.__getstate__()
    if row is not None and row[1]:
        copy = History.__new__(History)
        copy.__setstate__(state)  # takes the copied arrays: `history` is untouched
        copy.commit(*row)
        state = copy.__getstate__()
    columns = []
    for collection, name, rows, values in state["columns"]:
        where = f"{collection}.{name}"
        if isinstance(values, array.array):
            encoded = _bytes(values)
        else:
            try:
                encoded = {"list": [_encode(v, where) for v in values]}
            except TypeError as error:  # the state still saves; this entry doesn't
                warnings.warn(
                    f"{error} Entry {where} is left out of the saved history.",
                    stacklevel=4,
                )
                continue
        columns.append(
            {
                "collection": collection,
                "name": name,
                "rows": _bytes(rows),
                "values": encoded,
            }
        )
    return {
        "version": 1,
        "rows": state["rows"],
        "lag": state["lag"],
        "elapsed": [_bytes(f) for f in state["elapsed"]],
        "columns": columns,
    }


def history_from_json(item: Mapping[str, Any] | None) -> History:
    """The `History` saved by `history_json` (an empty one for None)."""
    if item is None:
        return History()
    columns = []
    for saved in item["columns"]:
        values = saved["values"]
        values = (
            [_decode(v) for v in values["list"]]
            if "list" in values
            else _from_bytes(values)
        )
        columns.append(
            (saved["collection"], saved["name"], _from_bytes(saved["rows"]), values)
        )
    history = History.__new__(History)
    history.__setstate__(
        {
            "lag": int(item.get("lag", 64)),
            "rows": int(item["rows"]),
            "elapsed": [_from_bytes(field) for field in item["elapsed"]],
            "columns": columns,
        }
    )
    return history
