"""`managed.train_step` and `managed.step`: run a step under the state's strategy.

A managed step is a callback like any other (`ciclo._callback`): its function takes
`(state)`, `(state, batch)` or `(state, batch, elapsed)` and returns logs, a state,
or `(logs, state)`. This module also declares how each log collection is reduced
across the devices a strategy runs the step on (`REDUCTIONS`); strategies only
provide the collectives.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable, Mapping
from typing import Any

import einop
import jax
import jax.numpy as jnp
import numpy as np
import optax

from ciclo._callback import arity, describe, inject, split_output
from ciclo._fused import check_steps
from ciclo._logs import LOSSES, METRICS, OUTPUTS, STATEFUL_METRICS, Logs
from ciclo._prefetch import placed
from ciclo._strategies.base import Collectives, Strategy, is_stateful_metric
from ciclo._strategies.registry import get_strategy
from ciclo._time import Elapsed, Steps, short
from ciclo.callbacks._base import LoopElement

__all__ = [
    "FUSED_LOGS",
    "REDUCTIONS",
    "ManagedStep",
    "grad_logs",
    "place_ahead",
    "reduce_logs",
    "step",
    "train_step",
]

FUSED_LOGS = ("all", "mean")

UserStep = Callable[..., Any]
GradsFn = Callable[..., Any]

# collection -> how its entries are combined across devices; any other collection
# is averaged. Whatever the collection, a stateful metric (anything with `merge`)
# is merged across devices and then computed; outputs without a batch axis (0-d)
# are averaged.
REDUCTIONS = {
    LOSSES: "mean",
    METRICS: "mean",
    STATEFUL_METRICS: "merge",
    OUTPUTS: "concat",
}


def reduce_logs(logs: Logs, collectives: Collectives) -> Logs:
    """Inside the step: each entry reduced across devices as `REDUCTIONS` says."""
    out = Logs()
    for collection, name, value in logs.entries():
        if is_stateful_metric(value):
            value = collectives.merge(value).compute()
        elif REDUCTIONS.get(collection, "mean") == "concat" and jnp.ndim(value) > 0:
            value = collectives.concat(value)
        else:
            value = collectives.mean(value)
        out.add_entry(collection, name, value)
    out._aggregations = getattr(logs, "_aggregations", None)  # declared modes
    return out


def check_fused(steps_per_call: Any, fused_logs: Any, where: str) -> None:
    """Validates the fused-execution options of a step or a state."""
    if steps_per_call is not None:
        check_steps(steps_per_call, where)
    if fused_logs is not None and fused_logs not in FUSED_LOGS:
        raise ValueError(
            f"{where}: fused_logs must be one of {FUSED_LOGS} (a history row per "
            f"fused step, or one row per call with the steps' mean), got "
            f"{fused_logs!r}."
        )


def _at_step(elapsed: Elapsed, i: Any, per_step: Any) -> Elapsed:
    """`elapsed` moved `i` steps (of `per_step` samples) on, inside a fused call."""
    e = object.__new__(Elapsed)
    e.__dict__.update(elapsed.__dict__)
    e.__dict__["steps"] = elapsed.steps + i
    e.__dict__["samples"] = elapsed.samples + i * per_step
    return e


_INT = jax.dtypes.canonicalize_dtype(np.int64)
_FLOAT = jax.dtypes.canonicalize_dtype(np.float64)


def _pack(elapsed: Elapsed, *ints: int) -> tuple[np.ndarray, np.ndarray]:
    """`elapsed` (and `ints`) as two arrays: two transfers into a compiled step
    instead of one per Python scalar (five for an `Elapsed`)."""
    return (
        np.array((elapsed.steps, elapsed.samples, *ints), _INT),
        np.array((elapsed.date, elapsed.date_start, elapsed.time), _FLOAT),
    )


def _unpack(packed: tuple[Any, Any]) -> tuple[Elapsed, Any]:
    """Inside the step: the `Elapsed` of `_pack` and its extra ints."""
    ints, floats = packed
    e = object.__new__(Elapsed)
    d = e.__dict__
    d["steps"], d["samples"] = ints[0], ints[1]
    d["date"], d["date_start"], d["time"] = floats[0], floats[1], floats[2]
    return e, ints[2:]


def _unpacking(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn(state, batch, elapsed)` taking `elapsed` packed (`_pack`) too."""

    def run(state, batch, elapsed):
        if type(elapsed) is tuple:
            elapsed = _unpack(elapsed)[0]
        return fn(state, batch, elapsed)

    return run


