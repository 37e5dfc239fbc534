"""The loop's one interrupt scope: Ctrl-C (SIGINT) and preemption (SIGTERM).

While a loop runs in the main thread (`train_loop` and `ciclo.loop`; a loop nested
in a callback shares its caller's scope), `scope()` owns both signals, and puts
the previous handlers back when the outermost loop ends. It takes a signal only
where Python's default handler is in place: a handler of the user's is left
alone, and a loop in another thread installs nothing.

- SIGINT raises `KeyboardInterrupt` at once, as Python's default handler does,
  except inside a `deferred()` block — a writer moving its rows, a checkpoint
  starting or finishing a save — where it is held and raised as the block ends,
  so that no row is lost or written twice and no save is abandoned half-started.
  Outside a loop, `deferred()` takes SIGINT for the block's duration only.
- SIGTERM (the preemption notice of Kubernetes, SLURM, cloud VMs) never raises:
  it asks the loop to stop after the step in flight (`Scope.preempted`). The loop
  then has the checkpoints in it save that step (`__loop_preempt__`) and runs its
  end hooks (saves waited for, writers flushed, the directory's lock released);
  when the scope ends, the process ends as SIGTERM would have ended it (the
  previous handler put back and the signal sent again: status 143).
- Under `jax.distributed` SIGTERM belongs to jax: `jax.distributed.initialize`
  installs the coordination service's preemption notifier, which tells every
  process, and they agree on a step through
  `multihost_utils.reached_preemption_sync_point` (the check orbax's
  `CheckpointManager.should_save` makes). The loop asks it after each step with
  the step count, so every process stops after, and saves, the same step; no
  Python handler is installed for SIGTERM then (it would replace jax's). ciclo's
  checkpoint managers answer orbax's own question from the loop's answer
  (`reached_preemption`), so that only the loop moves the step count.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "DEFERRED",
    "Scope",
    "deferred",
    "held",
    "preempted",
    "reached_preemption",
    "scope",
]


class Scope:
    """The process's interrupt state (one object, `_SCOPE`)."""

    def __init__(self) -> None:
        self.depth = 0  # nested scopes in the main thread
        self.busy = 0  # nested `deferred()` blocks
        self.pending = False  # a SIGINT came during a deferred block
        self.preempted = False  # SIGTERM came, or jax's preemption sync point
        self.watcher: Any = None  # the loop that stops for a preemption
        self.sync: Callable[[int], bool] | None = None  # jax's sync point check
        self.checked: int | None = None  # the last step asked about
        self.previous: dict[int, Any] = {}  # the handlers replaced
        self.installed_int = False  # SIGINT is ours (deferral works)

    # -- handlers ----------------------------------------------------------------
    def _on_int(self, signum: int, frame: Any) -> None:
        if self.busy:
            self.pending = True
            return
        signal.default_int_handler(signum, frame)  # raises KeyboardInterrupt

    def _on_term(self, signum: int, frame: Any) -> None:
        self.preempted = True

    # -- the loop's commit (`held`) ----------------------------------------------
    def hold(self) -> None:
        """`deferred()`'s entry where SIGINT is already the scope's (main thread)."""
        self.busy += 1

    def release(self) -> None:
        """`deferred()`'s exit likewise: a SIGINT held meanwhile is raised now."""
        self.busy -= 1
        if self.pending and self.busy == 0:
            self.pending = False
            raise KeyboardInterrupt

    def _take(self, signum: int, default: Any, handler: Any) -> bool:
        """Installs `handler` for `signum` where `default` is in place."""
        try:
            if signal.getsignal(signum) is not default:
                return False  # the user's (or none from Python): not ours
            self.previous[signum] = signal.signal(signum, handler)
        except (ValueError, OSError):  # no signals here (e.g. a subinterpreter)
            return False
        return True

    def _give_back(self, signum: int) -> None:
        previous = self.previous.pop(signum, None)
        if previous is not None:
            with contextlib.suppress(ValueError, OSError):
                signal.signal(signum, previous)

    # -- the loop's side ----------------------------------------------------------
    def claim(self, loop: Any) -> bool:
        """Whether `loop` is the one that stops for a preemption: the first loop
        of the outermost scope (a nested loop, such as a test loop, runs on)."""
        if self.depth == 0 or self.watcher is not None:
            return False
        self.watcher = loop
        return True

    def stop_requested(self, steps: int) -> bool:
        """After a step (`steps`: the steps trained so far): whether to stop for a
        preemption. Under `jax.distributed` asks jax's sync point about every step
        count reached since the last call (a fused call counts several)."""
        if self.preempted:
            return True
        sync = self.sync
        if sync is None:
            return False
        first = steps if self.checked is None else self.checked + 1
        self.checked = steps
        for step in range(first, steps + 1):
            if sync(step):
                self.preempted = True
                return True
        return False

    def _end_process(self) -> None:
        """Ends the process as SIGTERM would have: the pending saves finished, the
        default handler back, the signal sent again (status 143)."""
        pending = sys.modules.get("ciclo._checkpoint.pending")
        if pending is not None:  # checkpoints saved by hand: their saves too
            pending.finish_pending()
        if self.sync is not None:  # leave the coordination service cleanly
            with contextlib.suppress(Exception):
                import jax

                jax.distributed.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        raise SystemExit(128 + signal.SIGTERM)  # SIGTERM blocked: the same status


