"""`python _history_kill_worker.py DIR K`: `_history_model.run(DIR, keep=1)`, killed
(`os._exit(137)`) just before the `K`-th file call (a link, or a file opened for
writing) in the `history` item of the save of step 9, which builds on the files of
step 6's."""

from __future__ import annotations

import builtins
import os
import sys

import _history_model as model


def _kill_at(k: int) -> None:
    count = [0]

    def counted(path) -> None:
        parts = os.fspath(path).split(os.sep)
        if any(p.startswith("history") for p in parts) and any(
            p.startswith("9.orbax-checkpoint-tmp") for p in parts
        ):
            count[0] += 1
            if count[0] == k:
                os._exit(137)

    real_link, real_open = os.link, builtins.open

    def link(src, dst, *args, **kwargs):
        counted(dst)
        return real_link(src, dst, *args, **kwargs)

    def open_(file, mode="r", *args, **kwargs):
        if isinstance(file, str | os.PathLike) and any(c in mode for c in "wax+"):
            counted(file)
        return real_open(file, mode, *args, **kwargs)

    os.link, builtins.open = link, open_


if __name__ == "__main__":
    directory, k = sys.argv[1], int(sys.argv[2])
    _kill_at(k)
    model.run(directory, keep=1)
    print("DONE", flush=True)