def _compiles(strategy: Strategy) -> bool:
    return type(strategy).wrap is not Strategy.wrap


def place_ahead(strategy: Strategy, batch: Any) -> Any:
    """`batch` placed for a managed step under `strategy`, as the step would place
    it (a fused `Steps`: its stacked batch, in the layout the fused call takes);
    on the device even for a strategy that leaves batches to `jit` (`jit`,
    `eager`). Used to place batches ahead of their step (`ciclo._prefetch`)."""
    as_is = type(strategy).place_batch is Strategy.place_batch
    if type(batch) is Steps:
        batch = batch.batch
        if not as_is:
            batch = jax.tree.map(lambda x: _batch_major(x, strategy), batch)
    if not as_is:
        return strategy.place_batch(batch)
    # through a compiled identity: the transfer of a jitted call's numpy argument
    # (C++ dispatch) costs the host a fraction of `jax.device_put`'s (Python
    # path): 40 vs 260 us for an (x, y) batch on the 2-core CPU VM; 80 vs 184 us
    # on the H100 VM. Explicit placement: allowed under a transfer guard.
    with jax.transfer_guard_host_to_device("allow"):
        return _identity(batch)


@jax.jit
def _identity(batch: Any) -> Any:
    return batch


def _fold(stacked: Logs, mode: str) -> tuple[Logs, Logs | None]:
    """A fused call's logs from the per-step ones (leading axis = steps):
    `"all"`: the last step's values and the per-step rows; `"mean"`: losses,
    metrics and other collections averaged over the steps, stateful metrics the
    last step's (they are accumulated), outputs concatenated; no rows."""
    if mode == "all":
        return jax.tree.map(lambda x: x[-1], stacked), stacked
    out = Logs()
    for collection, name, value in stacked.entries():
        if collection == STATEFUL_METRICS:
            value = value[-1]
        elif collection == OUTPUTS and jnp.ndim(value) >= 2:
            value = einop.einop(value, "k b ... -> (k b) ...")
        else:
            value = jnp.mean(value, axis=0)
        out.add_entry(collection, name, value)
    out._aggregations = getattr(stacked, "_aggregations", None)  # declared modes
    return out, None


def _batch_major(x: Any, strategy: Strategy) -> Any:
    """A fused leaf `(n, B, ...)` as `(B, n, ...)`, for a strategy that places
    batches on their first axis (split or sharded)."""
    if np.ndim(x) < 2:
        raise ValueError(
            f"Fused steps under strategy {strategy.name!r}: a leaf of shape "
            f"{np.shape(x)} has no batch axis (fused leaves are (steps, batch, "
            f"...)); give every batch leaf a batch axis."
        )
    if isinstance(x, np.ndarray | np.generic):
        return np.swapaxes(x, 0, 1)
    return jnp.swapaxes(x, 0, 1)


def _accumulate(logs: Logs, state: Any) -> tuple[Logs, Any]:
    """Merges each logged stateful metric into the state's field of the same name
    (when the state has one holding a stateful metric); logs the accumulation."""
    metrics = logs.get(STATEFUL_METRICS)
    if not metrics:
        return logs, state
    updates = {}
    for name, value in metrics.items():
        held = getattr(state, name, None)
        if is_stateful_metric(value) and is_stateful_metric(held):
            updates[name] = held.merge(value)
    if not updates:
        return logs, state
    logs = Logs(logs)
    logs[STATEFUL_METRICS] = {**metrics, **updates}
    return logs, state.replace(**updates)


