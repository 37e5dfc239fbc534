"""The loop hooks of an object, read in one place: `hooks_of(obj) -> Hooks`.

An object among a loop's callbacks may define, besides being callable:

- `__loop_callback__(loop_state) -> output`: the loop calls it instead of the
  object (`(logs, state)`, as a callback returns);
- `__loop_resume__(state, history, elapsed)`: before the loop starts, returns
  None or the `(state, history, elapsed[, data_state])` to start from;
- `__loop_start__(elapsed)`: before the first batch, after any resume, told the
  elapsed the loop starts from (None: step 0);
- `__loop_end__(loop_state)`: once when the loop ends, on every exit path;
- `__loop_preempt__(loop_state)`: when a preemption (SIGTERM) stops the loop,
  before the end hooks;
- `__loop_state__() -> JSON data`: what a checkpoint saved in the loop keeps of
  the object (`early_stopping`'s best value and where it was seen), and
  `__loop_restore__(data)`: given it back when a loop resumes from that
  checkpoint, before the start hooks (an object is known by its class, its
  `__loop_state_key__` if it has one, and its place among the loop's objects
  alike);
- `__loop_register_first__ = True`: as a `callbacks=` object of a predefined loop,
  registered before the other `callbacks` objects at each of its places.

The lifecycle hooks (all but `__loop_callback__`) of a bound method among the
callbacks are its owner's: `callbacks=[checkpoint]` registers the checkpoint's
methods, and its `__loop_end__` still runs. A loop reads them through one
`HookTable`, built for that loop run: each object's hooks are read once, and each
owner's lifecycle hooks run once per loop however often it appears.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ciclo._history.history import History
    from ciclo._loop.state import LoopState
    from ciclo._time import Elapsed

__all__ = [
    "CallHook",
    "EndHook",
    "HookTable",
    "Hooks",
    "ResumeHook",
    "StartHook",
    "hooks_of",
]

CallHook = Callable[["LoopState"], Any]
"""`__loop_callback__(loop_state) -> None | Logs | state | (logs, state)`."""
ResumeHook = Callable[
    [Any, "History | None", "Elapsed | None"], "tuple[Any, ...] | None"
]
"""`__loop_resume__(state, history, elapsed) -> None | (state, history, elapsed[,
data_state])`."""
StartHook = Callable[["Elapsed | None"], None]
"""`__loop_start__(elapsed)`: the elapsed the loop starts from (None: step 0)."""
EndHook = Callable[["LoopState"], None]
"""`__loop_end__(loop_state)` and `__loop_preempt__(loop_state)`."""


@dataclasses.dataclass(frozen=True, slots=True)
class Hooks:
    """An object's loop hooks, bound (None where it has none)."""

    call: CallHook | None = None  # __loop_callback__
    resume: ResumeHook | None = None  # __loop_resume__
    start: StartHook | None = None  # __loop_start__
    end: EndHook | None = None  # __loop_end__
    preempt: EndHook | None = None  # __loop_preempt__
    first: bool = False  # __loop_register_first__
    keep: Callable[[], Any] | None = None  # __loop_state__
    restore: Callable[[Any], None] | None = None  # __loop_restore__

    @property
    def lifecycle(self) -> bool:
        """Whether it has a hook run around the loop (resume, start, end, preempt,
        its state kept by checkpoints)."""
        hooks = (self.resume, self.start, self.end, self.preempt, self.keep)
        return any(h is not None for h in hooks)

    @property
    def present(self) -> bool:
        """Whether it has any loop hook."""
        return self.call is not None or self.lifecycle or self.first


_NONE = Hooks()


def hooks_of(obj: Any) -> Hooks:
    """The loop hooks of `obj` (of the object itself, not a bound method's owner:
    see `HookTable.owner`). The one place ciclo reads the `__loop_*__` names."""
    if obj is None:
        return _NONE
    return Hooks(
        getattr(obj, "__loop_callback__", None),
        getattr(obj, "__loop_resume__", None),
        getattr(obj, "__loop_start__", None),
        getattr(obj, "__loop_end__", None),
        getattr(obj, "__loop_preempt__", None),
        bool(getattr(obj, "__loop_register_first__", False)),
        getattr(obj, "__loop_state__", None),
        getattr(obj, "__loop_restore__", None),
    )


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, list | tuple) else [value]


class HookTable:
    """The hooks of one loop run's callbacks, each object's read once.

    `prepared` is set once the resume and start hooks ran (`ciclo._input.resume.
    prepare`): a predefined loop runs them before it assembles its data, then
    hands its table to the loop it compiles to, which does not run them again.
    """

    __slots__ = ("_read", "kept", "prepared")

    def __init__(self) -> None:
        self._read: dict[int, tuple[Any, Hooks]] = {}  # id -> (object kept, hooks)
        self.prepared = False
        # (key, hooks) of the objects whose state checkpoints keep, named when
        # the loop is prepared (`keyed`)
        self.kept: list[tuple[str, Hooks]] = []

    def of(self, obj: Any) -> Hooks:
        """`hooks_of(obj)`, read once per table."""
        found = self._read.get(id(obj))
        if found is None:  # the object is kept: its id is not reused meanwhile
            found = self._read[id(obj)] = (obj, hooks_of(obj))
        return found[1]

    def owner(self, callback: Any) -> Any:
        """The object whose lifecycle hooks `callback` brings: itself, or a bound
        method's owner; None when neither has any."""
        if self.of(callback).lifecycle:
            return callback
        owner = getattr(callback, "__self__", None)
        return owner if owner is not None and self.of(owner).lifecycle else None

    def owners(self, groups: Iterable[Any]) -> list[tuple[Any, Hooks]]:
        """The owners of lifecycle hooks among the callbacks of `groups` (lists or
        single ones) and their hooks, once each, in order of first appearance."""
        seen: set[int] = set()
        found = []
        for group in groups:
            for callback in _as_list(group):
                owner = self.owner(callback)
                if owner is not None and id(owner) not in seen:
                    seen.add(id(owner))
                    found.append((owner, self.of(owner)))
        return found

    def keyed(self, groups: Iterable[Any]) -> list[tuple[str, Hooks]]:
        """The owners among `groups`' callbacks whose state checkpoints keep
        (`__loop_state__`), each named by its class, its `__loop_state_key__` if
        it has one, and its place among the owners named alike
        (`EarlyStopping:loss/min-0`): the same command names them alike in the
        run that saves and the one that resumes."""
        counts: dict[str, int] = {}
        out = []
        for owner, hooks in self.owners(groups):
            if hooks.keep is None:
                continue
            name = type(owner).__qualname__
            own = getattr(owner, "__loop_state_key__", None)  # its own identity
            if own is not None:
                name = f"{name}:{own}"
            counts[name] = counts.get(name, -1) + 1
            out.append((f"{name}-{counts[name]}", hooks))
        return out

    def states(self) -> dict[str, Any] | None:
        """What each kept object's `__loop_state__` gives now (None: none kept)."""
        if not self.kept:
            return None
        return {key: hooks.keep() for key, hooks in self.kept}

    def end_hooks(self, groups: Iterable[Any]) -> list[EndHook]:
        """The `__loop_end__` hooks of `groups`' callbacks, once per owner."""
        return [h.end for _, h in self.owners(groups) if h.end is not None]

    def preempt_hooks(self, groups: Iterable[Any]) -> list[EndHook]:
        """The `__loop_preempt__` hooks of `groups`' callbacks, once per owner."""
        return [h.preempt for _, h in self.owners(groups) if h.preempt is not None]
