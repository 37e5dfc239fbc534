"""Notebooks (API.md §6, §11), through a real Jupyter kernel of this interpreter
(nbclient): `tqdm_bar` is tqdm's widget there (text when ipywidgets is missing, with
no warning), `keras_bar` redraws one line, `history.plot` as a cell's last
expression (or before `plt.show()`) displays one image, and re-running a finished
`resume=` cell says where it was restored from, pointing at the cell."""

from __future__ import annotations

import re

import pytest
from _notebook import ROOT, data, run_cells, run_notebook, text

pytestmark = pytest.mark.slow  # a kernel process (~10-20 s for all the cells)

WIDGET = "application/vnd.jupyter.widget-view+json"

SETUP = """
import sys
import numpy as np
import ciclo

def train_step(state, batch):
    return ciclo.logs().add_loss("loss", 1.0 / (state + 1)), state + 1

def train(*callbacks):
    return ciclo.train_loop(
        0, [np.zeros(2)] * 6, {ciclo.on_train_step: train_step},
        callbacks=list(callbacks))
"""
NO_IPYWIDGETS = """
sys.modules["ipywidgets"] = None  # as if it were not installed
try:
    train(ciclo.tqdm_bar(total=6))
finally:
    del sys.modules["ipywidgets"]
"""
TQDM = "state, history, elapsed = train(ciclo.tqdm_bar(total=6))"
KERAS = "_ = train(ciclo.keras_bar(total=6, interval=0))"
PLOT = 'history.plot("loss")'
PLOT_SHOW = """
import matplotlib.pyplot as plt
history.plot("loss")
plt.show()
"""
RESUME = """
def step(state, batch):
    return ciclo.logs().add_loss("loss", state["w"].sum()), {"w": state["w"] + 1}

state, history, elapsed = ciclo.train_loop(
    {"w": np.zeros(2)}, [np.zeros(2)] * 3, {ciclo.on_train_step: step},
    epochs=2, resume="ckpts/")
print("steps", elapsed.steps)
"""
CELLS = [SETUP, NO_IPYWIDGETS, TQDM, KERAS, PLOT, PLOT_SHOW, RESUME, RESUME]


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    with pytest.MonkeyPatch.context() as monkeypatch:
        return run_cells(CELLS, tmp_path_factory.mktemp("kernel"), monkeypatch)


def cell(outputs, source):
    return outputs[CELLS.index(source)]


def test_tqdm_bar_is_the_notebook_widget_in_a_kernel(outputs):
    out = cell(outputs, TQDM)
    assert data(out, WIDGET), out  # tqdm.notebook's progress widget
    assert "6/6" not in text(out, "stderr"), out  # not the text bar as well


def test_tqdm_bar_without_ipywidgets_is_a_text_bar_without_warning(outputs):
    out = cell(outputs, NO_IPYWIDGETS)
    assert not data(out, WIDGET), out
    err = text(out, "stderr")
    assert "6/6" in err, out
    assert "Warning" not in err and "IProgress" not in err, err


def test_keras_bar_redraws_one_line_in_a_kernel(outputs):
    written = text(cell(outputs, KERAS), "stdout")
    assert "1/6" in written and "6/6" in written, written  # drawn more than once
    assert "\r" in written, written  # in place
    assert written.count("\n") == 1 and written.endswith("\n"), repr(written)


def test_history_plot_displays_one_image_as_the_last_expression(outputs):
    out = cell(outputs, PLOT)
    assert len(data(out, "image/png")) == 1, out  # shown once, not twice


def test_history_plot_is_shown_by_plt_show(outputs):
    out = cell(outputs, PLOT_SHOW)
    assert len(data(out, "image/png")) == 1, out


def test_rerunning_a_finished_resume_cell_says_it_was_restored(outputs):
    first, again = outputs[-2], outputs[-1]
    assert "steps 6" in text(first, "stdout") and not text(first, "stderr"), first
    assert "steps 6" in text(again, "stdout"), again
    err = text(again, "stderr")
    assert "ckpts" in err and "step 6" in err, err
    assert "nothing" in err and "resume=False" in err, err
    assert "exhausted" not in err, err
    # the warning points at the cell (ipykernel's file for it), not into ciclo
    location = re.match(r"(.*):\d+: \w*Warning", err)
    assert location and "ipykernel" in location.group(1), err


def test_the_example_notebook_runs_in_a_kernel(tmp_path):
    # examples/notebook.ipynb: train with the widget bar, interrupted in step 30
    # (its stand-in for the stop button), continued from the epoch-end checkpoint
    # at step 22 to the end (66), the curves inline, then the finished run again
    nbformat = pytest.importorskip("nbformat", reason="needs ciclo[test] (nbformat)")
    notebook = nbformat.read(ROOT / "examples" / "notebook.ipynb", as_version=4)
    with pytest.MonkeyPatch.context() as monkeypatch:
        run_notebook(notebook, tmp_path, monkeypatch, timeout=300)
    outputs = [c.outputs for c in notebook.cells if c.cell_type == "code"]
    stdout = [text(o, "stdout") for o in outputs]
    assert "interrupted after 31 steps" in stdout[2], outputs[2]
    assert data(outputs[2], WIDGET), outputs[2]  # the bar is tqdm's widget
    accuracy = re.search(r"test accuracy after 66 steps: ([0-9.]+)", stdout[3])
    assert accuracy and float(accuracy.group(1)) > 0.8, outputs[3]
    assert len(data(outputs[4], "image/png")) == 1, outputs[4]  # the curves, once
    assert "still 66 steps" in stdout[5], outputs[5]
    assert "nothing left to train" in text(outputs[5], "stderr"), outputs[5]
    errors = [o for cell in outputs for o in cell if o["output_type"] == "error"]
    assert not errors, errors
