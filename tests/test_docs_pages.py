"""The documentation (`README.md`, `docs/*.md`, `mkdocs.yml`) is tested as pages a
reader runs.

- Every page runs as pasted: its ```python blocks, top to bottom, in one fresh
  interpreter and one namespace, with nothing defined beforehand (no prelude): a
  page defines or imports everything it uses. The working directory is a temporary
  one, so what a page writes stays out of the checkout. A failure names the page,
  the block's number and its line. A block right after `<!-- docs: skip (why) -->`
  is not run, and the reason is required; code that is only shown (shell commands,
  output, another library's code) is fenced with another language (```text,
  ```bash), and a Python fence under another name (```py) is an error, since it
  would silently not run. (`tests/_docs.py` reads the pages.)
- The API reference (`docs/api.md`) has an entry for every public name of `ciclo`
  and `ciclo.managed`, read from their `__all__` now, so a name added later without
  an entry fails here.
- `mkdocs build --strict` passes (no broken link, no missing reference, no docstring
  griffe cannot read) and the built API page has an anchor for every public name.
  It needs the `[docs]` extra; without it that test is skipped (CI installs it).

The guides' hand-written signatures are checked in `tests/test_docs_signatures.py`.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest
from _docs import ROOT, fences, page_name, pages, python_blocks, run_page

import ciclo
from ciclo import managed

DOCS = ROOT / "docs"
PAGES = pages()
IDS = [page_name(p) for p in PAGES]


def test_the_site_has_its_pages():
    names = {p.name for p in DOCS.glob("*.md")}
    expected = {
        "index.md", "loop.md", "predefined.md", "callbacks.md", "resume.md",
        "observability.md", "managed.md", "scale-out.md", "flax.md",
        "performance.md", "migrating.md", "differences.md", "development.md",
        "api.md", "notebooks.md",
    }  # fmt: skip
    assert expected <= names, expected - names
    for page in PAGES:
        assert page.read_text().startswith("# "), (
            f"{page_name(page)} must start with '# Title'"
        )


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_skipped_blocks_say_why(page):
    text = page.read_text()
    for match in re.finditer(r"^[ \t]*<!--\s*(\w+):\s*skip([^>]*)-->", text, re.M):
        line = text[: match.start()].count("\n") + 1
        where = f"{page_name(page)}:{line}"
        assert match.group(1) == "docs", f"{where}: use <!-- docs: skip (why) -->"
        why = match.group(2).strip()
        assert why.startswith("(") and why.endswith(")") and len(why) > 4, (
            f"{where}: a skipped block needs its reason, <!-- docs: skip (why) -->"
        )
        after = text[match.end() :].lstrip()
        assert after.startswith("```python"), f"{where}: no ```python block follows"


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_python_is_fenced_as_python(page):
    """Code fenced ```py, ```python3, ```pycon, ... would be shown as Python but never
    run: a block runs as ```python or is shown as ```text."""
    for block in fences(page.read_text()):
        info = block.info.lower()
        assert info == "python" or not re.match(r"(i?py|python)", info), (
            f"{page_name(page)}:{block.line}: ```{block.info} is never run; fence "
            "code that runs as ```python (or put <!-- docs: skip (why) --> before "
            "it), and code only shown as ```text"
        )


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_the_page_runs_as_pasted(page, tmp_path):
    if not python_blocks(page):
        return  # nothing to run: a page of prose and tables
    result = run_page(page, tmp_path)
    failed = re.search(
        r"^.*: python block \d+ \(line \d+\) failed:$", result.stderr, re.M
    )
    assert result.returncode == 0, (
        (failed.group(0) if failed else f"{page_name(page)} failed")
        + "\n"
        + result.stdout[-2000:]
        + result.stderr[-6000:]
    )


def _page(tmp_path, text):
    path = tmp_path / "page.md"
    path.write_text(text)
    return path


