"""`noop`: the callback that does nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ciclo._loop.callback import observer

if TYPE_CHECKING:
    from ciclo._loop.state import LoopState

__all__ = ["NoOp", "noop"]


class NoOp:
    """A callback that does nothing; `ciclo.noop` is its single instance.

    Use it as a placeholder in a task list or where a callback is required, e.g.
    `checkpoint_cb = ciclo.checkpoint(...) if save else ciclo.noop`. Called by hand
    with any arguments it returns None.

    Example:
        >>> import ciclo
        >>> state, history, elapsed = ciclo.loop(7, range(3), {ciclo.every(1): ciclo.noop})
        >>> state, elapsed.steps, len(history)
        (7, 3, 0)
        >>> ciclo.noop(1, 2, logs=None) is None
        True
    """

    reads_batch = False  # its hooks never read the loop's batch

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return None

    @observer
    def __loop_callback__(self, loop_state: LoopState) -> None:
        return None

    def __repr__(self) -> str:
        return "ciclo.noop"


noop = NoOp()
