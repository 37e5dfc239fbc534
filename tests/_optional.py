"""`skip_if_optional_missing`: a subprocess (an example script) that failed only
because an optional package is not installed skips its test, with the package
named, instead of failing. CI installs `ciclo[test]`, which has them all, so there
they run. (The documentation pages never skip: tests/test_docs_pages.py.)"""

from __future__ import annotations

import re
import subprocess

import pytest

# the packages ciclo's extras (and the examples) add to the core dependencies
OPTIONAL = (
    "clu",
    "keras",
    "matplotlib",
    "pandas",
    "sklearn",
    "tensorboard",
    "tensorboardX",
    "wandb",
)

_CICLO = re.compile(r"needs the optional dependency '([^']+)'[^\n]*")
_PYTHON = re.compile(r"No module named '([^'.]+)")


def skip_if_optional_missing(returncode: int, stderr: str) -> None:
    """Skips the test when the failure (`returncode` != 0) is a missing optional
    package, i.e. ciclo's "install ciclo[...]" error or a ModuleNotFoundError of
    one of `OPTIONAL`; anything else is left to the test's own assertion."""
    if returncode == 0:
        return
    found = _CICLO.search(stderr)
    if found:
        pytest.skip(f"optional dependency not installed: {found.group(0)}")
    found = _PYTHON.search(stderr)
    if found and found.group(1) in OPTIONAL:
        pytest.skip(f"optional dependency not installed: {found.group(1)}")


def run_or_skip(
    args: list[str], *, cwd, env: dict | None = None, input: str | None = None
) -> subprocess.CompletedProcess:
    """Runs a script (an example) in a subprocess: skips the
    test when it failed only on a missing optional package, else asserts it ran."""
    result = subprocess.run(
        args, input=input, cwd=cwd, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    skip_if_optional_missing(result.returncode, result.stderr)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result
