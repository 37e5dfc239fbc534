"""ciclo's loops against the raw loop in short alternating blocks, with
calibration rows of known host work.

    PYTHONPATH=. python benchmarks/blocks.py [--block 512] [--rounds 40] [--busy 15 30]

`vs_raw.py` pairs each variant with a raw run of `--steps` steps. On a shared VM
the machine's speed moves within a pair as much as between variants. Here every
variant runs `--block` steps in turn, the order reversed every round, and each
block is taken against the raw block next to it in that round. The table gives
each variant's median µs a step, the median and quartiles of its ratios to the
raw loop (raw's time over the variant's), and the µs it adds.

  raw           `vs_raw.py`'s raw loop (digits MLP, Adam, numpy batches)
  raw + N us    the raw loop plus N µs of pure-Python busy work per step
                (`--busy`): what N µs of host work costs on this machine
  loop_rawstep  `ciclo.loop` around the same jitted raw step (a plain callback
                logging its loss): ciclo's loop, the managed step aside
  direct        the managed `train_step` called in a plain `for` loop
                (`step_gap.py`): the managed step's own share
  loop          `ciclo.loop` with the managed step (`vs_raw.py`)
  train_loop    `train_loop` + `keras_bar` + history (`vs_raw.py`)

Every block builds its own state and loop, inside its time, as the raw loop
builds its parameters and optimizer state (about 3 ms here; a loop call's
set-up is 1–2 ms): over 512 steps, a few µs a step for each.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax
import step_gap
import vs_raw

import ciclo


def busy_step(us: float):
    """The raw step followed by `us` µs of busy work."""

    def step(params, opt_state, x, y):
        out = vs_raw.raw_step(params, opt_state, x, y)
        vs_raw._busy(us * 1e-6)
        return out

    return step


def loop_rawstep(batches, steps, _):
    """`ciclo.loop` around `vs_raw.raw_step`, the state a `(params, opt_state)`."""
    params = jax.device_put(vs_raw.init_params())

    def step(state, batch):
        params, opt_state, loss = vs_raw.raw_step(*state, *batch)
        return ciclo.logs().add_loss("loss", loss), (params, opt_state)

    state, history, _ = ciclo.loop(
        (params, vs_raw.TX.init(params)),
        vs_raw.stream(batches, steps),
        {ciclo.every(1): step},
    )
    jax.block_until_ready(state)
    history.collect("loss")


def quartiles(values: list[float]) -> tuple[float, float, float]:
    q1, median, q3 = statistics.quantiles(values, n=4)
    return q1, median, q3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--block", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--busy", type=float, nargs="*", default=[15, 30])
    args = parser.parse_args()
    batches = vs_raw.digits_batches()
    variants = {"raw": (vs_raw.run_raw, lambda: None)}
    for us in args.busy:
        run = functools.partial(vs_raw.run_raw, step=busy_step(us))
        variants[f"raw + {us:g} us"] = (run, lambda: None)
    variants["loop_rawstep"] = (loop_rawstep, lambda: None)
    variants["direct"] = (step_gap.run_direct, vs_raw.managed_state)
    variants["loop"] = (vs_raw.run_loop, vs_raw.managed_state)
    variants["train_loop"] = (vs_raw.run_train_loop, vs_raw.managed_state)
    for run, make in variants.values():  # compiled, warmed up
        run(batches, 64, make())
    times: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for round_ in range(args.rounds):
        for name in names if round_ % 2 == 0 else names[::-1]:
            run, make = variants[name]
            start = time.perf_counter()  # the state's creation counts, as the
            run(batches, args.block, make())  # raw loop's (in `run_raw`) does
            times[name].append((time.perf_counter() - start) / args.block * 1e6)
    device = jax.devices()[0]
    print(
        f"# {platform.node()} | {platform.machine()} | {os.cpu_count()} cpus | "
        f"device: {device.device_kind} ({device.platform}) | jax {jax.__version__} | "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} | {args.block}-step "
        f"blocks x {args.rounds} rounds, alternated\n"
    )
    print(
        "| variant | µs/step (median) | × raw (median) | quartiles | µs added "
        "(median) | quartiles |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    raw = times["raw"]
    for name in names:
        ratios = [r / t for r, t in zip(raw, times[name])]
        added = [t - r for r, t in zip(raw, times[name])]
        (q1, ratio, q3), (a1, add, a3) = quartiles(ratios), quartiles(added)
        print(
            f"| {name} | {statistics.median(times[name]):.1f} | {ratio:.3f} | "
            f"{q1:.3f}–{q3:.3f} | {add:+.1f} | {a1:+.1f} – {a3:+.1f} |"
        )


if __name__ == "__main__":
    main()