def _total_loss(logs: Logs, fn: UserStep) -> jax.Array:
    """The sum of the scalar entries of `logs["losses"]`."""
    losses = logs.get(LOSSES) or {}
    if not losses:
        logged = [f"{c}.{n}" for c, n, _ in logs.entries()]
        raise ValueError(
            f"managed.train_step {describe(fn)} logged no loss (logged: {logged}); "
            f"add one with logs.add_loss('loss', value) so there is something to "
            f"differentiate."
        )
    total = 0.0
    for name, value in losses.items():
        shape = jnp.shape(value)
        if shape != ():
            raise TypeError(
                f"Loss 'losses.{name}' logged by {describe(fn)} has shape {shape}; "
                f"losses must be scalars. Reduce it first, e.g. jnp.mean(...)."
            )
        total = total + value
    return jnp.asarray(total)


class ManagedStep(LoopElement):
    """A step run under the state's strategy; build it with `train_step` or `step`.

    Call it as `logs, state = f(state)`, `f(state, batch)` or
    `f(state, batch, elapsed)` (the wrapped function gets the arguments it
    declares). It always returns `(logs, state)`. In a loop it is a callback; as a
    loop element, `{**f}` means `{ciclo.every(1): [f]}`. Used as a method of a
    `ManagedState` subclass, `state.f(batch)` works as well. The compiled function
    is cached per strategy.
    """

    def __init__(
        self,
        fn: UserStep,
        *,
        grad: bool,
        log_grad_norm: bool = False,
        grads_fn: GradsFn | None = None,
        steps_per_call: int | None = None,
        fused_logs: str | None = None,
    ):
        kind = "managed.train_step" if grad else "managed.step"
        check_fused(steps_per_call, fused_logs, kind)
        if not callable(fn):
            raise TypeError(
                f"{kind} decorates a function f(state[, batch[, elapsed]]), got "
                f"{type(fn).__name__}: {short(fn)}."
            )
        n = arity(fn, kind, most=3)
        if n == 0:
            raise TypeError(
                f"{kind} ({describe(fn)}) takes no arguments; a managed step takes "
                f"(state), (state, batch) or (state, batch, elapsed)."
            )
        if not isinstance(log_grad_norm, bool):
            raise TypeError(
                f"{kind}: log_grad_norm must be True or False, got {log_grad_norm!r}."
            )
        if grads_fn is not None:
            if not callable(grads_fn):
                raise TypeError(
                    f"{kind}: grads_fn must be a function (grads[, state]) -> "
                    f"logs_or_None, got {type(grads_fn).__name__}: {short(grads_fn)}."
                )
            arity(grads_fn, f"{kind}(grads_fn=...)", most=2)
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.grad = grad
        self.log_grad_norm = log_grad_norm
        self.grads_fn = grads_fn
        self.steps_per_call = steps_per_call
        self.fused_logs = fused_logs
        self._arity = n
        self._compiled: dict[Strategy, Callable[..., Any]] = {}
        self._fused: dict[tuple[Strategy, str, bool], Callable[..., Any]] = {}
        self._in_flight: collections.deque[jax.Array] = collections.deque()

    def __repr__(self) -> str:
        kind = "train_step" if self.grad else "step"
        return f"managed.{kind}({describe(self.fn)})"

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            return self
        return functools.partial(self, obj)

    def __call__(
        self, state: Any, batch: Any = None, elapsed: Any = None
    ) -> tuple[Logs, Any]:
        name = getattr(state, "strategy", None)
        if not isinstance(name, str):
            raise TypeError(
                f"{self!r} needs a ciclo.managed.ManagedState (a state with a "
                f"`strategy`), got {type(state).__name__}. Create it with "
                f"managed.ManagedState.create(params=..., tx=..., strategy='jit')."
            )
        strategy = get_strategy(name)
        if type(batch) is Steps:
            return self._call_fused(strategy, state, batch, elapsed)
        compiled = self._compiled.get(strategy)
        if compiled is None:
            if self.grad and not hasattr(state, "params"):
                raise TypeError(
                    f"{self!r} differentiates w.r.t. `state.params`, but the "
                    f"{type(state).__name__} it got has no `params`. Create the "
                    f"state with managed.ManagedState.create(params=..., tx=...)."
                )
            compiled = self._compiled[strategy] = strategy.wrap(
                _unpacking(self._build(strategy)), donate=strategy.donate and self.grad
            )
        if self._arity < 2:
            batch = None
        else:
            ahead = placed(batch, strategy)  # read ahead and placed by the loop
            batch = strategy.place_batch(batch) if ahead is None else ahead
        if self._arity < 3:
            elapsed = None
        elif type(elapsed) is Elapsed and _compiles(strategy):
            elapsed = _pack(elapsed)
        logs, state = compiled(state, batch, elapsed)
        if strategy.max_in_flight is not None:
            self._bound_in_flight(strategy.max_in_flight, logs, state)
        return logs, state

    def _call_fused(
        self, strategy: Strategy, state: Any, steps: Steps, elapsed: Any
    ) -> tuple[Logs, Any]:
        """Runs the `steps.n` steps of a fused batch in one compiled call."""
        mode = self.fused_logs or getattr(state, "fused_logs", None) or "all"
        # a strategy that places batches as they are (jit, eager) scans the leading
        # axis directly; the others place (B, n, ...) so they split the batch axis
        step_major = type(strategy).place_batch is Strategy.place_batch
        key = (strategy, mode, step_major)
        compiled = self._fused.get(key)
        if compiled is None:
            compiled = self._fused[key] = strategy.wrap(
                self._build_fused(strategy, mode, step_major),
                donate=strategy.donate and self.grad,
            )
        batch = None
        if self._arity >= 2:
            batch = placed(steps, strategy)  # stacked and placed ahead by the loop
            if batch is None and steps.batch is not None:
                batch = steps.batch
                if not step_major:
                    batch = jax.tree.map(lambda x: _batch_major(x, strategy), batch)
                batch = strategy.place_batch(batch)
        # only what the call uses goes to the device: the step indices when there
        # is no batch to count them, `elapsed` (packed) when the step takes it
        index = np.arange(steps.n, dtype=np.int32) if batch is None else None
        if self._arity < 3 or elapsed is None:
            elapsed = None
        else:
            per_step = steps.samples // steps.n if steps.n else 0
            elapsed = _pack(elapsed, per_step)
        (logs, rows), state = compiled(state, batch, (elapsed, index))
        if rows is not None:
            steps.rows = rows if steps.rows is None else Logs(steps.rows).merge(rows)
        if strategy.max_in_flight is not None:
            self._bound_in_flight(strategy.max_in_flight, logs, state)
        return logs, state

    def _build_fused(
        self, strategy: Strategy, mode: str, step_major: bool
    ) -> Callable[..., Any]:
        single = self._build(strategy)

        def fused(state, batch, extra):
            elapsed, index = extra
            per_step = 0
            if elapsed is not None:
                elapsed, (per_step,) = _unpack(elapsed)
            if batch is not None and not step_major:
                batch = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), batch)
            if index is None:  # as many steps as the stacked batch's leading axis
                index = jnp.arange(jax.tree.leaves(batch)[0].shape[0], dtype=jnp.int32)

            def body(state, xs):
                i, b = xs
                e = None if elapsed is None else _at_step(elapsed, i, per_step)
                logs, state = single(state, b, e)
                return state, logs

            state, stacked = jax.lax.scan(body, state, (index, batch))
            return _fold(stacked, mode), state

        return fused

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

    def _call_user(self, state: Any, batch: Any, elapsed: Any) -> tuple[Logs, Any]:
        fn = self.fn
        output = fn(*(state, batch, elapsed)[: self._arity])
        try:
            logs, new_state = split_output(output, fn)
        except TypeError as error:
            raise TypeError(
                f"Managed step {describe(fn)} must return (logs, state), logs or a "
                f"state: {error}"
            ) from None
        if new_state is None:
            new_state = state
        elif not isinstance(getattr(new_state, "strategy", None), str):
            raise TypeError(
                f"Managed step {describe(fn)} returned a {type(new_state).__name__} "
                f"where the state was expected; return logs (ciclo.logs()), the "
                f"state, or (logs, state)."
            )
        if logs is None:
            logs = Logs()
        elif not isinstance(logs, Logs):
            logs = Logs(logs)
        return logs, new_state

    def _grad_logs(self, grads: Any, state: Any) -> Logs:
        return grad_logs(grads, state, self.log_grad_norm, self.grads_fn)

    def _build(self, strategy: Strategy) -> Callable[..., tuple[Logs, Any]]:
        collectives = getattr(strategy, "collectives", None) or Collectives()

        if not self.grad:

            def run(state, batch, elapsed):
                logs, state = self._call_user(state, batch, elapsed)
                logs, state = _accumulate(logs, state)
                return reduce_logs(logs, collectives), state

            return run

        def train(state, batch, elapsed):
            def loss_fn(params):
                logs, new_state = self._call_user(
                    state.replace(params=params), batch, elapsed
                )
                return _total_loss(logs, self.fn), (logs, new_state)

            grads, (logs, new_state) = jax.grad(loss_fn, has_aux=True)(state.params)
            mean_grads = getattr(collectives, "mean_grads", None)
            if mean_grads is None:
                grads = collectives.mean(grads)
            else:  # e.g. kept in the parameters' sharding
                grads = mean_grads(grads, new_state)
            if getattr(new_state, "batch_stats", None) is not None:
                new_state = new_state.replace(
                    batch_stats=collectives.mean(new_state.batch_stats)
                )
            if self.log_grad_norm or self.grads_fn is not None:
                logs = Logs(logs).merge(self._grad_logs(grads, new_state))
            logs, new_state = _accumulate(logs, new_state)
            new_state = new_state.apply_gradients(grads=grads)
            return reduce_logs(logs, collectives), new_state

        return train


