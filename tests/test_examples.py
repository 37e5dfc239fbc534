"""Every example runs end to end with a small step count (CICLO_EXAMPLE_STEPS)."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("[0-9][0-9]_*.py")) + sorted(
    (ROOT / "examples" / "from_peers").glob("*.py")
)


def _env(**extra: str) -> dict:
    """The environment of a subprocess that imports the ciclo of this checkout."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path, **extra)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs(path, tmp_path):
    env = _env(CICLO_EXAMPLE_STEPS="30", CICLO_EXAMPLE_DIR=str(tmp_path))
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    result = subprocess.run(
        [sys.executable, str(path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]


def test_readme_loop_language_snippet_runs(tmp_path):
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## The loop language", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    result = subprocess.run(
        [sys.executable, "-c", code + "\nassert len(losses) == 200, len(losses)\n"],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "step 150:" in result.stdout


def test_readme_observability_snippet_runs(tmp_path):
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Observability", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "(100, 6)" in result.stdout
