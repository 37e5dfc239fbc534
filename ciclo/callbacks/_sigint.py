"""`GUARD`: defers Ctrl-C while a writer updates its rows, so that an interrupt
landing mid-write never loses a row nor writes one twice (see `Writer`)."""

from __future__ import annotations

import signal
import threading
from typing import Any

__all__ = ["GUARD", "SigintGuard"]


class SigintGuard:
    """Defers Ctrl-C (SIGINT) while a writer updates its rows during a loop.

    A writer's call moves rows between its held row, its queue and the output; a
    KeyboardInterrupt raised in the middle would lose a row or write one twice.
    While a loop runs a writer, this handler replaces Python's default SIGINT
    handler: outside a writer's call it raises KeyboardInterrupt at once (as the
    default does); inside one it is remembered and raised when the call ends, so
    the loop sees Ctrl-C between two callbacks. A handler someone else installed is
    left alone (the writer then runs unguarded), as is any thread but the main one.
    """

    def __init__(self):
        self.users = 0  # writers in a running loop that count on the handler
        self.busy = False  # a writer's call is running
        self.pending = False  # a SIGINT came during it
        self.handler = self._handle  # one object, to recognise it installed

    def _handle(self, signum: int, frame: Any) -> None:
        if self.busy:
            self.pending = True
            return
        signal.default_int_handler(signum, frame)  # raises KeyboardInterrupt

    def acquire(self) -> bool:
        """Installs the handler (first user); whether the caller is guarded."""
        if threading.current_thread() is not threading.main_thread():
            return False
        try:
            current = signal.getsignal(signal.SIGINT)
            if current is not self.handler:
                if current is not signal.default_int_handler:
                    return False  # a handler of the user's (or none): not ours
                signal.signal(signal.SIGINT, self.handler)
        except (ValueError, OSError):  # no signals here (e.g. a subinterpreter)
            return False
        self.users += 1
        return True

    def release(self) -> None:
        """Puts Python's default handler back once the last user's loop ended."""
        self.users = max(self.users - 1, 0)
        if self.users == 0:
            self.busy = self.pending = False
            try:
                if signal.getsignal(signal.SIGINT) is self.handler:
                    signal.signal(signal.SIGINT, signal.default_int_handler)
            except (ValueError, OSError):
                pass


GUARD = SigintGuard()
