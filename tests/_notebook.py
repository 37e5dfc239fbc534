"""`run_cells` / `run_notebook`: execute code cells through a real Jupyter kernel
(nbclient) of this interpreter, importing the ciclo of this checkout; returns the
executed notebook, whose cells' `outputs` are what a notebook would show."""

from __future__ import annotations

import json
import os
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
KERNEL = "ciclo-tests"


def kernelspec(directory: pathlib.Path) -> pathlib.Path:
    """A kernelspec `ciclo-tests` under `directory/kernels`: this interpreter's
    ipykernel, with the checkout on PYTHONPATH; returns the JUPYTER_PATH entry."""
    spec = directory / "kernels" / KERNEL
    spec.mkdir(parents=True, exist_ok=True)
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    kernel = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "ciclo tests",
        "language": "python",
        "env": {"PYTHONPATH": path, "JAX_PLATFORMS": "cpu"},
    }
    (spec / "kernel.json").write_text(json.dumps(kernel))
    return directory


def run_notebook(notebook, cwd: pathlib.Path, monkeypatch, timeout: int = 120):
    """Executes `notebook` (an nbformat notebook) in a fresh kernel, in `cwd`."""
    nbformat = pytest.importorskip("nbformat", reason="needs ciclo[test] (nbformat)")
    nbclient = pytest.importorskip("nbclient", reason="needs ciclo[test] (nbclient)")
    pytest.importorskip("ipykernel", reason="needs ciclo[test] (ipykernel)")
    specs = kernelspec(cwd / ".jupyter")
    monkeypatch.setenv("JUPYTER_PATH", str(specs))
    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")  # no migration warning
    client = nbclient.NotebookClient(
        notebook,
        kernel_name=KERNEL,
        timeout=timeout,
        resources={"metadata": {"path": str(cwd)}},
    )
    client.execute()
    nbformat.validate(notebook)
    return notebook


def run_cells(cells: list[str], cwd: pathlib.Path, monkeypatch, timeout: int = 120):
    """Executes `cells` (code) in order in one fresh kernel; returns their outputs,
    one list per cell."""
    nbformat = pytest.importorskip("nbformat", reason="needs ciclo[test] (nbformat)")
    notebook = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(source) for source in cells]
    )
    run_notebook(notebook, cwd, monkeypatch, timeout)
    return [cell.outputs for cell in notebook.cells]


def text(outputs, name: str) -> str:
    """The text a cell wrote to `name` ("stdout" or "stderr")."""
    return "".join(
        o["text"] for o in outputs if o["output_type"] == "stream" and o["name"] == name
    )


def data(outputs, mime: str) -> list:
    """The `mime` payloads of a cell's displays and result, in order."""
    return [
        o["data"][mime]
        for o in outputs
        if o["output_type"] in ("display_data", "execute_result") and mime in o["data"]
    ]
