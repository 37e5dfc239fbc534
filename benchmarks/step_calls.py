"""A compiled step called by hand: the host's time per call, raw against ciclo's states.

    PYTHONPATH=. python benchmarks/step_calls.py [--steps 2048] [--rounds 9]

`vs_raw.py`'s digits model and batches (numpy, an MLP 64-128-10 at batch 32,
Adam), each step called in a plain Python loop, no `ciclo.loop` around it:

  raw         the hand-written jitted step `(params, opt_state, x, y)`
  managed     `managed.train_step` on a `ManagedState` (`state, batch`)
  flax        a `create_flax_state` state's `train_step` (the one-liner's: a
              loss, its `avg_loss` running mean, a PRNG key folded each step)
  ... in loop the same states under `ciclo.train_loop` (bar-less, history)

The figure is the main thread's CPU time per step (on a CPU device jax runs a
small step's computation on the calling thread too; what XLA's own threads do
is not counted), the minimum over interleaved rounds after a warm-up (noise
only adds). Compare two trees with `PYTHONPATH` in one session.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax
import numpy as np
import vs_raw

import ciclo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    batches = vs_raw.digits_batches()
    flax_state = vs_raw.flax_state()
    managed_state = vs_raw.managed_state()

    def raw(n: int) -> None:
        vs_raw.run_raw(batches, n, None)

    def by_hand(state, step):
        def run(n: int) -> None:
            s = state
            for batch in vs_raw.stream(batches, n):
                _, s = step(s, batch)
            jax.block_until_ready(s)

        return run

    def in_loop(state, tasks=None):
        def run(n: int) -> None:
            s, history, _ = ciclo.train_loop(state, vs_raw.stream(batches, n), tasks)
            jax.block_until_ready(s)
            assert len(history) == n

        return run

    variants = {
        "raw": raw,
        "managed": by_hand(managed_state, vs_raw.train_step),
        "flax": by_hand(flax_state, lambda s, b: s.train_step(b)),
        "managed in loop": in_loop(
            managed_state, {ciclo.on_train_step: vs_raw.train_step}
        ),
        "flax in loop": in_loop(flax_state),
    }
    for run in variants.values():  # compile and warm up
        run(64)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for round_ in range(args.rounds):
        names = list(variants)
        names = names[round_ % len(names) :] + names[: round_ % len(names)]
        for name in names:
            start = time.thread_time()
            variants[name](args.steps)
            times[name].append((time.thread_time() - start) / args.steps * 1e6)
    print(
        f"# {platform.node()} | {platform.machine()} | {os.cpu_count()} cpus | "
        f"jax {jax.__version__} | {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
        f" | ciclo from {os.path.dirname(ciclo.__file__)} | {args.steps} steps, "
        f"min of {args.rounds} rounds, main-thread CPU"
    )
    print()
    print("| variant | µs/step (min) | median | over raw (min) |")
    print("| --- | ---: | ---: | ---: |")
    floor = min(times["raw"])
    for name, t in times.items():
        print(
            f"| {name} | {min(t):.1f} | {float(np.median(t)):.1f} | "
            f"{'' if name == 'raw' else f'+{min(t) - floor:.1f}'} |"
        )


if __name__ == "__main__":
    main()