_SCOPE = Scope()


def _jax_sync() -> Callable[[int], bool] | None:
    """jax's preemption sync point check when `jax.distributed` runs its
    preemption service, else None."""
    if "jax" not in sys.modules:
        return None
    try:
        from jax._src import distributed
        from jax.experimental import multihost_utils
    except ImportError:
        return None
    state = distributed.global_state
    if state.client is None or state.preemption_sync_manager is None:
        return None
    return multihost_utils.reached_preemption_sync_point


_MAIN = threading.main_thread().ident  # signals reach this thread only


def _main_thread() -> bool:
    return threading.get_ident() == _MAIN


@contextlib.contextmanager
def scope() -> Iterator[Scope | None]:
    """The interrupt scope of a loop: entered by `train_loop` and `loop`; yields
    the process's `Scope` (None in a thread other than the main one)."""
    if not _main_thread():
        yield None
        return
    s = _SCOPE
    outer = s.depth == 0
    if outer:
        s.preempted = s.pending = False
        s.watcher, s.checked = None, None
        s.sync = _jax_sync()
        s.installed_int = s._take(signal.SIGINT, signal.default_int_handler, s._on_int)
        if s.sync is None:
            s._take(signal.SIGTERM, signal.SIG_DFL, s._on_term)
    s.depth += 1
    failure = None
    try:
        yield s
    except BaseException as error:
        failure = error
        raise
    finally:
        s.depth -= 1
        if outer:
            s._give_back(signal.SIGINT)
            s._give_back(signal.SIGTERM)
            s.installed_int = False
            s.watcher = None
            if s.preempted:
                if failure is not None:  # said before the process ends
                    traceback.print_exception(failure, file=sys.stderr)
                s._end_process()


class _Deferred:
    """`deferred()`: SIGINT held for the duration of the block (re-entrant)."""

    __slots__ = ("installed",)

    def __init__(self) -> None:
        self.installed: list[bool] = []  # the main thread's open blocks

    def __enter__(self) -> None:
        if threading.get_ident() != _MAIN:  # signals reach the main thread only
            return
        s = _SCOPE
        own = False
        if not s.installed_int:  # outside a loop: for the block
            own = s._take(signal.SIGINT, signal.default_int_handler, s._on_int)
            s.installed_int = own
        self.installed.append(own)
        s.busy += 1

    def __exit__(self, *exc: Any) -> None:
        if threading.get_ident() != _MAIN:
            return
        own = self.installed.pop()
        s = _SCOPE
        s.busy -= 1
        if own:
            s._give_back(signal.SIGINT)
            s.installed_int = False
        if s.pending and s.busy == 0:
            s.pending = False
            raise KeyboardInterrupt


DEFERRED = _Deferred()


def held() -> tuple[Callable[[], None], Callable[..., None]]:
    """`(enter, exit)` of a `deferred()` block for a loop's per-batch commit:
    the scope's own `hold`/`release` while it has SIGINT in this (the main)
    thread, the general `DEFERRED` otherwise. Resolved once per `loop` call,
    so the commit pays no thread check per batch."""
    s = _SCOPE
    if _main_thread() and s.installed_int:
        return s.hold, s.release
    return DEFERRED.__enter__, DEFERRED.__exit__


def deferred() -> _Deferred:
    """A block in which Ctrl-C waits: `with deferred(): ...` raises the
    `KeyboardInterrupt` of a SIGINT received inside it as the block ends."""
    return DEFERRED


def preempted() -> bool:
    """Whether a SIGTERM asked the running loop to stop."""
    return _SCOPE.preempted


def reached_preemption(step: int) -> bool:
    """`CheckpointManager.reached_preemption` for ciclo's managers: whether the
    loop stopped for a preemption. The loop alone asks jax's sync point, once per
    step in order; orbax's own asks (at each save, and from its finalize thread
    with the step of a save already made) would move the step count each process
    reports to the coordination service back, and the agreed step could then be
    one no process reaches again."""
    return _SCOPE.preempted
