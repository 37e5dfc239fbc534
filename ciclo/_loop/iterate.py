"""`ciclo.iterate`: `train_loop` as a generator of its epoch ends.

The loop runs in a worker thread; at each epoch end (after every `on_epoch_end`
callback) it hands `(state, logs, elapsed)` to the caller and waits for the next
`next()`. Leaving the `for` loop (break, return, an exception) asks the loop to end
after the current batch: `on_train_batch_end`, `on_train_end` and the callbacks'
end hooks (checkpoints finishing their saves, writers closing) run before the
generator is closed.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

from ciclo._logs import Logs
from ciclo._predefined.register import as_list
from ciclo._predefined.train import train_loop
from ciclo._time import Elapsed, mark_counted


class _Handoff:
    """The callback that hands each epoch end to the caller and waits for it."""

    def __init__(self) -> None:
        self.to_caller: queue.Queue = queue.Queue()
        self.to_loop: queue.Queue = queue.Queue()
        self.cancelled = False

    def on_epoch_end(self, state, batch, elapsed, loop_state) -> None:
        logs = Logs({c: dict(entries) for c, entries in loop_state.logs.items()})
        elapsed = mark_counted(loop_state.elapsed_after, "ciclo.iterate yielded")
        self.to_caller.put(("epoch", (loop_state.state, logs, elapsed)))
        if self.to_loop.get() == "stop":
            loop_state.stop_after_batch()

    def on_train_batch_end(self, state, batch, elapsed, loop_state) -> None:
        if self.cancelled:  # the caller was interrupted between two epoch ends
            loop_state.stop_after_batch()


def iterate(
    state: Any, dataset: Any, tasks: Any = None, **kwargs: Any
) -> Iterator[tuple[Any, Logs, Elapsed]]:
    """`ciclo.train_loop` as a generator: yields `(state, logs, elapsed)` at each
    epoch end, for pull-style code.

    Takes the same arguments as `train_loop`. `logs` are the epoch-end step's logs
    (train step, test loop entries, `epoch_logs`' means); `elapsed` counts the
    batches trained into `state` (as a checkpoint's). Leaving the `for` loop early
    (break, return, an exception) ends training cleanly after the current batch:
    `on_train_batch_end`, `on_train_end` and the end hooks of the callbacks run
    before the generator closes. Ctrl-C ends it the same way (and then
    propagates, unless `catch_keyboard_interrupt`, the default, is true). The
    generator's return value (`StopIteration.value`, or `yield from`) is
    `train_loop`'s `(state, history, elapsed)`. Errors of the arguments surface at
    the first `next()`.

    Example:
        >>> import ciclo
        >>> def train_step(state, batch):
        ...     return ciclo.logs().add_loss("loss", batch), state + batch
        >>> for state, logs, elapsed in ciclo.iterate(
        ...         0, [1, 2, 3], {ciclo.on_train_step: train_step}, epochs=10):
        ...     print(state, logs.losses.loss, elapsed.steps)
        ...     if elapsed.steps >= 6:
        ...         break
        6 3 3
        12 3 6
    """
    handoff = _Handoff()
    kwargs["callbacks"] = [*as_list(kwargs.get("callbacks")), handoff]
    catch = kwargs.get("catch_keyboard_interrupt", True)
    outcome: list[Any] = []

    def work() -> None:
        try:
            outcome.append(("done", train_loop(state, dataset, tasks, **kwargs)))
        except BaseException as error:  # handed to the caller
            outcome.append(("error", error))
        handoff.to_caller.put(("end", None))

    worker = threading.Thread(target=work, name="ciclo.iterate", daemon=True)
    worker.start()
    waiting = False  # the loop waits for the caller's answer
    try:
        while True:
            kind, value = handoff.to_caller.get()
            if kind == "end":
                break
            waiting = True
            yield value
            waiting = False
            handoff.to_loop.put("next")
    except KeyboardInterrupt:
        _stop(handoff, worker, waiting)
        if not catch:
            raise
        return outcome[0][1] if outcome and outcome[0][0] == "done" else None
    finally:
        _stop(handoff, worker, waiting)
    kind, value = outcome[0]
    if kind == "error":
        raise value
    return value


def _stop(handoff: _Handoff, worker: threading.Thread, waiting: bool) -> None:
    """Ends the loop after its current batch and waits for it (and its hooks)."""
    if not worker.is_alive():
        return
    handoff.cancelled = True
    if waiting:
        handoff.to_loop.put("stop")
    while worker.is_alive():
        try:
            kind, _ = handoff.to_caller.get(timeout=0.1)
        except queue.Empty:
            continue
        if kind == "epoch":
            handoff.to_loop.put("stop")
    worker.join()
