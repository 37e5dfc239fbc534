"""Test configuration: the helper modules of tests/ (`_*.py`) are workers and shared
models, not test or doctest modules."""

collect_ignore_glob = ["_*.py"]
