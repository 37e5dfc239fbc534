"""`profiler`: traces a window of steps with the JAX profiler."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import jax

from ciclo._short import short
from ciclo.callbacks._base import LoopElement

if TYPE_CHECKING:
    from ciclo._loop.state import LoopState

__all__ = ["profiler"]


class profiler(LoopElement):
    """Traces the steps `start, ..., start + steps - 1` with `jax.profiler`.

    Before the batch of step `start` it calls `jax.profiler.start_trace(logdir)`;
    before the batch of step `start + steps` it waits for the device to finish the
    traced work (one sync, so the trace holds it) and calls
    `jax.profiler.stop_trace()`. A loop that ends inside the window (its end,
    Ctrl-C, an error) stops the trace at its end. Open the trace with TensorBoard's
    profile plugin (`tensorboard --logdir logdir`) or Perfetto
    (`logdir/plugins/profile/<run>/*.trace.json.gz`). Skip the first steps
    (`start`), which compile.

    In `ciclo.train_loop(callbacks=[...])` it runs on `on_train_batch_begin`; in
    `ciclo.loop` put it first so it runs before the train step (`{**prof,
    ciclo.every(1): train_step}`, or `{ciclo.every(1): [prof, train_step]}`). By
    hand, call `prof(elapsed, state)` before each step and `prof.close()` at the
    end.

    Args:
        logdir: where the trace is written.
        start: the first traced step.
        steps: how many steps are traced.

    Raises:
        ValueError: if `start` is negative or `steps` is not positive.

    Example:
        >>> import os, tempfile, jax.numpy as jnp, ciclo
        >>> logdir = tempfile.mkdtemp()
        >>> def train_step(state, batch):
        ...     return state + jnp.float32(batch)
        >>> prof = ciclo.profiler(logdir, start=1, steps=2)
        >>> _ = ciclo.loop(jnp.float32(0), range(4), {**prof, ciclo.every(1): train_step})
        >>> prof.traced, os.path.isdir(os.path.join(logdir, "plugins", "profile"))
        ((1, 3), True)
    """

    reads_batch = False  # its hooks never read the loop's batch

    def __init__(self, logdir: str | os.PathLike, *, start: int = 10, steps: int = 5):
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise ValueError(
                f"profiler: `start` must be an int >= 0, got {short(start)}."
            )
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(
                f"profiler: `steps` must be an int >= 1, got {short(steps)}."
            )
        self.logdir = os.fspath(logdir)
        self.start, self.steps = start, steps
        self.tracing = False
        self.traced: tuple[int, int] | None = None  # (first step, step stopped at)
        self._first = 0

    @property
    def on_train_batch_begin(self) -> profiler:
        """The profiler itself: in `train_loop` it runs before each train step."""
        return self

    def __call__(self, elapsed: Any, state: Any = None) -> None:
        """Starts or stops the trace before the step `elapsed` counts up to."""
        step = int(elapsed.steps)
        if not self.tracing and self.start <= step < self.start + self.steps:
            jax.profiler.start_trace(self.logdir)
            self.tracing, self._first = True, step
        elif self.tracing and step >= self.start + self.steps:
            self._stop(state, step)

    def _stop(self, state: Any, step: int) -> None:
        try:
            if state is not None:
                jax.block_until_ready(state)
        finally:
            self.tracing = False
            jax.profiler.stop_trace()
            self.traced = (self._first, step)

    def __loop_callback__(self, loop_state: LoopState) -> tuple[None, None]:
        self(loop_state.elapsed, loop_state.state)
        return None, None

    def close(self, state: Any = None, elapsed: Any = None) -> None:
        """Stops the trace if it is running."""
        if self.tracing:
            self._stop(
                state,
                self.start + self.steps if elapsed is None else int(elapsed.steps),
            )

    def __loop_end__(self, loop_state: LoopState) -> None:
        try:
            self.close(loop_state.state, loop_state.elapsed)
        except Exception:  # an error of the traced work surfaces elsewhere
            if self.tracing:
                self.tracing = False
                jax.profiler.stop_trace()
