"""The signatures written by hand in the guides match the code.

A written signature is `ciclo.name(parameters)` (or `managed.name(...)`,
`ciclo.managed.name(...)`) that starts a line or a list item — as an inline code
span, possibly bold, or in a ```text block (`state, history, elapsed =
ciclo.loop(...)` too) — and whose parentheses read as a parameter list
(`def f(parameters)` parses). A trailing `...` elides the remaining parameters.
Each is compared with `inspect.signature` of the real object: names, order, kinds
(positional, keyword-only after `*`, `*args`, `**kwargs`) and defaults.
Calls in running text (`ciclo.checkpoint(dir, items=["params"])`) and in ```python
blocks (which run, see test_docs_pages.py) are not signatures.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import re

import pytest
from _docs import fences, page_name, pages

import ciclo

Kind = inspect.Parameter
_MISSING = object()


@dataclasses.dataclass
class Written:
    page: str
    line: int
    name: str  # as written: "ciclo.checkpoint", "managed.train_step", ...
    params: str  # the text between the parentheses

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}:{self.name}"


_NAME = r"(?P<name>(?:ciclo|managed)(?:\.\w+)+)\("
# in prose: a paragraph or list item that starts with the code span (bold or not)
_PROSE = re.compile(rf"^[ \t]*(?P<item>(?:[-*+]|\d+\.)[ \t]+)?(?:\*\*)?`{_NAME}")
# in a ```text block: a line that starts with the name (`a, b = ` before it allowed)
_BLOCK = re.compile(rf"^[ \t]*(?:[\w, ]+=[ \t]*)?{_NAME}")


def _closing(text: str, start: int) -> int | None:
    depth = 0
    for i in range(start, len(text)):
        if text[i] in "([{":
            depth += 1
        elif text[i] in ")]}":
            depth -= 1
            if depth == 0:
                return i
    return None


def _split_elision(params: str) -> tuple[str, bool]:
    """('a, *, b=None', True) for 'a, *, b=None, ...'."""
    stripped = " ".join(params.split()).rstrip(", ")
    if stripped == "..." or stripped.endswith(", ..."):
        return stripped[:-3].rstrip(", "), True
    return stripped, False


def _parse(params: str) -> ast.arguments | None:
    try:
        tree = ast.parse(f"def f({_split_elision(params)[0]}): pass")
    except SyntaxError:
        return None
    return tree.body[0].args


def _literal_defaults(args: ast.arguments) -> bool:
    defaults = [*args.defaults, *(d for d in args.kw_defaults if d is not None)]
    try:
        for default in defaults:
            ast.literal_eval(default)
    except ValueError:
        return False  # `callbacks=[bar]`: a call's argument, not a default
    return True


def written_signatures(text: str, page: str) -> list[Written]:
    """The signatures written in a Markdown text (see the module's docstring)."""
    lines = text.splitlines(keepends=True)
    in_block = [False] * len(lines)  # True: a line of a non-python fence
    for block in fences(text):
        end = min(block.first_code_line - 1 + block.code.count("\n"), len(lines))
        for i in range(block.line - 1, end + 1 if end < len(lines) else end):
            in_block[i] = None if block.info == "python" else True
        in_block[block.line - 1] = None  # the fence line itself
        if end < len(lines):
            in_block[end] = None
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    out = []
    for i, line in enumerate(lines):
        if in_block[i] is None:
            continue  # a fence line or a python block (code that runs)
        if in_block[i]:
            match = _BLOCK.match(line)
        else:
            match = _PROSE.match(line)
            previous = lines[i - 1].strip() if i else ""
            if (
                match
                and not match.group("item")
                and previous
                and not previous.startswith("#")
            ):
                continue  # a call that a wrapped sentence happens to start with
        if not match:
            continue
        opening = offsets[i] + match.end() - 1
        end = _closing(text, opening)
        if end is None or text[end + 1 : end + 2] == "(":
            continue  # unbalanced, or `ciclo.inject(f)(*args)`: a call's result called
        params = text[opening + 1 : end]
        args = _parse(params)
        if args is None or not params.strip() or not _literal_defaults(args):
            continue  # a call such as `ciclo.every(1)` or `ciclo.logs()`
        out.append(Written(page, i + 1, match.group("name"), params))
    return out


def all_written_signatures() -> list[Written]:
    return [
        sig
        for page in pages()
        for sig in written_signatures(page.read_text(), page_name(page))
    ]


def _resolve(name: str):
    parts = name.split(".")
    obj = ciclo.managed if parts[0] == "managed" else ciclo
    for part in parts[1:]:
        obj = getattr(obj, part)
    return obj


@dataclasses.dataclass(frozen=True)
class Param:
    name: str
    kind: inspect._ParameterKind
    default: object = _MISSING  # a value, or the default's source when not literal

    def render(self) -> str:
        prefix = {Kind.VAR_POSITIONAL: "*", Kind.VAR_KEYWORD: "**"}.get(self.kind, "")
        shown = f"{prefix}{self.name}"
        if self.default is not _MISSING:
            shown += f"={self.default!r}"
        return f"{shown}  ({self.kind.description})"


def _literal(source: str):
    try:
        return ast.literal_eval(source)
    except (ValueError, SyntaxError):
        return source


def written_params(params: str) -> tuple[list[Param], bool]:
    args = _parse(params)
    elided = _split_elision(params)[1]
    out: list[Param] = []
    positional = [*args.posonlyargs, *args.args]
    defaults = [_MISSING] * (len(positional) - len(args.defaults)) + [
        _literal(ast.unparse(d)) for d in args.defaults
    ]
    for i, (arg, default) in enumerate(zip(positional, defaults)):
        kind = (
            Kind.POSITIONAL_ONLY
            if i < len(args.posonlyargs)
            else Kind.POSITIONAL_OR_KEYWORD
        )
        out.append(Param(arg.arg, kind, default))
    if args.vararg:
        out.append(Param(args.vararg.arg, Kind.VAR_POSITIONAL))
    for arg, default in zip(args.kwonlyargs, args.kw_defaults):
        value = _MISSING if default is None else _literal(ast.unparse(default))
        out.append(Param(arg.arg, Kind.KEYWORD_ONLY, value))
    if args.kwarg:
        out.append(Param(args.kwarg.arg, Kind.VAR_KEYWORD))
    return out, elided


def real_params(obj) -> list[Param]:
    return [
        Param(p.name, p.kind, _MISSING if p.default is p.empty else p.default)
        for p in inspect.signature(obj).parameters.values()
    ]


def _same(a: Param, b: Param) -> bool:
    if (a.name, a.kind) != (b.name, b.kind):
        return False
    if a.default is _MISSING or b.default is _MISSING:
        return a.default is b.default
    if isinstance(a.default, bool) != isinstance(b.default, bool):
        return False
    if isinstance(a.default, str) and not isinstance(b.default, str):
        return a.default == repr(b.default)  # a default written as an expression
    try:
        return bool(a.default == b.default)
    except Exception:
        return False


def signature_diff(written: Written, obj) -> str | None:
    """None when the written signature matches `obj`'s, else a readable diff."""
    params, elided = written_params(written.params)
    real = real_params(obj)
    compared = real[: len(params)] if elided else real
    if len(params) == len(compared) and all(map(_same, params, compared)):
        return None
    diff = difflib.unified_diff(
        [p.render() for p in params] + (["..."] if elided else []),
        [p.render() for p in compared] + (["..."] if elided else []),
        fromfile=f"{written.page}:{written.line} (as written)",
        tofile=f"{written.name}{inspect.signature(obj)} (the code)",
        lineterm="",
    )
    return (
        f"{written.page}:{written.line}: the signature written for {written.name} "
        "differs from the code:\n" + "\n".join(diff)
    )


SIGNATURES = all_written_signatures()


def test_the_guides_signatures_are_found():
    """The scan finds the guides' signatures (so it cannot pass by finding none)."""
    found = {sig.name for sig in SIGNATURES}
    expected = {
        f"ciclo.{name}"
        for name in (
            "at", "elapse", "loop", "keras_bar", "tqdm_bar", "checkpoint",
            "restore", "inner_loop", "early_stopping", "tensorboard", "csv_logger",
            "jsonl_logger", "wandb_logger", "lr_monitor", "nan_guard", "profiler",
            "sharded",
        )
    }  # fmt: skip
    assert expected <= found, f"no written signature found for {expected - found}"
    calls = {sig.params for sig in SIGNATURES if sig.name == "ciclo.checkpoint"}
    assert not any('"params"' in c for c in calls), "a call taken for a signature"


@pytest.mark.parametrize("written", SIGNATURES, ids=[s.id for s in SIGNATURES])
def test_the_written_signature_matches_the_code(written):
    try:
        obj = _resolve(written.name)
    except AttributeError:
        pytest.fail(f"{written.page}:{written.line}: {written.name} does not exist")
    real = inspect.signature(obj)
    if written.name == "ciclo.csv_logger" and any(
        p.kind is Kind.VAR_KEYWORD for p in real.parameters.values()
    ):
        # csv_logger's parameters are forwarded through **kwargs, so the code does
        # not show them to compare with; once it spells them out, this compares
        pytest.skip(f"ciclo.csv_logger introspects as {real}: nothing to compare")
    diff = signature_diff(written, obj)
    assert diff is None, diff


def _diff(text: str) -> str | None:
    (written,) = written_signatures(text, "docs/page.md")
    return signature_diff(written, _resolve(written.name))


def test_a_drifted_signature_fails_with_a_diff():
    # what the guides said before: `items` missing
    diff = _diff(
        '`ciclo.checkpoint(directory, *, monitor=None, mode="min", keep=1, '
        "async_save=True, resume=False)`\n"
    )
    assert diff is not None and "docs/page.md:1" in diff
    assert "+items=None  (keyword-only)" in diff
    # a wrong kind, a wrong default, a missing `*`, a parameter out of place
    diff = _diff(
        "- `ciclo.elapse(dataset, *, stop=None, initial=None, batch_size_fn=None)`"
    )
    assert "-stop=None  (keyword-only)" in diff
    assert "+stop=None  (positional or keyword)" in diff
    diff = _diff(
        '**`ciclo.early_stopping(monitor, patience, *, min_delta=1, mode="min", '
        "baseline=None, restore_best_weights=False)`**"
    )
    assert "-min_delta=1  (keyword-only)" in diff and "+min_delta=0.0" in diff
    diff = _diff("`ciclo.at(steps=None, samples=None, time=None, date=None)`")
    assert "-samples=None  (positional or keyword)" in diff
    diff = _diff("```text\nciclo.sharded(mesh=None, *, rules=None, ...)\n```")
    assert "-rules=None" in diff and "+data_axis='data'" in diff


def test_an_elided_signature_compares_what_it_writes():
    assert _diff("`ciclo.checkpoint(directory, *, monitor=None, ...)` saves") is None
    assert (
        _diff(
            "```text\nstate, h, e = ciclo.loop(state, dataset, tasks, *, stop=None, ...)\n```"
        )
        is None
    )
    assert _diff('`ciclo.checkpoint(directory, *, mode="min", ...)`') is not None


def test_calls_are_not_signatures():
    text = (
        'Use `ciclo.checkpoint(dir, items=["params"])` or\n'
        "`ciclo.every(1)` mid-line.\n"
        "| `ciclo.every(n)` | in a table |\n"
        "```python\nciclo.history(lag=4)\n```\n"
    )
    assert written_signatures(text, "docs/page.md") == []
