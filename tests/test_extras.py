"""Each extra installs everything the code that names it imports: here, that
`[examples]` covers every script and notebook in examples/ (its imports, the
optional packages behind the ciclo features it uses, and for a notebook a kernel
and the widget of `tqdm_bar`), so the README's first command
(`pip install -e ".[examples]"` then an example) works in a fresh virtualenv.
.ci/run runs that command as written."""

from __future__ import annotations

import ast
import json
import pathlib
import re
import sys
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").rglob("*.py")) + sorted(
    (ROOT / "examples").rglob("*.ipynb")
)

# import name -> distribution, where they differ
DISTRIBUTIONS = {"sklearn": "scikit-learn", "tensorboardX": "tensorboardX"}
# ciclo features (an attribute used in a script) -> the optional package they import
FEATURES = {
    "tensorboard": "tensorboardX",
    "wandb_logger": "wandb",
    "plot": "matplotlib",
    "to_pandas": "pandas",
}
# in a notebook: a kernel runs it, and tqdm_bar is the ipywidgets widget there
NOTEBOOK = {"ipykernel"}
NOTEBOOK_FEATURES = {"tqdm_bar": "ipywidgets"}


def _names(requirements):
    return {re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0].lower() for r in requirements}


def source(path: pathlib.Path) -> str:
    """A script's code, or a notebook's code cells (IPython magics left out)."""
    if path.suffix != ".ipynb":
        return path.read_text()
    cells = json.loads(path.read_text())["cells"]
    code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    lines = "\n".join(code).splitlines()
    return "\n".join(line for line in lines if not line.lstrip().startswith(("%", "!")))


def needed(script: pathlib.Path) -> set[str]:
    tree = ast.parse(source(script))
    notebook = script.suffix == ".ipynb"
    features = {**FEATURES, **(NOTEBOOK_FEATURES if notebook else {})}
    out = set(NOTEBOOK) if notebook else set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module.split(".")[0])
        elif isinstance(node, ast.Attribute) and node.attr in features:
            out.add(features[node.attr])
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


def test_the_notebook_needs_a_kernel_the_widget_and_plot_the_extra_must_cover():
    # the check above covers examples/notebook.ipynb: a kernel, tqdm_bar's widget
    # and matplotlib for history.plot, besides its imports
    assert {"ipykernel", "ipywidgets", "matplotlib", "scikit-learn"} <= needed(
        ROOT / "examples" / "notebook.ipynb"
    )
