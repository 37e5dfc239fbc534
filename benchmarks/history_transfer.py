"""The History's lagged transfer in situ: what it costs the loop's thread.

    PYTHONPATH=. python benchmarks/history_transfer.py [--steps 4096] [--rounds 5]

Every `lag` (64) commits the History puts its staged rows in their columns
(`_settle`), reads the transfers in flight that are computed (`_complete`) and
starts one for the rows since (`_start`: the device scalars stacked by one jitted
call, the copy to the host started). `host_ops.py` counts its bytecodes (a few a
step, amortized); in the loop most of its cost is C work on values and rows
committed up to 64 steps earlier. This times those three stages where they run,
in `vs_raw.py`'s `ciclo.loop` (digits MLP, Adam, numpy batches), with the loop
thread's CPU time (`time.thread_time`: not XLA's threads, not the time the VM
takes the core away), wrapped around each stage, and the whole loop's CPU time a
step beside it. Each round runs `--steps` steps after a warm-up; the table gives
the median over rounds of the µs per transfer and per step (amortized).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax
import vs_raw

from ciclo._history import store

STAGES = ("_advance", "_settle", "_start", "_complete")


def timed(spent: dict[str, float], counts: dict[str, int]) -> None:
    """Wraps each stage of `HistoryStore` to add its thread CPU time to `spent`."""
    for name in STAGES:
        original = getattr(store.HistoryStore, name)

        def wrapper(self, *args, _original=original, _name=name, **kwargs):
            start = time.thread_time()
            try:
                return _original(self, *args, **kwargs)
            finally:
                spent[_name] += time.thread_time() - start
                counts[_name] += 1

        setattr(store.HistoryStore, name, wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    batches = vs_raw.digits_batches()
    vs_raw.run_loop(batches, 1024, vs_raw.managed_state())  # compiled, warmed up
    spent = dict.fromkeys(STAGES, 0.0)
    counts = dict.fromkeys(STAGES, 0)
    timed(spent, counts)
    per_transfer: dict[str, list[float]] = {name: [] for name in STAGES}
    per_step: dict[str, list[float]] = {name: [] for name in (*STAGES, "loop")}
    for _ in range(args.rounds):
        for name in STAGES:
            spent[name], counts[name] = 0.0, 0
        start = time.thread_time()
        vs_raw.run_loop(batches, args.steps, vs_raw.managed_state())
        per_step["loop"].append((time.thread_time() - start) / args.steps * 1e6)
        transfers = max(counts["_start"], 1)
        for name in STAGES:
            per_transfer[name].append(spent[name] / transfers * 1e6)
            per_step[name].append(spent[name] / args.steps * 1e6)
    print(
        f"# {platform.node()} | {platform.machine()} | {os.cpu_count()} cpus | "
        f"jax {jax.__version__} | python {platform.python_version()} | "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} | "
        f"{args.steps} steps x {args.rounds} rounds, loop thread CPU time\n"
    )
    print("| stage | µs a transfer (median) | µs a step (median) |")
    print("| --- | ---: | ---: |")
    for name in STAGES:
        label = f"`{name}`" + (
            " (all three, and its own)" if name == "_advance" else ""
        )
        print(
            f"| {label} | {statistics.median(per_transfer[name]):.1f} | "
            f"{statistics.median(per_step[name]):.2f} |"
        )
    print(f"| the whole loop | | {statistics.median(per_step['loop']):.1f} |")


if __name__ == "__main__":
    main()
