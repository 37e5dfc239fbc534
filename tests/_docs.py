"""The documentation pages as the tests read them: `README.md` and every
`docs/*.md` (a page added later is picked up), their fenced blocks, and how a
page's Python blocks are run — top to bottom, in one namespace, as a reader who
pastes them into one file would, with nothing defined beforehand.

The one convention (docs/development.md): a block fenced ```python runs, unless the
line before it is `<!-- docs: skip (the reason) -->`; every other fence (```text,
```bash, output, another library's code in ```text) is shown, never run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def pages() -> list[pathlib.Path]:
    """README.md, then every page of docs/ (read now, so new pages count)."""
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def page_name(page: pathlib.Path) -> str:
    """ "README.md", "docs/loop.md": the page's path in the checkout."""
    if page.is_relative_to(ROOT):
        return page.relative_to(ROOT).as_posix()
    return page.name


SKIP = re.compile(r"^[ \t]*<!--\s*docs:\s*skip(?P<why>[^>]*)-->[ \t]*$")
_OPEN = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^\s`]*)")


@dataclasses.dataclass
class Fence:
    line: int  # 1-based line of the opening fence
    info: str  # the language named after the fence ("" when none)
    code: str  # the block's text, dedented
    first_code_line: int  # 1-based line of the block's first line of code
    skip: str | None  # the reason given by a `<!-- docs: skip (...) -->` before it


def fences(text: str) -> list[Fence]:
    """Every fenced block of a Markdown text, in order."""
    lines = text.splitlines()
    out, i = [], 0
    while i < len(lines):
        match = _OPEN.match(lines[i])
        if match and match.group("fence")[0] == "`":
            # CommonMark: after a backtick fence, no backtick (``` ``x`` ``` is code)
            rest = lines[i][match.end("fence") :]
            match = None if "`" in rest else match
        if not match:
            i += 1
            continue
        fence = match.group("fence")
        close = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        end = i + 1
        while end < len(lines) and not close.match(lines[end]):
            end += 1
        before = i - 1
        while before >= 0 and not lines[before].strip():
            before -= 1
        skip = SKIP.match(lines[before]) if before >= 0 else None
        out.append(
            Fence(
                line=i + 1,
                info=match.group("info"),
                code=textwrap.dedent("\n".join(lines[i + 1 : end]) + "\n"),
                first_code_line=i + 2,
                skip=skip.group("why").strip() if skip else None,
            )
        )
        i = end + 1
    return out


def python_blocks(page: pathlib.Path) -> list[tuple[int, Fence]]:
    """The page's ```python blocks that run, in order, each with its number among
    the page's ```python blocks (1 is the first, skipped ones counted)."""
    blocks = [f for f in fences(page.read_text()) if f.info == "python"]
    return [(n, f) for n, f in enumerate(blocks, start=1) if f.skip is None]


_RUNNER = textwrap.dedent(
    """
    import json, sys, traceback
    page, blocks = json.loads(sys.stdin.read())
    namespace = {"__name__": "__main__"}
    for number, line, code in blocks:
        # padded so that a traceback gives the page's own line numbers
        source = "\\n" * (line - 1) + code
        try:
            exec(compile(source, page, "exec"), namespace)
        except BaseException:
            sys.stdout.flush()
            print(f"{page}: python block {number} (line {line}) failed:",
                  file=sys.stderr)
            traceback.print_exc()
            sys.exit(1)
    """
)


def run_page(page: pathlib.Path, cwd: pathlib.Path, name: str | None = None):
    """Runs the page's Python blocks top to bottom in a fresh interpreter whose
    working directory is `cwd`, with this checkout's ciclo importable and nothing
    else prepared; returns the finished process."""
    blocks = [
        (number, block.first_code_line, block.code)
        for number, block in python_blocks(page)
    ]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT), env.get("PYTHONPATH")])
    )
    env.pop("XLA_FLAGS", None)  # the page sees the machine's own devices
    env["TMPDIR"] = str(cwd)  # what a page puts in tempfile.mkdtemp() is cleaned up
    return subprocess.run(
        [sys.executable, "-c", _RUNNER],
        input=json.dumps([name or page_name(page), blocks]),
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
