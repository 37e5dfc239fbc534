"""`lr_monitor`: logs the learning rate of an optax optimizer."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from ciclo._history import transfer
from ciclo._logs import METRICS, Logs, _new_logs
from ciclo._loop.callback import observer
from ciclo._loop.state import log_entry
from ciclo._short import short
from ciclo.callbacks._base import LoopElement

if TYPE_CHECKING:
    from ciclo._loop.state import LoopState

__all__ = ["lr_monitor"]

_BLOCK = 1024  # steps of a schedule computed in one compiled call


@functools.partial(jax.jit, static_argnums=0)
def _block(schedule: Callable[[Any], Any], steps: jax.Array) -> jax.Array:
    """`schedule` at each of `steps`, compiled once per schedule (jit's cache)."""
    return jnp.broadcast_to(jax.vmap(schedule)(steps), steps.shape)


class _Rates:
    """An optax schedule's values on the host, `_BLOCK` steps per compiled call.

    The block holding a step is computed (once, compiled) and copied to the host
    the first time a step of it is asked for; the next block is started then, so
    that it is on the host, without waiting, when the steps reach it. A step then
    costs a dict lookup. A schedule that cannot be traced (Python control flow on
    the step) is called op by op, as before."""

    def __init__(self, schedule: Callable[[Any], Any]):
        self.schedule = schedule
        self._traced = True
        # the current block's values (Python numbers) by step: `lookup(step)`, a
        # dict's `get` (None for a step outside the block)
        self.lookup: Callable[[int], Any] = {}.get
        # (first step, its block on its way to the host)
        self._next: tuple[int, transfer.Transfer] | None = None

    def __call__(self, step: int) -> Any:
        value = self.lookup(step)
        if value is not None:
            return value
        if not self._traced:
            return self.schedule(step)
        first = step - step % _BLOCK
        try:
            ahead = self._next
            started = ahead[1] if ahead and ahead[0] == first else self._start(first)
            (host,) = started.result()[0]  # computed ahead: copied, not waited for
            if host is None:
                raise ValueError("the schedule's values could not be read")
            values = np.asarray(host).tolist()
            self._next = (first + _BLOCK, self._start(first + _BLOCK))
        except Exception:  # not traceable: op by op from now on
            self._traced, self._next, self.lookup = False, None, {}.get
            return self.schedule(step)
        self.lookup = dict(zip(range(first, first + _BLOCK), values)).get
        return values[step - first]

    def _start(self, first: int) -> transfer.Transfer:
        """The block from step `first`, computed and on its way to the host
        (through the history's transfer module, ciclo's one device-to-host path)."""
        steps = jax.device_put(np.arange(first, first + _BLOCK, dtype=np.int32))
        return transfer.start([[_block(self.schedule, steps)]])


def _has_hyperparams(node: Any) -> bool:
    hyperparams = getattr(node, "hyperparams", None)
    return isinstance(hyperparams, dict)


class lr_monitor(LoopElement):
    """Logs the learning rate as a metric (`"learning_rate"` by default).

    Without `schedule`, the value is read from the optimizer state of an optax
    optimizer wrapped in `optax.inject_hyperparams`: the state's `opt_state` (or
    the state itself when it has none) is searched for an
    `InjectHyperparamsState` whose `hyperparams` has the key `hyperparam`; after a
    train step it holds the learning rate that step used. With `schedule` (an optax
    schedule, `step -> learning rate`), it logs `schedule(elapsed.steps)`, the
    rate of the current step (optax counts updates from 0, as `elapsed.steps`),
    compiled once and computed 1024 steps at a time ahead of the loop, so a step
    costs a lookup (the value is the compiled schedule's, as the optimizer computes
    it inside the step: within float32 rounding of an op-by-op call). Either way
    nothing waits for the device: the optimizer state's value is a device array
    logged as is, which writers and bars read lagged.

    Either form logs, at step `k`, the rate step `k` used. In
    `ciclo.train_loop(callbacks=[...])` it runs on `on_train_batch_end`, after the
    train step however that is scheduled (`ciclo.on_train_step`, the ordinary
    `{ciclo.every(1): train_step}`, a spread `{**managed_step}`), so it never reads
    the optimizer state from before the update; there it runs before the other
    `callbacks` objects, so the writers and bars beside it show it in the same
    step whatever their order in `callbacks`. In
    `ciclo.loop` put it after the train step (`{ciclo.every(1): [train_step,
    ciclo.lr_monitor()], **writer}`). By hand: `logs = lr(state, elapsed)`, with the
    state after the step.

    Args:
        schedule: an optax schedule `step -> learning rate`; None reads the
            optimizer state.
        name: the metric's name.
        hyperparam: the key of the injected hyperparameter to read.

    Raises:
        TypeError: if `schedule` is not callable.
        ValueError: (when called) if no `inject_hyperparams` state holding
            `hyperparam` is found in the state.

    Example:
        >>> import jax.numpy as jnp, optax, ciclo
        >>> schedule = optax.linear_schedule(1.0, 0.0, transition_steps=4)
        >>> tx = optax.inject_hyperparams(optax.sgd)(learning_rate=schedule)
        >>> params = jnp.zeros(2)
        >>> def train_step(state):
        ...     params, opt_state = state
        ...     updates, opt_state = tx.update(jnp.ones(2), opt_state, params)
        ...     return None, (params + updates, opt_state)
        >>> state = (params, tx.init(params))  # or anything with an `opt_state`
        >>> _, history, _ = ciclo.loop(
        ...     state, range(4), {ciclo.every(1): [train_step, ciclo.lr_monitor()]})
        >>> [round(float(v), 2) for v in history.collect("learning_rate")]
        [1.0, 0.75, 0.5, 0.25]
    """

    reads_batch = False  # its hooks never read the loop's batch

    def __init__(
        self,
        schedule: Callable[[Any], Any] | None = None,
        *,
        name: str = "learning_rate",
        hyperparam: str = "learning_rate",
    ):
        if schedule is not None and not callable(schedule):
            raise TypeError(
                f"lr_monitor: `schedule` must be an optax schedule step -> learning "
                f"rate, got {short(schedule)} ({type(schedule).__name__})."
            )
        if not isinstance(name, str) or not name:
            raise TypeError(f"lr_monitor: `name` must be a string, got {short(name)}.")
        self.schedule = schedule
        self._rates = None if schedule is None else _Rates(schedule)
        self.name = name
        self.hyperparam = hyperparam
        self._index: int | None = None  # the found state's position among the leaves

    # registers before the other `callbacks` objects (the writers that read it)
    __loop_register_first__ = True

    @property
    def on_train_batch_end(self) -> lr_monitor:
        """The monitor itself: in `train_loop` it runs at the end of each batch,
        after the train step, whatever schedule runs that."""
        return self

    def learning_rate(self, state: Any, elapsed: Any = None) -> Any:
        """The learning rate for `state` (and `elapsed`, with a `schedule`)."""
        if self.schedule is not None:
            if elapsed is None:
                raise ValueError("lr_monitor: a `schedule` needs `elapsed`.")
            return self._rates(int(elapsed.steps))
        opt_state = getattr(state, "opt_state", state)
        leaves = jax.tree_util.tree_leaves(opt_state, is_leaf=_has_hyperparams)
        index = self._index
        if index is None or index >= len(leaves) or not _has_hyperparams(leaves[index]):
            index = self._index = self._find(leaves)
        return leaves[index].hyperparams[self.hyperparam]

    def _find(self, leaves: list[Any]) -> int:
        for i, leaf in enumerate(leaves):
            if _has_hyperparams(leaf) and self.hyperparam in leaf.hyperparams:
                return i
        raise ValueError(
            f"lr_monitor: found no optax.inject_hyperparams state with "
            f"hyperparams[{self.hyperparam!r}] in the state's `opt_state`. Build the "
            f"optimizer as optax.inject_hyperparams(optax.adam)(learning_rate=...), "
            f"or pass the schedule: ciclo.lr_monitor(schedule)."
        )

    def __call__(self, state: Any, elapsed: Any = None) -> Logs:
        """The logs `{"metrics": {name: learning rate}}` for `state`."""
        return _new_logs(Logs).add_metric(self.name, self.learning_rate(state, elapsed))

    @observer
    def __loop_callback__(self, loop_state: LoopState) -> None:
        # the value joins the batch's logs in place (no Logs of its own to merge)
        rates = self._rates
        if rates is None:  # the optimizer state's value
            value = self.learning_rate(loop_state.state)
        else:  # the schedule's value: a lookup in its block
            step = loop_state.elapsed.steps
            value = rates.lookup(step)
            if value is None:  # the first step of a block
                value = rates(int(step))
        log_entry(loop_state, METRICS, self.name, value)
