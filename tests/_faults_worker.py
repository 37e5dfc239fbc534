"""A training run for the checkpoint fault tests: `python _faults_worker.py MODE DIR [N]`.

The model (`init_state`, `train_step`, `batches`) is shared with the tests. Modes:

- `train DIR N [KEEP]`: `train_loop(..., resume=DIR)`, a checkpoint every 3 steps
  (keeping KEEP, default 1), 12 steps, with an `N`-float parameter vector
  (incompressible: random), and a JSON-lines log `DIR.jsonl`.
- `nospace DIR N`: the same, with a full disk from the checkpoint of step 6 on,
  injected at the file-call level: every write of a file under
  `6.orbax-checkpoint-tmp` (and later steps) fails with `OSError(ENOSPC)`.
- `hold DIR`: saves one checkpoint by hand (the directory's lock is held), prints
  `HOLDING`, waits for stdin to close, then ends normally (the lock is released).
- `die DIR`: saves one checkpoint by hand and SIGKILLs itself (a stale lock).
"""

from __future__ import annotations

import builtins
import errno
import os
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


def main() -> None:
    mode, directory, *rest = sys.argv[1:]
    n = int(rest[0]) if rest else 64
    keep = int(rest[1]) if len(rest) > 1 else 1
    if mode in ("train", "nospace"):
        if mode == "nospace":
            _full_disk_from(6)
        ckpt = ciclo.checkpoint(directory, keep=keep)
        log = ciclo.jsonl_logger(f"{directory}.jsonl")
        _, _, elapsed = train(directory, n, callbacks=[ckpt, log])
        print("DONE", elapsed.steps)
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
