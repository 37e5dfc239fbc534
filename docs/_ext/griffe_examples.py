"""A griffe extension for the API reference: ciclo's docstrings title their doctest
section `Example:` (Google style allows both), which griffe only reads as an
examples section when titled `Examples:`; read as prose, `>>>` lines and their
outputs would run together into Markdown (and broken cross-references)."""

from __future__ import annotations

import re
from typing import Any

import griffe

_EXAMPLE = re.compile(r"^(\s*)Example:[ \t]*$", re.M)


class ExampleSections(griffe.Extension):
    """Reads a docstring section titled `Example:` as `Examples:`."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _EXAMPLE.sub(r"\1Examples:", obj.docstring.value)