def train_step(
    fn: UserStep | None = None,
    *,
    log_grad_norm: bool = False,
    grads_fn: GradsFn | None = None,
    steps_per_call: int | None = None,
    fused_logs: str | None = None,
) -> Any:
    """Makes `fn` a training step: ciclo differentiates its losses and applies them.

    `fn(state)`, `fn(state, batch)` or `fn(state, batch, elapsed)` returns logs, a
    state, or `(logs, state)` (as any callback), with at least one scalar loss
    (`logs.add_loss(...)`). ciclo sums the entries of `losses`, differentiates the
    sum w.r.t. `state.params` (`fn` runs on `state.replace(params=...)`), averages
    the gradients (and a `batch_stats` field) across devices as the strategy
    requires, and applies them with `apply_gradients` to the state `fn` returned
    (the state it got when it returned only logs).

    Logs come back reduced across devices: losses and metrics averaged, stateful
    metrics merged and computed, outputs concatenated. A stateful metric logged
    under the name of a state field holding one is merged into that field first,
    so the logged value is accumulated since the field was last reset.

    Use it as `@managed.train_step` or with options,
    `@managed.train_step(log_grad_norm=True)` / `managed.train_step(fn, ...)`.

    Args:
        fn: the step.
        log_grad_norm: also log the gradients' global norm
            (`optax.tree.norm`, formerly `optax.global_norm`, after averaging
            across devices) as the metric `grad_norm`.
        grads_fn: `grads_fn(grads)` or `grads_fn(grads, state)` -> logs or None,
            called inside the compiled step with the averaged gradients and the
            state `fn` returned (before the update); the logs it returns are
            added to the step's (e.g. per-layer norms). The step stays unchanged.
        steps_per_call: the steps a loop fuses into one compiled call (None or
            1: no fusing).
        fused_logs: what a fused call logs: `"all"` (default; the last step's
            values, and one history row per step with its real `steps` and
            `samples`) or `"mean"` (one row per call: losses and metrics
            averaged over the call's steps, stateful metrics as accumulated at
            its last step, outputs concatenated). A state with a `fused_logs`
            attribute (`create_flax_state(..., fused_logs=...)`) sets the
            default.

    Returns:
        A `ManagedStep` callable as `logs, state = step(state, batch[, elapsed])`,
        usable as a loop callback or spread with `**` into a task dict (or, with
        `fn` omitted, a decorator that makes one).

    Raises:
        TypeError: if `fn` or `grads_fn` is not a function of the right arity;
            (when called) if a loss is not a scalar or the return value has the
            wrong shape.
        ValueError: (when called) if `fn` logs no loss.

    Example:
        >>> import ciclo, jax.numpy as jnp, optax
        >>> from ciclo import managed
        >>> @managed.train_step(log_grad_norm=True)
        ... def fit(state, batch):
        ...     return ciclo.logs().add_loss("mse", jnp.mean((state.params * batch - 1) ** 2))
        >>> state = managed.ManagedState.create(params=jnp.zeros(()), tx=optax.sgd(0.1))
        >>> logs, state = fit(state, jnp.ones(4))
        >>> float(logs.losses.mse), float(logs.metrics.grad_norm), int(state.step)
        (1.0, 2.0, 1)

        Fused: 4 steps per compiled call, `elapsed` and history still per step:

        >>> fused = managed.train_step(fit.fn, steps_per_call=4)
        >>> _, history, elapsed = ciclo.loop(state, [jnp.ones(4)] * 10, {**fused})
        >>> elapsed.steps, history.collect("steps")[:5], len(history)
        (10, [0, 1, 2, 3, 4], 10)
    """
    options = dict(
        log_grad_norm=log_grad_norm,
        grads_fn=grads_fn,
        steps_per_call=steps_per_call,
        fused_logs=fused_logs,
    )
    if fn is None:
        return functools.partial(train_step, **options)
    return ManagedStep(fn, grad=True, **options)


