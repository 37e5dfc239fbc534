"""`warn`: a warning about the user's code, shown at the user's line.

Its stacklevel is counted at run time to the first frame outside the ciclo package,
however deep in ciclo it is raised (a loop's hook, a nested test loop, a restore
run by `train_loop` or by `loop`), so Python shows the user's line, and a notebook
the user's cell, never ciclo's internals (`ciclo/_loop/runners.py:33`).
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings

__all__ = ["user_line", "warn"]

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
_CONTEXTLIB = os.path.abspath(contextlib.__file__)  # `with` blocks inside ciclo


def _inside(filename: str) -> bool:
    return filename.startswith(_PACKAGE) or filename == _CONTEXTLIB


def warn(message: str | Warning, category: type[Warning] = UserWarning) -> None:
    """`warnings.warn(message, category)` at the first caller outside ciclo.

    Example:
        >>> import warnings
        >>> from ciclo._warn import warn
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     warn("about your code")
        >>> caught[0].filename.endswith("_warn.py")  # ciclo's own line: skipped
        False
    """
    frame, level = sys._getframe(1), 2  # level 2: warn's caller
    while frame is not None and _inside(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    if frame is None:  # called from ciclo alone (a thread of its own): its line
        level = 2
    warnings.warn(message, category, stacklevel=level)


def user_line() -> str:
    """`"file:line"` of the first caller outside ciclo (where the user made an
    object, named in an error about two of them).

    Example:
        >>> from ciclo._warn import user_line
        >>> "_warn.py" in user_line()  # ciclo's own frames are skipped
        False
    """
    frame = sys._getframe(1)
    while frame is not None and _inside(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        return "?"
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"
