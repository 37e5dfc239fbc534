"""ciclo: a functional training-loops library for JAX."""

from ciclo.time import Elapsed, Period, at, elapse
from ciclo.logs import Logs, logs
from ciclo.schedules.base import Schedule

# --- schedules (issue 2) ---
from ciclo.schedules import after, always, every, never, piecewise

# --- history and loop (issue 2) ---
from ciclo.history import History, history
from ciclo.loop import LoopState, loop
from ciclo import callbacks

# --- callbacks, predefined loops and named schedules (issue 3) ---

# --- managed API and strategies (issue 4) ---

# --- flax (issue 5) ---

__version__ = "0.2.0"
