"""ciclo's host work per step, counted: Python bytecodes and calls, by function.

    PYTHONPATH=. python benchmarks/host_ops.py [--steps 1024] [--top 12]

On a small shared VM the time a loop's host work takes moves between runs a
minute apart by more than a change to it (RESULTS.md). Counts don't: the
number of bytecodes a loop runs per step is the same on every run and every
machine (for one Python and one jax), so a change to the hot path shows in
them exactly, whatever the noise. They are a proxy: a bytecode is not a fixed
cost, and C work (jax's dispatch, dict and list operations) is not counted.
Timings still decide; this tells where the Python goes and whether a change
removed any.

Counted with `sys.settrace` opcode events (every frame's bytecodes, ciclo's
and the user's step, not jax's C++) over one run of `--steps` steps after a
warm-up run, in four configurations:

  raw            the hand-written jitted loop of `vs_raw.py` (digits, managed
                 model's step, no ciclo): the floor
  loop           `ciclo.loop` with `vs_raw.py`'s `managed.train_step`
  train_loop     `ciclo.train_loop` + `keras_bar` + history, the same step,
                 batches from a generator (`vs_raw.py`'s `train_loop` row)
  loop, host     `ciclo.loop` over a step that only logs two precomputed
                 device scalars (`host_work.py`'s bare loop): ciclo alone

Compare two trees with PYTHONPATH.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax
import numpy as np
import vs_raw

import ciclo


def counted(run, steps: int) -> tuple[collections.Counter, collections.Counter]:
    """Bytecodes and calls per function over `run(steps)`."""
    ops: collections.Counter = collections.Counter()
    calls: collections.Counter = collections.Counter()

    def tracer(frame, event, _):
        code = frame.f_code
        where = (os.path.basename(code.co_filename), code.co_name, code.co_firstlineno)
        if event == "call":
            frame.f_trace_opcodes = True
            calls[where] += 1
        elif event == "opcode":
            ops[where] += 1
        return tracer

    sys.settrace(tracer)
    try:
        run(steps)
    finally:
        sys.settrace(None)
    return ops, calls


def host_only(steps: int):
    """`host_work.py`'s bare loop: a step logging precomputed device scalars."""
    step = jax.jit(lambda x: (x + 1.0, x.sum(), x.mean()))
    x, scalars = jax.numpy.ones(4), []
    for _ in range(2 * steps + 64):
        x, loss, accuracy = step(x)
        scalars.append((loss, accuracy))
    batch = (np.zeros((32, 64), np.float32), np.zeros(32, np.int32))
    at = [0]

    def train_step(state, batch):
        loss, accuracy = scalars[at[0]]
        at[0] += 1
        return ciclo.logs().add_loss("loss", loss).add_metric(
            "accuracy", accuracy
        ), state

    def run(n: int) -> None:
        ciclo.loop(None, [batch] * n, {ciclo.every(1): train_step})[1].collect("steps")

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1024)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    batches = vs_raw.digits_batches()

    def managed(run):
        state = vs_raw.managed_state()
        return lambda n: run(batches, n, state)

    variants = {
        "raw": managed(vs_raw.run_raw),
        "loop": managed(vs_raw.run_loop),
        "train_loop": managed(vs_raw.run_train_loop),
        "loop, host": host_only(args.steps),
    }
    print(
        f"# python {sys.version.split()[0]} | jax {jax.__version__} | ciclo from "
        f"{os.path.dirname(ciclo.__file__)} | {args.steps} steps, sys.settrace"
    )
    print("\n| variant | bytecodes/step | Python calls/step |")
    print("| --- | ---: | ---: |")
    tops = {}
    for name, run in variants.items():
        run(64)  # compiled, warmed up
        ops, calls = counted(run, args.steps)
        n = args.steps
        print(
            f"| {name} | {sum(ops.values()) / n:.0f} | {sum(calls.values()) / n:.1f} |"
        )
        tops[name] = (ops, calls)
    for name, (ops, calls) in tops.items() if args.top > 0 else ():
        print(f"\n{name}: the {args.top} functions running the most bytecodes a step")
        for where, count in ops.most_common(args.top):
            file, function, line = where
            print(
                f"  {count / args.steps:7.1f} ops {calls[where] / args.steps:5.2f} "
                f"calls  {file}:{line} {function}"
            )


if __name__ == "__main__":
    main()
