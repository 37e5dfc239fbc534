"""`ManagedStep`: a step compiled per strategy and called as a loop callback.

A managed step is a callback like any other (`ciclo._loop.callback`): its function
takes `(state)`, `(state, batch)` or `(state, batch, elapsed)` and returns logs, a
state, or `(logs, state)`. Called with a batch, it runs one compiled step; with a
fused `ciclo.Steps`, the steps of the call in one compiled `scan`. What the
compiled step does with its logs is in `ciclo.managed._step_logs`; how its
arguments reach the device, in `ciclo.managed._placement`.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ciclo._entries import Entries
from ciclo._input.batch import Item, Steps, placed_for
from ciclo._logs import Logs
from ciclo._loop.callback import arity, describe, split_output
from ciclo._loop.state import Apply, LoopState, hand_over
from ciclo._shapes import ShapeWatch
from ciclo._short import short
from ciclo._strategies.base import Collectives, Strategy
from ciclo._strategies.jit import Jit
from ciclo._strategies.registry import get_strategy, strategy_of
from ciclo._time import Elapsed
from ciclo.callbacks._base import LoopElement
from ciclo.managed._flat import Flat, NotFlat, layout_of
from ciclo.managed._fused_steps import at_step, check_fused, fold
from ciclo.managed._placement import (
    as_logs,
    compiles,
    pack,
    plain_logs,
    unpack,
    unpacking,
)
from ciclo.managed._step_logs import (
    accumulate,
    batch_weight,
    grad_logs,
    reduce_logs,
    total_loss,
)

__all__ = ["GradsFn", "ManagedStep", "UserStep"]

UserStep = Callable[..., Any]
GradsFn = Callable[..., Any]

_FLATS_KEPT = 8  # flat calls kept per strategy (`ManagedStep._flat`)


class ManagedStep(LoopElement):
    """A step run under the state's strategy; build it with `train_step` or `step`.

    Call it as `logs, state = f(state)`, `f(state, batch)` or
    `f(state, batch, elapsed)` (the wrapped function gets the arguments it
    declares). It always returns `(logs, state)`. In a loop it is a callback; as a
    loop element, `{**f}` means `{ciclo.every(1): [f]}`. Used as a method of a
    `ManagedState` subclass, `state.f(batch)` works as well. The compiled function
    is cached per strategy.
    """

    compiles_per_shape = True  # the loop warns when its batches take many shapes

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
                f"{kind}: log_grad_norm must be True or False, got {short(log_grad_norm)}."
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
        # the function each compiled step compiles, and per strategy its flat
        # calls (`_flat`), each for a state class and its static fields, the
        # latest first, or None when the step's output is not flat
        self._steps: dict[Strategy, Callable[..., Any]] = {}
        self._flats: dict[Strategy, list[Flat] | None] = {}
        self._fused: dict[tuple[Strategy, str, bool], Callable[..., Any]] = {}
        self._in_flight: collections.deque[jax.Array] = collections.deque()
        # the strategy of the last unfused call, its compiled step and whether it
        # places batches as they are: the next call with the same object skips
        # the lookups
        self._last: tuple[Strategy, Callable[..., Any], bool] | None = None
        self._made: Logs | None = None  # the last logs `_call` built (`as_logs`)

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
        return self._run(state, batch, elapsed, None)

    def __loop_callback__(self, loop_state: LoopState) -> tuple[Logs, Any]:
        """In a loop: the batch's copy placed ahead by the input stage, if any,
        comes with the loop state (`loop_state.placed`)."""
        ls = loop_state
        state, batch, last = ls.state, ls.batch, self._last
        # a step that takes no `elapsed` does not have it built (`ls.elapsed`)
        elapsed = ls.elapsed if self._arity >= 3 else None
        if (
            last is not None
            and getattr(state, "strategy", None) is last[0]
            and type(batch) is not Steps
        ):  # the common step (`_run`'s first test, without its frame)
            out = self._call(last, state, batch, elapsed, ls.placed)
        else:
            out = self._run(state, batch, elapsed, ls.placed)
        if out[0] is self._made:  # built here from the compiled call's outputs
            if type(ls) is LoopState:  # `hand_over(ls, ...)`, written out
                ls._fresh = out[0]  # the loop's alone: merged into in place
            else:
                hand_over(ls, out[0])
        return out

    def _loop_runner(
        self, apply: Apply, watch: ShapeWatch | None, shown_as: str
    ) -> Callable[[LoopState], None] | None:
        """The loop's runner of this step (`ciclo._loop.runners.runner`): its
        common call (a batch's first logs, an unfused batch, the strategy object
        of the last call, the first output already checked by `apply`) in one
        frame, the compiled call's logs becoming the batch's and its state the
        loop's, as `apply` would make them; any other call goes through
        `__loop_callback__` and `apply`. None (the loop's general runner) for
        a subclass with its own `__loop_callback__`."""
        if type(self).__loop_callback__ is not ManagedStep.__loop_callback__:
            return None
        general, call = self.__loop_callback__, self._call
        new_logs = Logs.__new__
        new = object.__new__
        two = self._arity == 2  # (state, batch): no `elapsed` goes to the call
        simple = None  # the `last` whose call `run` makes itself: see below
        plain = None  # the last `last` whose call goes through `_call`
        # whether `simple`'s strategy has flat calls (`ciclo.managed._flat`),
        # the last one (for a state class and its static fields: `tx`,
        # `apply_fn`, `param_specs`, ...), or None; the state its last call
        # made (of that class, with those static fields)
        flattable, flat, rebuilt = False, None, None

        def run(ls: LoopState) -> None:
            nonlocal simple, plain, flattable, flat, rebuilt
            if watch is not None:
                batch, shapes = ls._shapes  # read by `Run` for this batch
                if shapes is not watch.last or batch is not ls.batch:  # else seen
                    watch(ls.batch, shown_as, shapes if batch is ls.batch else None)
            state, batch, last = ls.state, ls.batch, self._last
            if (
                last is None
                or not apply.checked
                or ls.logs
                or type(batch) is Steps
                or getattr(state, "strategy", None) is not last[0]
            ):
                out = general(ls)
                if out is not None:
                    apply(out, ls)
                return
            if last is not simple:
                # `_call`, written out below, for a step of (state, batch) under
                # a strategy that compiles its step and bounds no calls in flight
                strategy = last[0]
                if last is plain or not (
                    two and compiles(strategy) and strategy.max_in_flight is None
                ):
                    plain = last
                    logs, state = call(
                        last, state, batch, None if two else ls.elapsed, ls.placed
                    )
                    if logs is not self._made or not logs:  # not built for the loop
                        apply((logs, state), ls)
                        return
                    ls.logs = logs  # made for the loop alone (`Apply.fresh`)
                    ls.state = state
                    return
                simple, rebuilt = last, None
                flattable = type(strategy) is Jit  # (`_flat`)
                flat = self._flat(strategy, state)
            strategy, compiled, as_is = last
            placed = ls.placed  # `placed_for(ls.placed, strategy)`, written out
            if placed is not None and placed.strategy is strategy:
                batch = placed.placed  # read ahead and placed by the loop
            elif not as_is:
                batch = strategy.place_batch(batch)
            if state is rebuilt:  # made by the last call: the same static fields
                use_flat = True
            elif flattable:
                if flat is None or not flat.takes(state):
                    # another class or other static fields (a new optimizer)
                    flat = self._flat(strategy, state)
                    # None: this step has none under this strategy (its output
                    # is not flat, or the state's class has no `Layout`): not
                    # asked again each step
                    flattable = flat is not None
                use_flat = flattable
            else:
                use_flat = False
            if use_flat:  # its data fields in and out (`_flat`), the state rebuilt here
                fields = state.__dict__
                try:
                    result = flat.call(  # `flat.data(fields)`, written out
                        *map(fields.__getitem__, flat.layout.data), batch, None
                    )
                except NotFlat:  # (raised while traced: nothing ran)
                    self._flats[strategy] = flat = rebuilt = None
                    flattable = False
                    logs, state = compiled(state, batch, None)
                else:  # `flat.rebuild(fields, result)`, written out
                    logs = result[0]
                    state = rebuilt = new(flat.cls)
                    out = state.__dict__
                    out.update(fields)
                    out.update(zip(flat.changed, result[1:]))
            else:
                logs, state = compiled(state, batch, None)
            if type(logs) is not dict:  # not plain dicts (`plain_logs`)
                apply((logs, state), ls)
                return
            made = self._made = new_logs(Logs)  # `as_logs(logs)`, written out
            for name, entries in logs.items():
                made[name] = Entries(entries)
            if not made:
                apply((made, state), ls)
                return
            ls.logs = made  # made for the loop alone (`Apply.fresh`)
            ls.state = state

        return run

    def _flat(self, strategy: Strategy, state: Any) -> Flat | None:
        """The flat call of this step under `strategy` (`ciclo.managed._flat`)
        for states of `state`'s class with its static fields; None when there is
        none: a strategy other than `jit`'s own kind (whose `wrap` is not a
        plain `jax.jit`), a state whose class has no `Layout`, or a step whose
        output is not flat."""
        step = self._steps.get(strategy)
        if step is None or type(strategy) is not Jit:
            return None
        layout = layout_of(type(state))
        if layout is None:
            return None
        known = self._flats.get(strategy, ())
        if known is None:  # its output is not flat
            return None
        for i, flat in enumerate(known):
            if flat.takes(state):
                if i:  # the latest first: found first next time
                    known.insert(0, known.pop(i))
                return flat
        flat = Flat(step, state, layout, donate=strategy.donate and self.grad)
        # one per class and set of static fields seen lately (a run that
        # alternates optimizers compiles each once), as the state-in call's own
        # cache
        kept = self._flats[strategy] = [flat, *known]
        del kept[_FLATS_KEPT:]
        return flat

    def _run(
        self, state: Any, batch: Any, elapsed: Any, ahead: Item | None
    ) -> tuple[Logs, Any]:
        strategy = getattr(state, "strategy", None)
        last = self._last  # (the strategy object, its compiled step, as_is)
        if last is not None and strategy is last[0] and type(batch) is not Steps:
            # the common step: the same strategy object as the last call's
            return self._call(last, state, batch, elapsed, ahead)
        strategy = strategy_of(state)
        if strategy is None:
            if isinstance(getattr(state, "strategy", None), str):
                get_strategy(state.strategy)  # a name not registered: says so
            raise TypeError(
                f"{self!r} needs a ciclo.managed.ManagedState (a state with a "
                f"`strategy`), got {type(state).__name__}. Create it with "
                f"managed.ManagedState.create(params=..., tx=..., strategy='jit')."
            )
        if type(batch) is Steps:
            return self._call_fused(strategy, state, batch, elapsed, ahead)
        compiled = self._compiled.get(strategy)
        if compiled is None:
            if self.grad and not hasattr(state, "params"):
                raise TypeError(
                    f"{self!r} differentiates w.r.t. `state.params`, but the "
                    f"{type(state).__name__} it got has no `params`. Create the "
                    f"state with managed.ManagedState.create(params=..., tx=...)."
                )
            step = unpacking(self._build(strategy))
            if compiles(strategy):  # its logs come back as plain dicts
                step = plain_logs(step)
            self._steps[strategy] = step
            compiled = self._compiled[strategy] = strategy.wrap(
                step, donate=strategy.donate and self.grad
            )
        as_is = type(strategy).place_batch is Strategy.place_batch
        last = (strategy, compiled, as_is)
        if getattr(state, "strategy", None) is strategy:  # the object: remembered
            self._last = last
        return self._call(last, state, batch, elapsed, ahead)

    def _call(
        self,
        last: tuple[Strategy, Callable[..., Any], bool],
        state: Any,
        batch: Any,
        elapsed: Any,
        ahead: Item | None,
    ) -> tuple[Logs, Any]:
        """One compiled call of `last`'s step (see `_run`)."""
        strategy, compiled, as_is = last
        # `placed_for(ahead, strategy)`, written out
        placed = (
            None if ahead is None or ahead.strategy is not strategy else ahead.placed
        )
        if self._arity < 2:
            batch = None
        elif placed is not None:
            batch = placed  # read ahead and placed by the loop
        elif not as_is:
            batch = strategy.place_batch(batch)
        if self._arity < 3:
            elapsed = None
        elif type(elapsed) is Elapsed and compiles(strategy):
            elapsed = pack(elapsed)
        flat = self._flat(strategy, state)
        if flat is None:
            logs, state = compiled(state, batch, elapsed)
        else:  # its data fields in and out (`_flat`), the state rebuilt here
            fields = state.__dict__
            try:
                result = flat.call(*flat.data(fields), batch, elapsed)
            except NotFlat:  # (raised while traced: nothing ran)
                self._flats[strategy] = None
                logs, state = compiled(state, batch, elapsed)
            else:
                logs, state = result[0], flat.rebuild(fields, result)
        if type(logs) is dict:
            logs = self._made = as_logs(logs)
        if strategy.max_in_flight is not None:
            self._bound_in_flight(strategy.max_in_flight, logs, state)
        return logs, state

    def _call_fused(
        self,
        strategy: Strategy,
        state: Any,
        steps: Steps,
        elapsed: Any,
        ahead: Item | None,
    ) -> tuple[Logs, Any]:
        """Runs the `steps.n` steps of a fused batch in one compiled call."""
        mode = self.fused_logs or getattr(state, "fused_logs", None) or "all"
        # a strategy that places batches as they are (jit, eager) scans the leading
        # axis directly; the others place (B, n, ...) so they split the batch axis
        step_major = strategy.steps_major
        key = (strategy, mode, step_major)
        compiled = self._fused.get(key)
        if compiled is None:
            wrap = getattr(strategy, "wrap_steps", strategy.wrap)
            compiled = self._fused[key] = wrap(
                self._build_fused(strategy, mode, step_major),
                donate=strategy.donate and self.grad,
            )
        batch = None
        if self._arity >= 2:
            batch = placed_for(ahead, strategy)  # stacked and placed ahead
            if batch is None and steps.batch is not None:
                batch = strategy.place_steps(steps.batch)
        # only what the call uses goes to the device: the step indices when there
        # is no batch to count them, `elapsed` (packed) when the step takes it
        index = np.arange(steps.n, dtype=np.int32) if batch is None else None
        if self._arity < 3 or elapsed is None:
            elapsed = None
        else:
            per_step = steps.samples // steps.n if steps.n else 0
            elapsed = pack(elapsed, per_step)
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
                elapsed, (per_step,) = unpack(elapsed)
            if batch is not None and not step_major:
                batch = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), batch)
            if index is None:  # as many steps as the stacked batch's leading axis
                index = jnp.arange(jax.tree.leaves(batch)[0].shape[0], dtype=jnp.int32)

            def body(state, xs):
                i, b = xs
                e = None if elapsed is None else at_step(elapsed, i, per_step)
                logs, state = single(state, b, e)
                return state, logs

            state, stacked = jax.lax.scan(body, state, (index, batch))
            return fold(stacked, mode), state

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
        elif strategy_of(new_state) is None:
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
                logs, state = accumulate(logs, state)
                return reduce_logs(logs, collectives), state

            return run

        def train(state, batch, elapsed):
            def loss_fn(params):
                logs, new_state = self._call_user(
                    state.replace(params=params), batch, elapsed
                )
                return total_loss(logs, self.fn), (logs, new_state)

            grads, (logs, new_state) = jax.grad(loss_fn, has_aux=True)(state.params)
            mean_grads = getattr(collectives, "mean_grads", None)
            weight = batch_weight(logs)
            if mean_grads is None and weight is not None:
                # each device's gradient is of its slice's weighted mean: they
                # combine weighted by the slices' weights, as its logs do
                grads = collectives.weighted_mean(grads, weight)
            elif mean_grads is None:
                grads = collectives.mean(grads)
            else:  # e.g. kept in the parameters' sharding
                grads = mean_grads(grads, new_state)
            if getattr(new_state, "batch_stats", None) is not None:
                new_state = new_state.replace(
                    batch_stats=collectives.mean(new_state.batch_stats)
                )
            if self.log_grad_norm or self.grads_fn is not None:
                logs = Logs(logs).merge(self._grad_logs(grads, new_state))
            logs, new_state = accumulate(logs, new_state)
            new_state = new_state.apply_gradients(grads=grads)
            return reduce_logs(logs, collectives), new_state

        return train
