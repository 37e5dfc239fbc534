"""Schedules: callables `elapsed -> bool` deciding when callbacks run."""

from ciclo.schedules.after import After, AfterEvery, after
from ciclo.schedules.base import Schedule, ScheduleLike, fresh
from ciclo.schedules.constant import Always, Never, always, never
from ciclo.schedules.every import Every, every
from ciclo.schedules.piecewise import Piecewise, piecewise

__all__ = [
    "After",
    "AfterEvery",
    "Always",
    "Every",
    "Never",
    "Piecewise",
    "Schedule",
    "ScheduleLike",
    "after",
    "always",
    "every",
    "fresh",
    "never",
    "piecewise",
]
