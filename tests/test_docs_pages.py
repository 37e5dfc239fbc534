"""The documentation site (`docs/`, `mkdocs.yml`) is tested like the README.

- Every ```python block of `docs/*.md` runs, as a reader would paste it: the blocks
  of one `##` section run in order in one namespace (the text before the first
  `##` is a section too), starting from the README test's prelude (stand-ins for
  `state`, `train_step`, `dataset`, ...). A block right after
  `<!-- docs: skip (why) -->` is not run, and the reason is required.
- The API reference (`docs/api.md`) has an entry for every public name of `ciclo`
  and `ciclo.managed`, read from their `__all__` now, so a name added later without
  an entry fails here.
- `mkdocs build --strict` passes (no broken link, no missing reference, no docstring
  griffe cannot read) and the built API page has an anchor for every public name.
  It needs the `[docs]` extra; without it that test is skipped (CI installs it).
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest
from _optional import run_or_skip
from test_readme import _PRELUDE

import ciclo
from ciclo import managed

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))

_BLOCK = re.compile(
    r"(<!-- docs: skip(?P<why>[^>]*)-->\s*)?```python\n(?P<code>.*?)```", re.S
)


def _sections(page: pathlib.Path) -> list[tuple[str, list[tuple[int, str]]]]:
    """[(section title, [(line, code), ...]), ...] of the blocks that run."""
    text = page.read_text()
    out, offset = [], 0
    for section in re.split(r"\n(?=## )", text):
        start = text.index(section, offset)
        offset = start + len(section)
        blocks = []
        for match in _BLOCK.finditer(section):
            if match.group("why") is None:
                line = text[: start + match.start("code")].count("\n")
                blocks.append((line, match.group("code")))
        if blocks:
            out.append((section.splitlines()[0], blocks))
    return out


_RUNNER = textwrap.dedent(
    """
    import json, sys, textwrap, traceback
    page, prelude, sections = json.loads(sys.stdin.read())
    for title, blocks in sections:
        namespace = {"__name__": "__docs__"}
        exec(prelude, namespace)
        for line, code in blocks:
            try:
                exec(compile(textwrap.dedent(code), f"{page}:{line}", "exec"), namespace)
            except BaseException:
                print(f"{page}: block at line {line} ({title}) failed:", file=sys.stderr)
                traceback.print_exc()
                sys.exit(1)
    """
)


def test_the_site_has_its_pages():
    names = {p.name for p in PAGES}
    expected = {
        "index.md", "loop.md", "predefined.md", "callbacks.md", "resume.md",
        "observability.md", "managed.md", "scale-out.md", "flax.md",
        "performance.md", "migrating.md", "differences.md", "development.md",
        "api.md", "notebooks.md",
    }  # fmt: skip
    assert expected <= names, expected - names
    for page in PAGES:
        assert page.read_text().startswith("# "), (
            f"{page.name} must start with '# Title'"
        )


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_skipped_blocks_say_why(page):
    text = page.read_text()
    for match in re.finditer(r"^[ \t]*<!--\s*(\w+):\s*skip([^>]*)-->", text, re.M):
        line = text[: match.start()].count("\n") + 1
        assert match.group(1) == "docs", (
            f"{page.name}:{line}: use <!-- docs: skip (why) -->"
        )
        why = match.group(2).strip()
        assert why.startswith("(") and why.endswith(")") and len(why) > 4, (
            f"{page.name}:{line}: a skipped block needs its reason, "
            "<!-- docs: skip (why) -->"
        )
        after = text[match.end() :].lstrip()
        assert after.startswith("```python"), (
            f"{page.name}:{line}: no python block follows"
        )


RUNNABLE = [p for p in PAGES if _sections(p)]


@pytest.mark.parametrize("page", RUNNABLE, ids=[p.name for p in RUNNABLE])
def test_docs_page_python_blocks_run(page, tmp_path):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1")
    env["CICLO_EXAMPLE_STEPS"] = "20"
    env["WANDB_MODE"] = "offline"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    run_or_skip(
        [sys.executable, "-c", _RUNNER],
        cwd=tmp_path,
        env=env,
        input=json.dumps([f"docs/{page.name}", _PRELUDE, _sections(page)]),
    )


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
    for page in PAGES:
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
