"""A training run for the checkpoint fault tests: `python _faults_worker.py MODE DIR [N]`.

The model (`init_state`, `train_step`, `batches`) is shared with the tests. Modes:

- `train DIR N [KEEP]`: `train_loop(..., resume=DIR)`, a checkpoint every 3 steps
  (keeping KEEP, default 1), 12 steps, with an `N`-float parameter vector
  (incompressible: random), and a JSON-lines log `DIR.jsonl`.
- `nospace DIR N`: the same, with a full disk from the checkpoint of step 6 on,
  injected at the file-call level: every write of a file under
  `6.orbax-checkpoint-tmp` (and later steps) fails with `OSError(ENOSPC)`.
- `killdel DIR K`: the `train` run with a kill (`os._exit`) just before the
  `K`-th filesystem change (rename, unlink, rmdir) of the first deletion of an
  older checkpoint; `K = 0`: no kill, but a copy of DIR as it is before each of
  those changes, `DIR-k` for the k-th (what a kill there would leave).
- `hold DIR`: saves one checkpoint by hand (the directory's lock is held), prints
  `HOLDING`, waits for stdin to close, then ends normally (the lock is released).
- `die DIR`: saves one checkpoint by hand and SIGKILLs itself (a stale lock).
"""

from __future__ import annotations

import builtins
import errno
import os
import shutil
import signal
import sys

import jax
import jax.numpy as jnp
import numpy as np

import ciclo

STEPS, EPOCH = 12, 3


def init_state(n: int = 64):
    w = np.random.default_rng(0).normal(size=(n,)).astype(np.float32)
    return {"w": jnp.asarray(w), "count": jnp.int32(0)}


@jax.jit
def train_step(state, batch):
    w = state["w"] * 0.999 + batch
    logs = ciclo.logs().add_loss("loss", jnp.mean(w**2))
    return logs, {"w": w, "count": state["count"] + 1}


def batches(start_step: int):
    return [jnp.float32(0.01 * i) for i in range(start_step, STEPS)]


def train(directory, n: int = 64, stop: int = STEPS, **kwargs):
    return ciclo.train_loop(
        init_state(n), batches, {ciclo.on_train_step: train_step},
        epoch_duration=EPOCH, stop=stop, resume=directory, **kwargs,
    )  # fmt: skip


def _full_disk_from(step: int) -> None:
    """Every write of a file in a checkpoint of `step` or later fails: ENOSPC."""
    real_open = builtins.open

    def failing(file, mode="r", *args, **kwargs):
        if isinstance(file, str | os.PathLike) and any(c in mode for c in "wax+"):
            for part in os.fspath(file).split(os.sep):
                saved = part.split(".")[0]
                tmp = part.endswith(".orbax-checkpoint-tmp") and saved.isdigit()
                if tmp and int(saved) >= step:
                    raise OSError(errno.ENOSPC, "No space left on device", file)
        return real_open(file, mode, *args, **kwargs)

    builtins.open = failing


def _kill_in_deletion(directory: str, k: int) -> None:
    """Kills the process before the `k`-th filesystem change of the first deletion
    of a step folder in `directory` (k = 0: copies `directory` before each)."""
    root = os.path.abspath(directory)
    count, done, busy = [0], [False], [False]

    def where(path, dir_fd):
        path = os.fsdecode(path)
        if dir_fd is not None:
            path = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
        return os.path.abspath(path)

    def wrap(name):
        real = getattr(os, name)

        def changed(path, *args, **kwargs):
            target = where(path, kwargs.get("dir_fd", kwargs.get("src_dir_fd")))
            counted = (
                target.startswith(root + os.sep)
                and target != os.path.join(root, "ciclo.lock")
                and ".orbax-checkpoint-tmp" not in target  # not a save's
                and not done[0]
                and not busy[0]
            )
            if counted:
                count[0] += 1
                if k == 0:
                    busy[0] = True
                    shutil.copytree(root, f"{root}-{count[0]}", symlinks=True)
                    busy[0] = False
                elif count[0] == k:
                    os._exit(137)
                if name == "rmdir" and os.path.dirname(target) == root:
                    done[0] = True  # the step folder itself: deleted
            return real(path, *args, **kwargs)

        setattr(os, name, changed)

    for name in ("rename", "replace", "unlink", "remove", "rmdir"):
        wrap(name)


def main() -> None:
    mode, directory, *rest = sys.argv[1:]
    n = int(rest[0]) if rest else 64
    keep = int(rest[1]) if len(rest) > 1 else 1
    if mode in ("train", "nospace", "killdel"):
        if mode == "nospace":
            _full_disk_from(6)
        if mode == "killdel":
            _kill_in_deletion(directory, int(rest[0]))
            n, keep = 64, 1
        ckpt = ciclo.checkpoint(directory, keep=keep)
        log = ciclo.jsonl_logger(f"{directory}.jsonl")
        _, _, elapsed = train(directory, n, callbacks=[ckpt, log])
        print("DONE", elapsed.steps, flush=True)
        return
    ckpt = ciclo.checkpoint(directory, async_save=False)
    ckpt(ciclo.Elapsed.create(steps=2), init_state())
    if mode == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    print("HOLDING", flush=True)
    sys.stdin.read()  # until the test closes it
    ckpt.close()


if __name__ == "__main__":
    main()
