"""Test configuration: the helper modules of tests/ (`_*.py`) are workers and shared
models, not test or doctest modules; they are importable from every test folder
(`from _guard import ...` in tests/contract too)."""

import os
import sys

collect_ignore_glob = ["_*.py"]

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
