"""The one routine behind `train_loop`, `test_loop` and `predict_loop`.

`collect` gathers the callbacks of every named schedule of a loop kind, in this
order: the state's own methods (class attributes named like a named schedule or an
alias), the explicit `tasks`, then the objects in `callbacks` that have attributes
named like named schedules. `run` lays them out per `named.LoopKind` and calls
`ciclo.loop`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from ciclo.loop import loop
from ciclo.loops.named import LoopKind, aliases_of, on_reset_step, resolve

__all__ = ["Registered", "collect", "run"]


@dataclasses.dataclass
class Registered:
    """The callbacks of one loop call, sorted by named schedule.

    Attributes:
        named: canonical named schedule -> callbacks, in registration order.
        ordinary: `(schedule, callbacks)` pairs from `tasks`, in the order given.
        finalizers: callback objects whose `__loop_end__` must run at loop end
            (those registered through one of their attributes).
    """

    named: dict[str, list[Any]]
    ordinary: list[tuple[Any, Any]]
    finalizers: list[Any]

    def nested(self, kind: LoopKind) -> Registered:
        """The part of this registration that an inner loop of `kind` runs."""
        return Registered({n: self.named[n] for n in kind.names}, [], [])

    def has(self, name: str) -> bool:
        return bool(self.named.get(name))


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, list | tuple) else [value]


def collect(kind: LoopKind, state: Any, tasks: Any, callbacks: Any) -> Registered:
    """Registers the state's methods, `tasks`, then `callbacks` for a loop of `kind`.

    A state method is registered as its CLASS attribute (`type(state).train_step`),
    so the loop calls it with the current state each step (`f(state, batch, ...)`).

    Raises:
        TypeError: if `tasks` is not a dict, or an object in `callbacks` has no
            attribute named like a named schedule of `kind`.
        ValueError: for an unknown named schedule in `tasks`.
    """
    names = kind.names
    named: dict[str, list[Any]] = {name: [] for name in names}
    cls = type(state)
    for name in names:
        for attribute in aliases_of(name):
            method = getattr(cls, attribute, None)
            if callable(method) and all(method is not m for m in named[name]):
                named[name].append(method)

    if tasks is None:
        tasks = {}
    if not isinstance(tasks, Mapping):
        raise TypeError(
            f"{kind.loop}: `tasks` must be a dict {{schedule: callback_or_list}}, got "
            f"{type(tasks).__name__}. Example: {{ciclo.on_train_step: [train_step]}}."
        )
    ordinary, explicit = [], set()
    for key, value in tasks.items():
        explicit.update(id(cb) for cb in _as_list(value))
        if isinstance(key, str):
            named[resolve(kind, key)].extend(_as_list(value))
        else:
            ordinary.append((key, value))

    finalizers = []
    for i, callback in enumerate(_as_list(callbacks)):
        found = []
        for name in names:
            for attribute in aliases_of(name):
                method = getattr(callback, attribute, None)
                if method is not None:
                    named[name].append(method)
                    found.append(method)
        if not found:
            raise TypeError(
                f"{kind.loop}: callbacks[{i}] ({type(callback).__name__}) has no "
                f"attribute named like a named schedule of {kind.loop} "
                f"({list(names)}), so it cannot register itself. Put it in `tasks` "
                f"with a schedule instead, e.g. {{ciclo.every(1): [callback]}}."
            )
        # The loop finalizes registered objects itself (an attribute returning the
        # callback); bound methods hide their object, so those are finalized here.
        if (
            hasattr(callback, "__loop_end__")
            and id(callback) not in explicit
            and all(method is not callback for method in found)
        ):
            explicit.add(id(callback))
            finalizers.append(callback)
    return Registered(named, ordinary, finalizers)


class Always:
    """An always-firing schedule whose repr names the group (for error messages)."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __call__(self, elapsed: Any) -> bool:
        return True

    def __repr__(self) -> str:
        return self.name


class _Finalizers:
    """Runs the `__loop_end__` hooks of self-registered callback objects."""

    def __init__(self, objects: list[Any]):
        self.objects = objects

    def __loop_callback__(self, loop_state: Any) -> None:
        return None

    def __loop_end__(self, loop_state: Any) -> None:
        for obj in self.objects:
            obj.__loop_end__(loop_state)


def run(
    kind: LoopKind,
    registered: Registered,
    state: Any,
    dataset: Iterable[Any],
    *,
    epoch: Any = None,
    nested: list[Any] | None = None,
    **loop_kwargs: Any,
) -> tuple[Any, Any, Any]:
    """Lays out `registered` for `kind` and runs `ciclo.loop`.

    Per batch: `kind.batch_begin`, `kind.step`, the ordinary schedules, then (when
    `epoch` says an epoch just ended) the reset steps, the `nested` callbacks (the
    test loop) and `on_epoch_end`, then `kind.batch_end`. `kind.begin` runs with the
    first batch before its tasks, `kind.end` after the last.

    Args:
        kind: the loop kind (`named.TRAIN`, `TEST`, `PREDICT`).
        registered: from `collect`.
        state: the initial state.
        dataset: any iterable of batches.
        epoch: an `epochs.EpochClock` (train loops only).
        nested: callbacks run at epoch end after the reset steps.
        **loop_kwargs: passed to `ciclo.loop` (stop, history, elapsed, ...).

    Returns:
        `(state, history, elapsed)` from `ciclo.loop`.
    """
    named = registered.named
    on_start: list[Any] = []
    if epoch is not None:
        on_start.append(epoch)
    if kind.start_resets:
        on_start += named[on_reset_step]
    on_start += named[kind.begin]

    tasks: dict[Any, list[Any]] = {}

    def add(key: Any, callbacks: list[Any]) -> None:
        if callbacks:
            tasks[key] = list(callbacks)

    add(Always(kind.batch_begin), named[kind.batch_begin])
    add(Always(kind.step), named[kind.step])
    for key, value in registered.ordinary:
        tasks[key] = value
    if epoch is not None:
        first, *rest = kind.epoch_end
        add(epoch.at(first), named[first])
        add(epoch.at(f"{kind.loop} nested loops"), nested or [])
        for name in rest:
            add(epoch.at(name), named[name])
    add(Always(kind.batch_end), named[kind.batch_end])

    on_end = list(named[kind.end])
    if registered.finalizers:
        on_end.append(_Finalizers(registered.finalizers))
    return loop(state, dataset, tasks, on_start=on_start, on_end=on_end, **loop_kwargs)
