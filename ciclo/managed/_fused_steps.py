"""Fused stepping's pieces outside the compiled call's driver: its options
(`steps_per_call`, `fused_logs`), the `elapsed` of each step inside the call, and
the call's logs folded from the per-step ones.
"""

from __future__ import annotations

from typing import Any

import einop
import jax
import jax.numpy as jnp

from ciclo._input.fused import check_steps
from ciclo._logs import OUTPUTS, STATEFUL_METRICS, Logs
from ciclo._short import short
from ciclo._time import Elapsed

__all__ = ["FUSED_LOGS", "at_step", "check_fused", "fold"]

FUSED_LOGS = ("all", "mean")


def check_fused(steps_per_call: Any, fused_logs: Any, where: str) -> None:
    """Validates the fused-execution options of a step or a state."""
    if steps_per_call is not None:
        check_steps(steps_per_call, where)
    if fused_logs is not None and fused_logs not in FUSED_LOGS:
        raise ValueError(
            f"{where}: fused_logs must be one of {FUSED_LOGS} (a history row per "
            f"fused step, or one row per call with the steps' mean), got "
            f"{short(fused_logs)}."
        )


def at_step(elapsed: Elapsed, i: Any, per_step: Any) -> Elapsed:
    """`elapsed` moved `i` steps (of `per_step` samples) on, inside a fused call."""
    e = object.__new__(Elapsed)
    e.__dict__.update(elapsed.__dict__)
    e.__dict__["steps"] = elapsed.steps + i
    e.__dict__["samples"] = elapsed.samples + i * per_step
    return e


def fold(stacked: Logs, mode: str) -> tuple[Logs, Logs | None]:
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
