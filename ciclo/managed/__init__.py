"""The managed API: `ManagedState`, `train_step` and `step` (see `ciclo.Strategy`)."""

from ciclo.managed._state import ManagedState
from ciclo.managed._steps import ManagedStep, step, train_step

__all__ = ["ManagedState", "ManagedStep", "step", "train_step"]
