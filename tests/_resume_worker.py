"""A training run for the resume tests: `python _resume_worker.py DIR OUT KILL DATA [SIG]`.

Trains a linear model with Adam and a noise RNG carried in the state, with a test
set and a checkpoint (`train_loop(..., resume=DIR)`) at each epoch end (every 3
steps, 12 steps). With KILL > 0 the process sends itself signal SIG (default
KILL) once KILL batches are trained: SIGKILL as the next batch begins (after the
checkpoint of step KILL, if any, was started: a checkpoint in a loop starts its
save once its step is committed); another signal (TERM: a preemption) at the end
of the batch that makes `elapsed_after.steps == KILL`. DATA is "factory"
(`data(start_step)`) or "list" (a plain list, skipped
forward on resume). Writes the final params and the history (without the wall-clock
fields) to OUT as a pickle.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax

import ciclo

TX = optax.adam(0.05)
STEPS, EPOCH = 12, 3


def init_state():
    params = {"w": jnp.zeros((8,)), "b": jnp.zeros(())}
    return {
        "params": params,
        "opt_state": TX.init(params),
        "key": jax.random.PRNGKey(42),
        "ballast": jnp.zeros((512, 512)),  # makes each save take a moment
    }


@jax.jit
def train_step(state, batch):
    x, y = batch
    key, noise_key = jax.random.split(state["key"])

    def loss_fn(params):
        noise = 0.1 * jax.random.normal(noise_key, y.shape)
        return jnp.mean((x @ params["w"] + params["b"] + noise - y) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(state["params"])
    updates, opt_state = TX.update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    logs = ciclo.logs().add_loss("loss", loss).add_metric("w0", params["w"][0])
    return logs, {**state, "params": params, "opt_state": opt_state, "key": key}


@jax.jit
def test_step(state, batch):
    x, y = batch
    mse = jnp.mean((x @ state["params"]["w"] + state["params"]["b"] - y) ** 2)
    return ciclo.logs().add_metric("mse", mse)


def batches(n, seed):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(8,)).astype(np.float32)
    out = []
    for _ in range(n):
        x = rng.normal(size=(16, 8)).astype(np.float32)
        out.append((x, x @ w + 0.5))
    return out


TRAIN, TEST = batches(STEPS, 0), batches(2, 1)


def rows(history):
    """Every row as sorted (key, dtype, shape, bytes), the wall-clock fields out."""
    out = []
    for logs in history:
        row = []
        for collection, entries in logs.items():
            for name, value in entries.items():
                if collection == "elapsed" and name in ("time", "date"):
                    continue
                value = np.asarray(value)
                row.append(
                    (collection, name, value.dtype.str, value.shape, value.tobytes())
                )
        out.append(sorted(row))
    return out


def main(directory, out, kill, data, sig="KILL"):
    def killer(state, batch, elapsed, loop_state):
        if sig == "KILL" and kill and loop_state.elapsed.steps == kill:
            os.kill(os.getpid(), signal.SIGKILL)

    def signaller(state, batch, elapsed, loop_state):
        if sig != "KILL" and loop_state.elapsed_after.steps == kill:
            os.kill(os.getpid(), getattr(signal, f"SIG{sig}"))

    dataset = TRAIN if data == "list" else (lambda start_step: TRAIN[start_step:])
    state, history, elapsed = ciclo.train_loop(
        init_state(),
        dataset,
        {
            ciclo.on_train_step: train_step,
            ciclo.on_test_step: test_step,
            ciclo.on_train_batch_begin: killer,
            ciclo.on_train_batch_end: signaller,
        },
        test_dataset=lambda: TEST,
        epoch_duration=EPOCH,
        stop=STEPS,
        resume=directory if directory != "-" else None,
    )
    with open(out, "wb") as f:
        params = jax.tree.map(np.asarray, state["params"])
        opt_state = [np.asarray(x) for x in jax.tree.leaves(state["opt_state"])]
        pickle.dump(
            {
                "params": params,
                "opt_state": opt_state,
                "key": np.asarray(state["key"]),
                "rows": rows(history),
                "steps": elapsed.steps,
            },
            f,
        )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), *sys.argv[4:])
