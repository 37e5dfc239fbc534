"""History.plot, to_dict, to_pandas."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import ciclo


def make_history():
    def train_step(state, batch):
        logs = ciclo.logs().add_loss("loss", 1.0 / (state + 1), add_metric=True)
        return logs.add_metric("acc", state / 10), state + 1

    def eval_step(state, batch):
        return ciclo.logs().add_loss("loss", 0.5).add_metric("acc", 0.25)

    _, history, _ = ciclo.train_loop(
        0,
        [np.zeros(2)] * 6,
        {ciclo.on_train_step: train_step, ciclo.on_test_step: eval_step},
        test_dataset=lambda: [np.zeros(2)] * 2,
        epoch_duration=3,
    )
    return history


def test_plot_puts_train_and_test_on_one_axis_and_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib", reason="needs ciclo[plot] (matplotlib)")
    history = make_history()
    path = tmp_path / "curves.png"
    figure = history.plot("losses.loss", "acc", path=path)
    assert len(figure.axes) == 2
    loss_axis, acc_axis = figure.axes
    assert [line.get_label() for line in loss_axis.get_lines()] == ["loss", "loss_test"]
    assert [line.get_label() for line in acc_axis.get_lines()] == ["acc", "acc_test"]
    x, y = loss_axis.get_lines()[1].get_data()
    assert list(x) == [2, 5] and list(y) == [0.5, 0.5]  # steps on x
    assert loss_axis.get_xlabel() == "steps"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # without keys: every loss/metric, test series with their train one
    labels = [
        [line.get_label() for line in axis.get_lines()] for axis in history.plot().axes
    ]
    assert labels == [["loss", "loss_test"], ["acc", "acc_test"]]
    with pytest.raises(ValueError, match="never logged"):
        history.plot("nope")


def test_to_dict_and_to_pandas():
    history = make_history()
    columns = history.to_dict()
    assert list(columns["elapsed.steps"]) == list(range(6))
    np.testing.assert_allclose(columns["losses.loss"], history.collect("losses.loss"))
    test = columns["losses.loss_test"]
    assert np.isnan(test[0]) and test[2] == 0.5 and test[5] == 0.5
    pandas = pytest.importorskip("pandas")
    frame = history.to_pandas()
    assert isinstance(frame, pandas.DataFrame) and len(frame) == 6
    assert frame["metrics.acc_test"].notna().sum() == 2


def test_missing_matplotlib_and_pandas_say_what_to_install():
    code = (
        "import sys; sys.modules['matplotlib'] = None; sys.modules['pandas'] = None\n"
        "import ciclo\n"
        "h = ciclo.history(); h.commit(ciclo.Elapsed.create(), ciclo.logs().add_loss('l', 1.0))\n"
        "for f in (h.plot, h.to_pandas):\n"
        "    try:\n"
        "        f()\n"
        "    except ImportError as e:\n"
        "        print(e)\n"
    )
    import os

    root = os.path.dirname(os.path.dirname(os.path.abspath(ciclo.__file__)))
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=60,
    )
    assert "install ciclo[plot]" in result.stdout, result.stderr[-2000:]
    assert "needs pandas" in result.stdout


def test_plot_is_held_by_pyplot_so_plt_show_shows_it():
    pytest.importorskip("matplotlib", reason="needs ciclo[plot] (matplotlib)")
    import matplotlib.figure
    import matplotlib.pyplot as plt

    figure = make_history().plot("losses.loss")
    try:
        assert isinstance(figure, matplotlib.figure.Figure)  # the return contract
        assert figure.number in plt.get_fignums()  # what plt.show() shows
        assert plt.gcf() is figure
    finally:
        plt.close(figure)
