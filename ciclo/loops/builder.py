"""The one routine behind `train_loop`, `test_loop` and `predict_loop`.

`collect` gathers the callbacks of every named schedule of a loop kind, in this
order: the state's own methods (class attributes named like a named schedule or an
alias), the explicit `tasks`, then the objects in `callbacks` that have attributes
named like the loop's own named schedules. `run` lays them out per
`named.LoopKind` and calls `ciclo.loop`, deferring a stop asked for during a batch
to the end of that batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from ciclo.loop import _finalizers, _runner, loop
from ciclo.loops.named import LoopKind, aliases_of, on_reset_step, resolve

__all__ = ["Registered", "collect", "run"]


@dataclasses.dataclass
class Registered:
    """The callbacks of one loop call, sorted by named schedule.

    Attributes:
        named: canonical named schedule -> callbacks, in registration order.
        ordinary: `(schedule, callbacks)` pairs from `tasks`, in the order given.
        finalizers: the objects of `callbacks` that have a `__loop_end__` (it runs
            once at loop end, also when only their bound methods were registered).
    """

    named: dict[str, list[Any]]
    ordinary: list[tuple[Any, Any]]
    finalizers: list[Any]

    def nested(self, kind: LoopKind) -> Registered:
        """The part of this registration that an inner loop of `kind` runs.

        Its reset steps are left out: the outer loop has just run them.
        """
        named = {n: self.named[n] for n in kind.names}
        named[on_reset_step] = []
        return Registered(named, [], [])

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
    State methods and `tasks` may name the schedules of a nested loop (the test loop
    of `train_loop`); objects in `callbacks` register on `kind.own` names only, so a
    progress bar given to `train_loop` never runs (or closes) in its test loop.

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
    ordinary = []
    for key, value in tasks.items():
        if isinstance(key, str):
            named[resolve(kind, key)].extend(_as_list(value))
        else:
            ordinary.append((key, value))

    finalizers = []
    own = kind.own
    for i, callback in enumerate(_as_list(callbacks)):
        found = []
        for name in own:
            for attribute in aliases_of(name):
                method = getattr(callback, attribute, None)
                if method is not None:
                    named[name].append(method)
                    found.append(method)
        if not found:
            raise TypeError(
                f"{kind.loop}: callbacks[{i}] ({type(callback).__name__}) has no "
                f"attribute named like a named schedule of {kind.loop} "
                f"({list(own)}), so it cannot register itself. Put it in `tasks` "
                f"with a schedule instead, e.g. {{ciclo.every(1): [callback]}}."
            )
        if hasattr(callback, "__loop_end__"):
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


class _Deferred:
    """A stop asked for during a batch (`loop_state.stop_iteration = True`)."""

    __slots__ = ("requested",)

    def __init__(self):
        self.requested = False


class _Group:
    """Runs the callbacks of one schedule in order, as one loop callback.

    With `deferred`, a callback's `loop_state.stop_iteration = True` is taken back
    and recorded, so the rest of the batch still runs; `_BatchEnd` then ends the
    loop. Errors name each callback as `ciclo.loop` does (`where[i]`).
    """

    __slots__ = ("deferred", "runners")

    def __init__(self, callbacks: list[Any], where: str, deferred: _Deferred | None):
        self.runners = [_runner(cb, f"{where}[{i}]") for i, cb in enumerate(callbacks)]
        self.deferred = deferred

    def __loop_callback__(self, loop_state: Any) -> None:
        deferred = self.deferred
        for run in self.runners:
            run(loop_state)
            if deferred is not None and loop_state.stop_iteration:
                loop_state.stop_iteration = False
                deferred.requested = True


class _BatchEnd:
    """The last task of every batch: ends the loop if a stop was asked for or reached."""

    __slots__ = ("deferred", "epoch")

    def __init__(self, deferred: _Deferred, epoch: Any):
        self.deferred, self.epoch = deferred, epoch

    def __loop_callback__(self, loop_state: Any) -> None:
        if self.deferred.requested or (
            self.epoch is not None and self.epoch.final(loop_state.elapsed)
        ):
            self.deferred.requested = False
            loop_state.stop_iteration = True


class _Finalizers:
    """Runs the `__loop_end__` hooks of the loop's callback objects, each once."""

    def __init__(self, hooks: list[Any]):
        self.hooks = hooks

    def __loop_callback__(self, loop_state: Any) -> None:
        return None

    def __loop_end__(self, loop_state: Any) -> None:
        for hook in self.hooks:
            hook(loop_state)


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

    A callback that sets `loop_state.stop_iteration` during a batch ends the loop at
    the END of that batch: the batch's remaining callbacks still run. (Set in
    `kind.begin`, it ends the loop before the first batch, as in `ciclo.loop`.)
    With `epoch`, the loop also ends after the batch whose elapsed reaches
    `epoch.stop` (the same reading that ends the epoch), so `loop_kwargs` should not
    carry a `stop` then.

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

    Raises:
        TypeError: for a callback that is not callable or takes too many arguments.
    """
    named = registered.named
    deferred = _Deferred()
    used: list[list[Any]] = []

    def group(callbacks: list[Any], where: str, defer: bool = True) -> _Group:
        used.append(callbacks)
        return _Group(
            callbacks, f"Callback tasks[{where}]", deferred if defer else None
        )

    on_start: list[Any] = []
    if epoch is not None:
        epoch.requested = lambda: deferred.requested
        on_start.append(epoch)
    begin = [*(named[on_reset_step] if kind.start_resets else []), *named[kind.begin]]
    if begin:
        on_start.append(group(begin, repr(kind.begin), defer=False))

    tasks: dict[Any, Any] = {}

    def add(key: Any, callbacks: list[Any]) -> None:
        if callbacks:
            tasks[key] = group(list(callbacks), repr(key.name))

    add(Always(kind.batch_begin), named[kind.batch_begin])
    add(Always(kind.step), named[kind.step])
    for key, value in registered.ordinary:
        if _as_list(value):
            tasks[key] = group(_as_list(value), repr(key))
    if epoch is not None:
        first, *rest = kind.epoch_end
        add(epoch.at(first), named[first])
        add(epoch.at(f"{kind.loop} nested loops"), nested or [])
        for name in rest:
            add(epoch.at(name), named[name])
    add(Always(kind.batch_end), named[kind.batch_end])
    tasks[Always(f"{kind.loop} end of batch")] = _BatchEnd(deferred, epoch)

    on_end: list[Any] = []
    if named[kind.end]:
        on_end.append(group(named[kind.end], repr(kind.end), defer=False))
    finalizers = _finalizers({}, *used, registered.finalizers)
    if finalizers:
        on_end.append(_Finalizers(finalizers))
    return loop(state, dataset, tasks, on_start=on_start, on_end=on_end, **loop_kwargs)
