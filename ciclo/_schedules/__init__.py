"""Schedules: callables `elapsed -> bool` deciding when callbacks run."""

from ciclo._schedules.after import After, AfterEvery, after
from ciclo._schedules.base import Schedule, ScheduleLike, fresh
from ciclo._schedules.constant import Always, Never, always, never
from ciclo._schedules.every import Every, every
from ciclo._schedules.piecewise import Piecewise, piecewise

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
