"""Every example runs end to end with a small step count (CICLO_EXAMPLE_STEPS)."""

import os
import pathlib
import re
import sys

import pytest
from _optional import run_or_skip

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("[0-9][0-9]_*.py")) + sorted(
    (ROOT / "examples" / "from_peers").glob("*.py")
)


def _env(**extra: str) -> dict:
    """The environment of a subprocess that imports the ciclo of this checkout."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path, **extra)


@pytest.mark.slow
@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs(path, tmp_path):
    env = _env(CICLO_EXAMPLE_STEPS="30", CICLO_EXAMPLE_DIR=str(tmp_path))
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    result = run_or_skip([sys.executable, str(path)], cwd=tmp_path, env=env)
    if path.stem == "01_simple":
        _check_01_simple_outputs(tmp_path, result.stdout, steps=30)


def _check_01_simple_outputs(directory, stdout, steps):
    """examples/01_simple.py writes, under CICLO_EXAMPLE_DIR, TensorBoard events
    (`01_simple_tb/`) and a learning-curve PNG (`01_simple_curve.png`), and prints
    where."""
    pytest.importorskip("tensorboard", reason="reading events needs tensorboard")
    pytest.importorskip("matplotlib", reason="needs ciclo[plot] (matplotlib)")
    from tensorboard.backend.event_processing.event_accumulator import (
        EventAccumulator,
    )

    tb, png = directory / "01_simple_tb", directory / "01_simple_curve.png"
    assert list(tb.glob("events.out.tfevents.*")), sorted(directory.iterdir())
    events = EventAccumulator(str(tb))
    events.Reload()
    assert {"loss", "accuracy"} <= set(events.Tags()["scalars"])
    # at the completed steps, as Keras/clu/Jaxloop (the history counts from 0)
    assert [e.step for e in events.Scalars("loss")] == list(range(1, steps + 1))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    height, width, _ = matplotlib.image.imread(png).shape
    assert height > 100 and width > 100
    assert f"tensorboard --logdir {tb}" in stdout
    assert f"learning curve: {png}" in stdout


def test_docs_loop_language_snippet_runs(tmp_path):
    page = (ROOT / "docs" / "loop.md").read_text()
    code = re.search(r"```python\n(.*?)```", page, re.S).group(1)
    check = "\nassert len(losses) == 200, len(losses)\n"
    result = run_or_skip([sys.executable, "-c", code + check], cwd=tmp_path, env=_env())
    assert "step 150:" in result.stdout


@pytest.mark.slow
def test_docs_observability_snippet_runs(tmp_path):
    page = (ROOT / "docs" / "observability.md").read_text()
    code = re.search(r"```python\n(.*?)```", page, re.S).group(1)
    result = run_or_skip([sys.executable, "-c", code], cwd=ROOT)
    assert "(100, 6)" in result.stdout
