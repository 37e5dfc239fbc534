"""`Gate`: a training step whose completion the test controls, to prove that the loop
does not wait for the device, on any backend and whatever the device's speed.

The test's step calls `gate.value(index)` (a `jax.pure_callback` in the jitted
step). The callback of step `hold` (or, see below, of the first step after it that
runs asynchronously) blocks until the loop has dispatched `ahead` more steps: the
loop callback `gate.tick`, placed after the bars, writers and history of a step,
releases it once step `held + ahead` was dispatched (or the callback finds, when
it starts, that it was already). Every later step depends on the held one through
the state, so none of them can finish before that. A loop
that waits for the device (an implicit `float(loss)`, a history, bar or writer
reading a value before it is computed, a drain at an epoch end) waits forever:
the callback gives up after `timeout` seconds instead, the loop goes on, and
`gate.check()` fails the test (fast: no hang).

On a GPU or TPU every step runs asynchronously. jax's CPU client runs a
computation with a host callback inline, in the dispatching thread, when its
inputs are ready: there a blocked callback would block the loop itself. So on the
CPU the held step must be dispatched while its input is still being computed:
`gate.delay` (a loop callback put before the step) returns the state through a
computation of a few tens of milliseconds (no callback, so it runs
asynchronously), and the callback only holds a step that does not run in the
loop's thread; a step that ran inline anyway (the host was descheduled for
longer than the delay) is not held, and the next one is tried, up to `tries`.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["Gate"]


@jax.jit
def _delayed(state: Any) -> Any:
    """`state` again, computed after ~tens of ms of device work (asynchronously)."""
    m = jax.lax.fori_loop(
        0, 40, lambda _, m: jnp.tanh(m @ m / 256.0), jnp.full((256, 256), 0.5)
    )
    zero = jnp.where(jnp.isnan(m.mean()), 1, 0)  # 0, known only once m is

    def add(x):
        return x + zero.astype(x.dtype) if jnp.issubdtype(x.dtype, jnp.number) else x

    return jax.tree.map(add, state)


class Gate:
    """Holds one step's device computation until the loop is `ahead` steps past it
    (`ahead=None`: until `release()`).

    Use as a context manager: leaving it releases the step whatever happened, so a
    failing test never leaves a callback blocked.
    """

    def __init__(
        self,
        *,
        hold: int = 2,
        ahead: int | None = 8,
        tries: int = 6,
        timeout: float = 20.0,
    ):
        self.hold, self.ahead, self.tries, self.timeout = hold, ahead, tries, timeout
        self._host = threading.get_ident()  # the loop's thread
        self._release = threading.Event()
        self._lock = threading.Lock()
        self._delays = 0
        self.dispatched = 0  # steps the loop has dispatched (seen by `tick`)
        self.held: int | None = None  # the index of the step held
        self.timed_out = False
        self.dispatched_at_release: int | None = None  # steps dispatched by then
        self.waited = 0.0  # seconds the held callback waited

    # -- device side ----------------------------------------------------------------
    def _wait(self, index: np.ndarray) -> np.ndarray:
        i = int(np.asarray(index).reshape(-1)[0])
        if (
            self.held is not None
            or i < self.hold
            or threading.get_ident() == self._host  # run inline by the loop
        ):
            return np.zeros((), np.float32)
        with self._lock:
            self.held = i
            if self.ahead is not None and self.dispatched > i + self.ahead:
                # the host is that far ahead already
                self.dispatched_at_release = self.dispatched
                self._release.set()
        start = time.perf_counter()
        if not self._release.wait(self.timeout):
            self.timed_out = True
        self.waited = time.perf_counter() - start
        return np.zeros((), np.float32)

    def value(self, index: Any) -> jax.Array:
        """A float32 zero, computed once the gate lets step `index` go (`index`:
        the step's index, traced in the step). Add it to the step's loss and new
        state, so that everything after depends on it."""
        return jax.pure_callback(
            self._wait, jax.ShapeDtypeStruct((), jnp.float32), jnp.asarray(index)
        )

    # -- host side ------------------------------------------------------------------
    def delay(self, state: Any, batch: Any, elapsed: Any, loop_state: Any) -> Any:
        """A loop callback put before the step: until a step is held (from the call
        that runs step `hold - 1` on, `tries` times at most), returns the state
        through an asynchronous computation, so the step's input is not ready yet."""
        if (
            self.held is None
            and int(loop_state.elapsed_after.steps) >= self.hold
            and self._delays < self.tries
        ):
            self._delays += 1
            return None, _delayed(state)
        return None

    def tick(self, state: Any, batch: Any, elapsed: Any, loop_state: Any) -> None:
        """A loop callback put after the step's other callbacks: counts the steps
        dispatched, and releases the held step once step `held + ahead` was."""
        with self._lock:
            self.dispatched = int(loop_state.elapsed_after.steps)
            if (
                self.held is not None
                and self.ahead is not None
                and not self._release.is_set()
                and self.dispatched > self.held + self.ahead
            ):
                self.dispatched_at_release = self.dispatched
                self._release.set()

    def release(self) -> None:
        """Lets the held step go now (for a test that releases it by hand)."""
        self._release.set()

    def pending(self, value: Any) -> jax.Array:
        """`value` as a device value that is computed only once the gate lets step
        `hold` go (`release()`, with `ahead=None`): a held value, outside a loop."""
        value = jnp.asarray(value)
        plus = jax.jit(lambda v, i: v + self.value(i).astype(v.dtype))
        plus(value, jnp.asarray(-1)).block_until_ready()  # compiled, not held
        for _ in range(self.tries):
            out = plus(_delayed(value), jnp.asarray(self.hold))
            if not out.is_ready():  # dispatched asynchronously: it will be held
                return out
        raise AssertionError(f"pending: no try ran asynchronously ({self.tries})")

    def check(self) -> None:
        """Fails unless the loop ran `ahead` steps past the held one without waiting."""
        assert self.held is not None, (
            f"no step from {self.hold} on ran asynchronously ({self._delays} tries)"
        )
        assert not self.timed_out, (
            f"the loop waited for step {self.held} to finish on the device before "
            f"dispatching step {self.held + self.ahead} (the step gave up after "
            f"{self.timeout:.0f} s): a host sync"
        )
        assert self.ahead is None or self.dispatched_at_release is not None, (
            f"the loop ended before step {self.held + self.ahead}"
        )

    def __enter__(self) -> Gate:
        _delayed(jnp.zeros(())).block_until_ready()  # compiled before the loop
        return self

    def __exit__(self, *exc: Any) -> None:
        self._release.set()