def step(fn: UserStep) -> ManagedStep:
    """Makes `fn` a step that runs under the state's strategy, without gradients
    (evaluation, prediction, metric updates).

    `fn` takes `(state)`, `(state, batch)` or `(state, batch, elapsed)` and returns
    logs, a state, or `(logs, state)`. Logs are reduced across devices and
    stateful metrics accumulated into state fields of the same name, as in
    `train_step`. Never donates the state's buffers.

    Args:
        fn: the step.

    Returns:
        A `ManagedStep` callable as `logs, state = step(state, batch[, elapsed])`,
        usable as a loop callback or spread with `**` into a task dict.

    Raises:
        TypeError: if `fn` is not a function of one to three positional
            parameters; (when called) if its return value has the wrong shape.

    Example:
        >>> import ciclo, jax.numpy as jnp, optax
        >>> from ciclo import managed
        >>> @managed.step
        ... def evaluate(state, batch):
        ...     return ciclo.logs().add_metric("mean", jnp.mean(state.params * batch))
        >>> state = managed.ManagedState.create(params=jnp.ones(()), tx=optax.sgd(0.1))
        >>> logs, _ = evaluate(state, jnp.arange(4.0))
        >>> float(logs.metrics.mean)
        1.5
        >>> _, history, _ = ciclo.loop(state, [jnp.ones(2)] * 3, {**evaluate})
        >>> history.collect("mean")
        [1.0, 1.0, 1.0]
    """
    return ManagedStep(fn, grad=False)


def grad_logs(
    grads: Any, state: Any, log_grad_norm: bool, grads_fn: Callable[..., Any] | None
) -> Logs:
    """What a train step logs from its gradients: `grad_norm` (with
    `log_grad_norm`) and `grads_fn(grads[, state])`'s logs."""
    logs = Logs()
    if log_grad_norm:
        logs.add_metric("grad_norm", optax.tree.norm(grads))
    if grads_fn is not None:
        extra = inject(grads_fn, grads, state)
        if extra is not None:
            if not isinstance(extra, Mapping):
                raise TypeError(
                    f"grads_fn {describe(grads_fn)} returned a "
                    f"{type(extra).__name__}; expected logs (ciclo.logs()) or None."
                )
            logs.merge(extra)
    return logs
