"""Each extra installs everything the code that names it imports: here, that
`[examples]` covers every script in examples/ (its imports, and the optional
packages behind the ciclo features it uses), so the README's first command
(`pip install -e ".[examples]"` then an example) works in a fresh virtualenv.
.ci/run runs that command as written."""

from __future__ import annotations

import ast
import pathlib
import re
import sys
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").rglob("*.py"))

# import name -> distribution, where they differ
DISTRIBUTIONS = {"sklearn": "scikit-learn", "tensorboardX": "tensorboardX"}
# ciclo features (an attribute used in a script) -> the optional package they import
FEATURES = {
    "tensorboard": "tensorboardX",
    "wandb_logger": "wandb",
    "plot": "matplotlib",
    "to_pandas": "pandas",
}


def _names(requirements):
    return {re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0].lower() for r in requirements}


def needed(script: pathlib.Path) -> set[str]:
    tree = ast.parse(script.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module.split(".")[0])
        elif isinstance(node, ast.Attribute) and node.attr in FEATURES:
            out.add(FEATURES[node.attr])
    return {DISTRIBUTIONS.get(n, n).lower() for n in out}


def test_the_examples_extra_installs_what_every_example_imports():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    installed = _names(project["dependencies"]) | _names(
        project["optional-dependencies"]["examples"]
    )
    local = {p.stem for p in (ROOT / "examples").rglob("*.py")}
    missing = {}
    for script in EXAMPLES:
        third_party = {
            n for n in needed(script)
            if n not in sys.stdlib_module_names and n not in local and n != "ciclo"
        }  # fmt: skip
        # jax.numpy etc. come with jax; flax/optax/orbax are dependencies
        lacking = sorted(third_party - installed - {"jax"})
        if lacking:
            missing[str(script.relative_to(ROOT))] = lacking
    assert not missing, (
        f"pip install -e '.[examples]' misses what these examples import: {missing}; "
        f"add them to [project.optional-dependencies] examples."
    )


@pytest.mark.parametrize("script", ["01_simple.py"])
def test_the_main_example_uses_the_writer_and_plot_the_extra_must_cover(script):
    # the check above is not vacuous: the README's example needs both
    assert {"tensorboardx", "matplotlib"} <= needed(ROOT / "examples" / script)
