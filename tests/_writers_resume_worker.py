"""A run with every writer, for the writers-across-resume tests:
`python _writers_resume_worker.py CKPTS OUT KILL HOW`.

`train_loop(..., resume=CKPTS)` over 12 steps with a test set and a checkpoint at
each epoch end (every 3 steps; the state carries a ballast so that each save takes
a moment). Writers: csv and jsonl loggers, TensorBoard, and W&B offline when wandb
is installed, all under OUT. With KILL > 0 the run is interrupted at the end of the
batch that makes `elapsed_after.steps == KILL` (after that batch's checkpoint, if
any, was started): HOW is "kill" (SIGKILL, nothing cleaned up) or "int" (SIGINT:
Ctrl-C, the loop returns what it reached). The loss logged is a function of the
parameters, so the rows of a resumed run equal those of an uninterrupted one.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax

import ciclo

TX = optax.sgd(0.05)
STEPS, EPOCH = 12, 3


def batches(n, seed):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(8,)).astype(np.float32)
    return [(x, x @ w) for x in rng.normal(size=(n, 16, 8)).astype(np.float32)]


TRAIN, TEST = batches(STEPS, 0), batches(2, 1)


@jax.jit
def train_step(state, batch):
    x, y = batch
    loss, grads = jax.value_and_grad(lambda w: jnp.mean((x @ w - y) ** 2))(state["w"])
    updates, opt_state = TX.update(grads, state["opt"], state["w"])
    state = {**state, "w": optax.apply_updates(state["w"], updates), "opt": opt_state}
    return ciclo.logs().add_loss("loss", loss), state


@jax.jit
def test_step(state, batch):
    x, y = batch
    return ciclo.logs().add_metric("mse", jnp.mean((x @ state["w"] - y) ** 2))


def main(directory, out, kill, how):
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C as in a tty

    def interrupt(state, batch, elapsed, loop_state):
        if loop_state.elapsed_after.steps == kill:
            os.kill(os.getpid(), signal.SIGKILL if how == "kill" else signal.SIGINT)

    writers = [
        ciclo.csv_logger(os.path.join(out, "log.csv")),
        ciclo.jsonl_logger(os.path.join(out, "log.jsonl")),
    ]
    try:  # the optional writers, where their package is installed
        import tensorboardX  # noqa: F401
    except ImportError:
        pass
    else:
        writers.append(ciclo.tensorboard(os.path.join(out, "tb")))
    try:
        import wandb  # noqa: F401
    except ImportError:
        pass
    else:
        writers.append(
            ciclo.wandb_logger(project="ciclo-test", mode="offline", dir=out)
        )
    state = {"w": jnp.zeros(8), "ballast": jnp.zeros((512, 512))}
    state["opt"] = TX.init(state["w"])
    _, history, elapsed = ciclo.train_loop(
        state,
        lambda start_step: TRAIN[start_step:],
        {
            ciclo.on_train_step: train_step,
            ciclo.on_test_step: test_step,
            ciclo.on_train_batch_end: interrupt,
        },
        callbacks=writers,
        test_dataset=lambda: TEST,
        epoch_duration=EPOCH,
        stop=STEPS,
        resume=directory,
    )
    print(json.dumps({"steps": elapsed.steps, "rows": history.collect("steps")}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
