"""Python function calls per step: a deterministic measure of ciclo's host work.

    PYTHONPATH=. python benchmarks/host_calls.py [--steps 4096]

Wall-clock differences of a few µs per step drown in a shared VM's noise; the
number of Python-level calls (functions, methods, C builtins: what `cProfile`
counts) per step does not move between runs, so it shows whether a change
removed host work. Each variant runs the loop of `observers.py` (a jitted
no-op step logging 2 device scalars, numpy batches) under `cProfile`, after a
warm-up run, and reports the calls per step (total calls / steps) and the
calls added to the bare loop. `train_loop + keras_bar`, a managed step under
`ciclo.loop` (the `vs_raw.py` digits step) and `vs_raw.py`'s fused K=32
`train_loop` (its calls per step: a fused call's are 32 times that) are
measured the same way.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax
import observers
import vs_raw

import ciclo


def calls(run) -> int:
    run()  # warm-up: compilation, first-time setup
    profile = cProfile.Profile()
    profile.enable()
    run()
    profile.disable()
    return pstats.Stats(profile).total_calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4096)
    args = parser.parse_args()
    steps = args.steps
    batches = observers.make_batches(steps)

    digits = vs_raw.digits_batches()
    state = vs_raw.managed_state()

    variants = {
        name: observers.observed(observers.train_step, name, batches)
        for name in [
            "bare loop",
            "csv_logger",
            "jsonl_logger",
            "tensorboard",
            "lr_monitor(schedule)",
            "all four",
        ]
    }
    variants["train_loop + keras_bar"] = observers.with_bar(
        observers.train_step, batches
    )
    # the same step compiled whole (the README's `@jax.jit` step): its Logs is
    # rebuilt by jit at every call
    jitted = jax.jit(observers.train_step)
    variants["jitted step"] = observers.observed(jitted, "bare loop", batches)
    variants["jitted step + lr_monitor(schedule)"] = observers.observed(
        jitted, "lr_monitor(schedule)", batches
    )
    variants["ciclo.loop, managed step (digits)"] = lambda: vs_raw.run_loop(
        digits, steps, state
    )
    # per step: x 32 for a fused call's calls
    variants["train_loop + keras_bar, fused K=32 (digits)"] = lambda: vs_raw.run_fused(
        digits, steps, state
    )
    base = None
    print(f"# {ciclo.__file__} | {steps} steps")
    print("| variant | calls per step | added to the bare loop |")
    print("| --- | ---: | ---: |")
    for name, run in variants.items():
        per_step = calls(run) / steps
        if base is None:
            base = per_step
        print(f"| {name} | {per_step:.1f} | {per_step - base:+.1f} |")


if __name__ == "__main__":
    main()
