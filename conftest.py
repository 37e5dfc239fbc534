"""Root test configuration: the docstring examples (`--doctest-modules` over
`ciclo/`) of the optional integrations skip, with the package named, where that
package is not installed (CI installs `ciclo[test]`, which has them all)."""

from __future__ import annotations

import importlib.util

import pytest

# doctest item name (a prefix) -> the package its example needs
_DOCTEST_NEEDS = {
    "ciclo._history.history.History.plot": "matplotlib",
    "ciclo._history.history.History.to_pandas": "pandas",
    "ciclo._history.plot": "matplotlib",
    "ciclo.callbacks._tensorboard": "tensorboardX",
    "ciclo.callbacks._wandb": "wandb",
}


def _installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a parent missing, or blocked in sys.modules
        return False


def pytest_collection_modifyitems(config, items):
    for item in items:
        if not isinstance(item, pytest.DoctestItem):
            continue
        for prefix, package in _DOCTEST_NEEDS.items():
            if item.name.startswith(prefix) and not _installed(package):
                item.add_marker(pytest.mark.skip(reason=f"{package} is not installed"))
