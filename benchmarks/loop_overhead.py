"""Interpreter overhead of `ciclo.loop` and its speed against a hand-written loop.

    python benchmarks/loop_overhead.py [--steps 20000] [--mlp-steps 3000]

Reports:
  1. microseconds per step of the interpreter alone (a callback that does nothing,
     and one that returns a small `Logs` so history is exercised);
  2. steps/s of `ciclo.loop` vs a hand-written `for` loop calling the same jitted
     train step of a small MLP (the hand loop keeps its logs in a list, as a user
     would), both timed to the final `block_until_ready`, interleaved over several
     rounds; the ratio of the best times is the figure (least disturbed by noise).
Results go in benchmarks/RESULTS.md (by hand, with the machine and date).
"""

from __future__ import annotations

import argparse
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import ciclo


def empty(state, batch):
    return None


def host_logs(state, batch):
    logs = ciclo.logs()
    logs.add_metric("x", 1.0)
    return logs


def interpreter_us(callback, steps: int, repeats: int = 3) -> float:
    data = range(steps)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        ciclo.loop(None, data, {ciclo.every(1): [callback]})
        best = min(best, time.perf_counter() - start)
    return best / steps * 1e6


def mlp_setup(batch_size: int = 64, width: int = 256):
    key = jax.random.key(0)
    k1, k2, k3 = jax.random.split(key, 3)
    params = {
        "w1": jax.random.normal(k1, (64, width)) * 0.1,
        "w2": jax.random.normal(k2, (width, width)) * 0.1,
        "w3": jax.random.normal(k3, (width, 10)) * 0.1,
    }
    tx = optax.adam(1e-3)
    state = (params, tx.init(params))

    @jax.jit
    def train_step(state, batch):
        params, opt_state = state
        x, y = batch

        def loss_fn(p):
            h = jax.nn.relu(x @ p["w1"])
            h = jax.nn.relu(h @ p["w2"])
            logits = h @ p["w3"]
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        logs = ciclo.logs()
        logs.add_loss("loss", loss)
        return logs, (optax.apply_updates(params, updates), opt_state)

    rng = np.random.default_rng(0)
    batches = [
        (
            jnp.asarray(rng.normal(size=(batch_size, 64)), jnp.float32),
            jnp.asarray(rng.integers(0, 10, size=(batch_size,))),
        )
        for _ in range(32)
    ]
    return state, train_step, batches


def hand_loop(state, train_step, batches, steps):
    all_logs = []
    for i in range(steps):
        logs, state = train_step(state, batches[i % len(batches)])
        all_logs.append(logs)
    jax.block_until_ready(state)
    return state, all_logs


def ciclo_loop(state, train_step, batches, steps):
    data = (batches[i % len(batches)] for i in range(steps))
    state, history, _ = ciclo.loop(state, data, {ciclo.every(1): [train_step]})
    jax.block_until_ready(state)
    return state, history


def best_seconds(fn, state, train_step, batches, steps) -> float:
    start = time.perf_counter()
    fn(state, train_step, batches, steps)
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--mlp-steps", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()

    print(
        f"# {platform.node()} | {platform.processor() or platform.machine()} | "
        f"jax {jax.__version__} on {jax.devices()[0].platform} | "
        f"{time.strftime('%Y-%m-%d')}"
    )
    print(
        f"interpreter, empty callback:  {interpreter_us(empty, args.steps):6.2f} us/step"
    )
    print(
        f"interpreter, host logs:       {interpreter_us(host_logs, args.steps):6.2f} us/step"
    )

    state, train_step, batches = mlp_setup()
    for fn in (hand_loop, ciclo_loop):
        fn(state, train_step, batches, 10)  # compile and warm up
    hand, loop = [], []
    for _ in range(args.rounds):  # interleaved, so both see the same machine noise
        hand.append(best_seconds(hand_loop, state, train_step, batches, args.mlp_steps))
        loop.append(
            best_seconds(ciclo_loop, state, train_step, batches, args.mlp_steps)
        )
    for name, times in (("hand-written", hand), ("ciclo.loop", loop)):
        print(
            f"MLP {name:12s}: best {args.mlp_steps / min(times):7.0f} steps/s, "
            f"median {args.mlp_steps / float(np.median(times)):7.0f} steps/s"
        )
    print(
        f"ratio ciclo/hand (best of {args.rounds}): {min(hand) / min(loop):.3f}  "
        f"(median: {float(np.median(hand)) / float(np.median(loop)):.3f}; "
        f"target >= 0.95)"
    )


if __name__ == "__main__":
    main()
