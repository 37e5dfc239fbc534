"""Where ciclo's extra time per step goes: the raw loop, the managed step called by
hand, and `ciclo.loop`, on `vs_raw.py`'s digits model.

    python benchmarks/step_gap.py [--steps 4096] [--rounds 7]
    py-spy record -r 250 -f raw -o spy.txt -- python benchmarks/step_gap.py --profile loop
    python benchmarks/step_gap.py --summarize spy.txt

`vs_raw.py` shows `ciclo.loop` at ~0.7× the raw loop on both the 2-core CPU VM and
an H200, while `host_work.py` (the loop's host work without a device step) finds
only ~10–17 µs of ciclo per step. This splits the gap in two, each variant next to
a raw run (order alternating) and taken as a ratio within the pair:

  direct   the managed `train_step` called in a plain `for` loop that keeps its
           logs (what the step and its arguments cost against the raw step);
  loop     `ciclo.loop` with the same step (what the loop adds on top).

Each row gives wall-clock µs per step and the main thread's CPU µs per step
(`time.thread_time`: the Python and dispatch work, not XLA's threads), both
medians. `--profile NAME` just runs one variant for `--rounds` × `--steps` steps
(to record with py-spy); `--summarize` groups a py-spy raw file by function
(self time) for the frames under the profiled variant.
"""

from __future__ import annotations

import argparse
import collections
import platform
import re
import statistics
import sys
import time

import jax
import vs_raw


def run_direct(batches, steps, state):
    """The managed step called by hand, its logs kept (as the raw loop keeps its)."""
    kept = []
    for batch in vs_raw.stream(batches, steps):
        logs, state = vs_raw.train_step(state, batch)
        kept.append(logs)
    jax.block_until_ready((state, kept))


VARIANTS = {
    "raw": (vs_raw.run_raw, lambda: None),
    "direct": (run_direct, vs_raw.managed_state),
    "loop": (vs_raw.run_loop, vs_raw.managed_state),
}


def profiled(run, batches, args, state) -> None:
    """The profiled runs (`--summarize` keeps the samples under this frame)."""
    for _ in range(args.rounds):
        run(batches, args.steps, state)


def summarize(path: str, top: int = 30) -> None:
    """Self time by function of a py-spy raw file, under `profiled`'s frame."""
    total, own = 0, collections.Counter()
    with open(path) as file:
        lines = file.read().splitlines()
    for line in lines:
        stack, count = line.rsplit(" ", 1)
        frames = stack.split(";")
        if not any(f.startswith("profiled (") for f in frames):
            continue
        total += int(count)
        own[re.sub(r":\d+\)", ")", frames[-1])[:110]] += int(count)
    print(f"{total} samples under profiled()")
    running = 0
    for frame, count in own.most_common(top):
        running += count
        print(f"{100 * count / total:5.1f}% {100 * running / total:5.1f}%  {frame}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--profile", choices=sorted(VARIANTS))
    parser.add_argument("--summarize", metavar="PY_SPY_RAW_FILE")
    args = parser.parse_args()
    if args.summarize:
        return summarize(args.summarize)
    batches = vs_raw.digits_batches()
    states = {name: make() for name, (_, make) in VARIANTS.items()}
    for name, (run, _) in VARIANTS.items():  # compile and warm up
        run(batches, 64, states[name])
    if args.profile:
        return profiled(VARIANTS[args.profile][0], batches, args, states[args.profile])

    def timed(name):
        wall, cpu = time.perf_counter(), time.thread_time()
        VARIANTS[name][0](batches, args.steps, states[name])
        wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
        return wall * 1e6 / args.steps, cpu * 1e6 / args.steps

    figures = collections.defaultdict(list)
    for round_ in range(args.rounds):
        for name in ("direct", "loop"):
            pair = ("raw", name) if round_ % 2 else (name, "raw")
            got = {n: timed(n) for n in pair}
            figures[name].append((*got[name], *got["raw"]))
    device = jax.devices()[0]
    print(
        f"# {platform.node()} | {platform.machine()} | {device.device_kind} "
        f"({device.platform}) | jax {jax.__version__} | python "
        f"{sys.version.split()[0]} | {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
        f" | {args.steps} steps x {args.rounds} rounds, paired with raw runs\n"
    )
    print(
        "| variant | wall µs/step | raw's wall | × raw (median of pairs) "
        "| main-thread CPU µs/step | raw's CPU |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, rows in figures.items():
        wall, cpu, raw_wall, raw_cpu = (statistics.median(c) for c in zip(*rows))
        ratio = statistics.median(r[2] / r[0] for r in rows)
        print(
            f"| {name} | {wall:.1f} | {raw_wall:.1f} | {ratio:.2f} "
            f"| {cpu:.1f} | {raw_cpu:.1f} |"
        )


if __name__ == "__main__":
    main()
