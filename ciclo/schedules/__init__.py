"""Schedules: callables `elapsed -> bool` deciding when callbacks run."""

from ciclo.schedules.base import Schedule, fresh
