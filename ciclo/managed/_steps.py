"""`managed.train_step` and `managed.step`: run a step under the state's strategy."""

from __future__ import annotations

import collections
import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from ciclo._logs import LOSSES, Logs
from ciclo._strategies.base import Strategy
from ciclo._strategies.registry import get_strategy

__all__ = ["ManagedStep", "step", "train_step"]

UserStep = Callable[..., tuple[Logs, Any]]


def _takes_elapsed(fn: Callable[..., Any]) -> bool:
    """Whether `fn` declares a third positional parameter (or `*args`)."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    count = 0
    for p in parameters:
        if p.kind == p.VAR_POSITIONAL:
            return True
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            count += 1
    return count >= 3


def _describe(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


def _call_user(fn: UserStep, takes_elapsed: bool, state, batch, elapsed):
    output = fn(state, batch, elapsed) if takes_elapsed else fn(state, batch)
    if type(output) is not tuple or len(output) != 2:
        raise TypeError(
            f"Managed step {_describe(fn)} must return (logs, state); got "
            f"{type(output).__name__}: {output!r:.200}."
        )
    logs, new_state = output
    if logs is None:
        logs = Logs()
    elif not isinstance(logs, Logs):
        if not isinstance(logs, Mapping):
            raise TypeError(
                f"Managed step {_describe(fn)} returned logs of type "
                f"{type(logs).__name__}; expected a ciclo.Logs (ciclo.logs())."
            )
        logs = Logs(logs)
    return logs, new_state


def _total_loss(logs: Logs, fn: UserStep) -> jax.Array:
    """The sum of the scalar entries of `logs["losses"]`."""
    losses = logs.get(LOSSES) or {}
    if not losses:
        logged = [f"{c}.{n}" for c, n, _ in logs.entries()]
        raise ValueError(
            f"managed.train_step {_describe(fn)} logged no loss (logged: {logged}); "
            f"add one with logs.add_loss('loss', value) so there is something to "
            f"differentiate."
        )
    total = 0.0
    for name, value in losses.items():
        shape = getattr(value, "shape", ())
        if shape != ():
            raise TypeError(
                f"Loss 'losses.{name}' logged by {_describe(fn)} has shape {shape}; "
                f"losses must be scalars. Reduce it first, e.g. jnp.mean(...)."
            )
        total = total + value
    return jnp.asarray(total)


class ManagedStep:
    """A step run under the state's strategy; build it with `train_step` or `step`.

    Call it as `logs, state = f(state, batch)` or `f(state, batch, elapsed)`; in a
    loop it receives `elapsed` too. Used as a method of a `ManagedState` subclass,
    `state.f(batch)` works as well. The compiled function is cached per strategy.
    """

    def __init__(self, fn: UserStep, *, grad: bool):
        if not callable(fn):
            raise TypeError(f"managed steps decorate a function, got {fn!r}.")
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.grad = grad
        self._takes_elapsed = _takes_elapsed(fn)
        self._compiled: dict[Strategy, Callable[..., Any]] = {}
        self._in_flight: collections.deque[jax.Array] = collections.deque()

    def __repr__(self) -> str:
        kind = "train_step" if self.grad else "step"
        return f"managed.{kind}({_describe(self.fn)})"

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            return self
        return functools.partial(self, obj)

    def __call__(self, state: Any, batch: Any, elapsed: Any = None) -> tuple[Logs, Any]:
        name = getattr(state, "strategy", None)
        if not isinstance(name, str):
            raise TypeError(
                f"{self!r} needs a ciclo.managed.ManagedState (a state with a "
                f"`strategy`), got {type(state).__name__}. Create it with "
                f"managed.ManagedState.create(params=..., tx=..., strategy='jit')."
            )
        strategy = get_strategy(name)
        compiled = self._compiled.get(strategy)
        if compiled is None:
            compiled = self._compiled[strategy] = strategy.compile(
                self._build(strategy), donate=strategy.donate and self.grad
            )
        logs, state = compiled(
            state, strategy.lift_batch(batch), elapsed if self._takes_elapsed else None
        )
        if strategy.max_in_flight is not None:
            self._bound_in_flight(strategy.max_in_flight, logs, state)
        return strategy.lower_logs(logs), state

    def _bound_in_flight(self, limit: int, logs: Logs, state: Any) -> None:
        """Waits (without a transfer) for the call `limit` calls ago to finish."""
        token = next(iter(jax.tree.leaves(logs)), None)
        if token is None:
            token = getattr(state, "step", None)
        if not isinstance(token, jax.Array):
            return
        self._in_flight.append(token)
        while len(self._in_flight) > limit:
            self._in_flight.popleft().block_until_ready()

    def _build(self, strategy: Strategy) -> Callable[..., tuple[Logs, Any]]:
        fn, takes_elapsed = self.fn, self._takes_elapsed

        if not self.grad:

            def run(state, batch, elapsed):
                logs, state = _call_user(fn, takes_elapsed, state, batch, elapsed)
                return strategy.reduce_logs(logs), state

            return run

        def train(state, batch, elapsed):
            def loss_fn(params):
                logs, new_state = _call_user(
                    fn, takes_elapsed, state.replace(params=params), batch, elapsed
                )
                return _total_loss(logs, fn), (logs, new_state)

            grads, (logs, new_state) = jax.grad(loss_fn, has_aux=True)(state.params)
            grads = strategy.mean(grads)
            if getattr(new_state, "batch_stats", None) is not None:
                new_state = new_state.replace(
                    batch_stats=strategy.mean(new_state.batch_stats)
                )
            new_state = new_state.apply_gradients(grads=grads)
            return strategy.reduce_logs(logs), new_state

        return train


def train_step(fn: UserStep) -> ManagedStep:
    """Decorates `fn(state, batch[, elapsed]) -> (logs, state)` into a training step.

    `fn` logs at least one scalar loss (`logs.add_loss(...)`); ciclo sums the
    entries of `losses`, differentiates the sum w.r.t. `state.params` (`fn` runs on
    `state.replace(params=...)`), averages the gradients (and a `batch_stats` field)
    across devices as the strategy requires, and applies them with
    `state.apply_gradients` to the state `fn` returned. Logs come back reduced by
    the strategy: losses and metrics averaged, outputs concatenated.

    Args:
        fn: the step, taking `(state, batch)` or `(state, batch, elapsed)`.

    Returns:
        A `ManagedStep` callable as `logs, state = step(state, batch[, elapsed])`,
        usable as a `ciclo.loop` callback.

    Raises:
        ValueError: (when called) if `fn` logs no loss.
        TypeError: (when called) if a loss is not a scalar.

    Example:
        >>> import ciclo, jax.numpy as jnp, optax
        >>> from ciclo import managed
        >>> @managed.train_step
        ... def fit(state, batch):
        ...     logs = ciclo.logs()
        ...     logs.add_loss("mse", jnp.mean((state.params * batch - 1.0) ** 2))
        ...     return logs, state
        >>> state = managed.ManagedState.create(params=jnp.zeros(()), tx=optax.sgd(0.1))
        >>> logs, state = fit(state, jnp.ones(4))
        >>> float(logs.losses.mse), int(state.step)
        (1.0, 1)
    """
    return ManagedStep(fn, grad=True)


def step(fn: UserStep) -> ManagedStep:
    """Decorates `fn(state, batch[, elapsed]) -> (logs, state)` to run under the
    state's strategy without gradients (evaluation, prediction).

    Args:
        fn: the step, taking `(state, batch)` or `(state, batch, elapsed)`.

    Returns:
        A `ManagedStep` callable as `logs, state = step(state, batch[, elapsed])`.

    Example:
        >>> import ciclo, jax.numpy as jnp, optax
        >>> from ciclo import managed
        >>> @managed.step
        ... def evaluate(state, batch):
        ...     logs = ciclo.logs()
        ...     logs.add_metric("mean", jnp.mean(state.params * batch))
        ...     return logs, state
        >>> state = managed.ManagedState.create(params=jnp.ones(()), tx=optax.sgd(0.1))
        >>> logs, _ = evaluate(state, jnp.arange(4.0))
        >>> float(logs.metrics.mean)
        1.5
    """
    return ManagedStep(fn, grad=False)