def test_a_page_runs_without_any_prelude(tmp_path):
    """Nothing is defined before a page's first block (no stand-in `state`,
    `train_step`, `dataset`): a name the page does not define fails, named with
    its page, block and line."""
    page = _page(
        tmp_path,
        "# Page\n\n```python\nimport ciclo\n```\n\n```text\nnot run\n```\n\n"
        "<!-- docs: skip (shown only) -->\n```python\nraise SystemExit(3)\n```\n\n"
        "## Later\n\n```python\nprint(ciclo.every(1))\nstate\n```\n",
    )
    result = run_page(page, tmp_path, name="docs/page.md")
    assert result.returncode == 1, result.stderr
    assert "docs/page.md: python block 3 (line 19) failed" in result.stderr
    assert "NameError: name 'state' is not defined" in result.stderr
    assert 'File "docs/page.md", line 20' in result.stderr  # the page's own line


def test_a_page_is_one_namespace_run_in_order(tmp_path):
    """The blocks of all sections share one namespace, in page order, in a fresh
    interpreter whose working directory is the temporary one."""
    page = _page(
        tmp_path,
        "# Page\n\n```python\nsteps = [1]\n```\n\n## A\n\n- item\n\n"
        "    ```python\n    steps.append(2)\n    ```\n\n## B\n\n```python\n"
        "import os\nopen('written.txt', 'w').write(str(steps))\n"
        "print(os.getcwd(), steps)\n```\n",
    )
    workdir = tmp_path / "work"
    workdir.mkdir()
    result = run_page(page, workdir)
    assert result.returncode == 0, result.stderr
    assert (workdir / "written.txt").read_text() == "[1, 2]"


def _api_entries() -> set[str]:
    sources = [DOCS / "api.md", *sorted((DOCS / "api").glob("*.md"))]
    text = "\n".join(p.read_text() for p in sources if p.exists())
    return set(re.findall(r"^::: *([\w.]+) *$", text, re.M))


PUBLIC = [f"ciclo.{n}" for n in ciclo.__all__] + [
    f"ciclo.managed.{n}" for n in managed.__all__
]


def test_the_api_reference_has_an_entry_for_every_public_name():
    missing = [name for name in PUBLIC if name not in _api_entries()]
    assert not missing, f"docs/api.md has no '::: name' entry for {missing}"


def test_every_api_reference_entry_is_a_public_name():
    stale = sorted(_api_entries() - set(PUBLIC))
    assert not stale, f"docs/api.md documents names that are not public: {stale}"


def _has_docs_extra() -> bool:
    return all(
        importlib.util.find_spec(m) is not None
        for m in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")
    )


@pytest.mark.slow
@pytest.mark.skipif(
    not _has_docs_extra(), reason='needs the docs extra: pip install -e ".[docs]"'
)
def test_the_site_builds_strictly_with_every_public_name(tmp_path):
    # CI builds the site once with `mkdocs build --strict` and points here at it
    site = os.environ.get("CICLO_DOCS_SITE")
    if site is None:
        site = tmp_path / "site"
        env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "mkdocs",
                "build",
                "--strict",
                "--site-dir",
                str(site),
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    api = (pathlib.Path(site) / "api" / "index.html").read_text()
    missing = [name for name in PUBLIC if f'id="{name}"' not in api]
    assert not missing, f"the built API reference has no entry for {missing}"
    for page in sorted(DOCS.glob("*.md")):
        built = pathlib.Path(site) / ("" if page.name == "index.md" else page.stem)
        html = (built / "index.html").read_text()
        # Python-Markdown (unlike GitHub) needs 4-space indents and blank lines
        # around blocks nested in a list item; otherwise they become paragraph text
        for match in re.finditer(r"<p>(.*?)</p>", html, re.S):
            text = match.group(1)
            assert not re.search(r"(^|\n)\s*(- |```)|class=\"highlight\"", text), (
                f"docs/{page.name}: a list item or code block rendered as paragraph "
                f"text (indent nested blocks by 4, with blank lines): {text[:200]!r}"
            )
