"""ciclo's host work in situ against alone: instructions, cache misses and branch
mispredictions per step, counted by valgrind (callgrind, main thread).

    PYTHONPATH=. python benchmarks/in_situ.py [--steps 200 600] [--repeat 3] [--jobs 2]

`host_work.py` times ciclo's host work alone (a step that only logs precomputed
device scalars); in `vs_raw.py` the same loop around a real jitted step costs
1.5–3× as much over the raw loop. On a shared 2-core VM timings cannot say why
(their spread is wider than the effect). Counts can. Each variant runs in one
process under `valgrind --tool=callgrind --cache-sim=yes --branch-sim=yes`:
warmed up, then runs of each `--steps` length, `--repeat` times over, each run
between two markers (`os.getppid()` zeroes callgrind's counters, `os.getpgrp()`
dumps them: `--zero-before`, `--dump-before`). A run's count holds the steps
and the run's own start and end (making the state, the loop's set-up, the last
read of the history); the difference between a long run and a short one is
`(long − short)` steps' worth, so per step = that difference / `(long −
short)`, once per repetition. The warm-up runs 64 steps twice, then each
measured length, and compiles the history's stack for every size a read can
take: what a run would compile once (the stack of a last transfer shorter
than `lag`, of a bar's poll) is compiled before anything is counted. The
objects alive after the warm-up are frozen (`gc.freeze()`) so that a full
collection of them does not count as a run's work; keep `long − short` in the
hundreds (a transfer every 64 rows must repeat).

Work done once in one run and not in its pair (a collection of the objects
made since the warm-up, a compile inside jax) still lands in one figure: the
repetitions show it. The table gives the median per step and, per variant, the
range over the repetitions; a figure that stands apart from the others is such
a one-off. (Before 2026-11-29 each length ran in a process of its own; runs of
one tree then moved by ±10–15k instructions a step: RESULTS.md, 2026-11-28.)

  raw           `vs_raw.py`'s raw loop (digits MLP, Adam, numpy batches)
  loop_rawstep  `ciclo.loop` around the same jitted raw step (`blocks.py`'s: a
                plain callback logging its loss): ciclo's loop in situ, the
                managed step aside
  loop          `vs_raw.py`'s `ciclo.loop` with a `managed.train_step`
  train_loop    `vs_raw.py`'s `train_loop` + `keras_bar` + history
  host_raw      a plain loop calling a step that only logs a precomputed
                device scalar (`host_work.py`'s "raw")
  host_loop     `ciclo.loop` over that step: ciclo's loop alone
  flax          `vs_raw.py`'s `create_flax_state` one-liner (`train_loop(state,
                data)`); only when named in `--variants`

`loop_rawstep − raw` against `host_loop − host_raw` is ciclo's loop in situ
against alone. Cache and branch figures are valgrind's models of a generic
CPU (first-level caches, a simple predictor), not the machine's counters: they
compare variants, they do not time them. A variant takes minutes (the
simulation is ~100× slower than the program); two run at once with `--jobs 2`.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gc
import glob
import itertools
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
VARIANTS = ("raw", "loop_rawstep", "loop", "train_loop", "host_raw", "host_loop")
OPTIONAL = ("flax",)  # run when named in --variants
EVENTS = ("Ir", "I1mr", "D1mr", "D1mw", "Bc", "Bcm", "Bi", "Bim")


def run_variant(variant: str, lengths: tuple[int, ...], repeat: int) -> None:
    """The measured program: warms `variant` up, then runs it for each of
    `lengths` steps, `repeat` times over, each run between the markers."""
    sys.path.insert(0, HERE)
    import blocks
    import host_work
    import jax
    import jax.numpy as jnp
    import numpy as np
    import vs_raw

    import ciclo
    from ciclo._history import transfer

    batches = vs_raw.digits_batches()

    # the host variants' device scalars: as many in both runs (they cancel)
    scalars = []
    if variant.startswith("host"):
        scalars = host_work.device_scalars(max(lengths) + 256)[0]
    host_batches = [(np.zeros((32, 64), np.float32), np.zeros(32, np.int32))]
    at = [0]

    def host_step(state, batch):
        i = at[0]
        at[0] = i + 1
        return ciclo.logs().add_loss("loss", scalars[i]), state

    def host_raw(n: int) -> None:
        kept = []
        for batch in vs_raw.stream(host_batches, n):
            kept.append(host_step(None, batch))

    def host_loop(n: int) -> None:
        _, history, _ = ciclo.loop(
            None, vs_raw.stream(host_batches, n), {ciclo.every(1): host_step}
        )
        history.collect("loss")

    runs = {
        "raw": lambda n: vs_raw.run_raw(batches, n, None),
        "loop_rawstep": lambda n: blocks.loop_rawstep(batches, n, None),
        "loop": lambda n: vs_raw.run_loop(batches, n, vs_raw.managed_state()),
        "train_loop": lambda n: vs_raw.run_train_loop(
            batches, n, vs_raw.managed_state()
        ),
        "host_raw": host_raw,
        "host_loop": host_loop,
    }
    if variant == "flax":  # one state: a new one has a new config, so compiles
        flax_state = vs_raw.flax_state()
        runs["flax"] = lambda n: vs_raw.run_flax(batches, n, flax_state)
    run = runs[variant]
    # compiled, warmed up, the same in both runs: a run of each measured length
    # too, so that what one length compiles once (the history's stack of its
    # last, shorter transfer: one size per remainder of `lag`) is compiled in
    # both runs, not counted as steps' work
    for n in (64, 64, *lengths):
        at[0] = 0
        run(n)
    # and the stack of every size a read can take (a power of two): a bar's
    # poll fetches the rows since its last redraw, which under valgrind's
    # slowness is a different number than in the warm-up
    zero = jax.jit(lambda: jnp.float32(0))()  # a step's output, as the loss is
    for size in (1 << i for i in range(10)):
        jax.block_until_ready(transfer._stack_scalars([zero] * size))
    # what exists now is never traversed again: a full collection of jax's heap
    # in one run and not the other would read as tens of thousands per step
    gc.collect()
    gc.freeze()
    for _ in range(repeat):
        for n in lengths:
            at[0] = 0
            os.getppid()  # callgrind zeroes its counters (`--zero-before`)
            run(n)
            os.getpgrp()  # and dumps them (`--dump-before`)


def main_thread_totals(path: str) -> dict[str, int]:
    """The event counts of a callgrind dump: its `summary:` line (the counters
    since they were zeroed; the `totals:` line, the sum of the cost lines, can
    also hold costs of calls entered before the zero)."""
    events, totals = None, None
    with open(path) as file:
        for line in file:
            if line.startswith("events:"):
                events = line.split()[1:]
            elif line.startswith("summary:"):
                totals = [int(v) for v in line.split()[1:]]
                break
    if events is None or totals is None:
        raise ValueError(f"{path}: no summary (callgrind did not finish?)")
    return dict(zip(events, totals))


def callgrind(
    variant: str, lengths: tuple[int, ...], repeat: int, out: str
) -> list[dict[str, int]]:
    """Runs one variant under callgrind; the main thread's totals of each run, in
    the order they ran (`lengths`, `repeat` times over)."""
    prefix = os.path.join(out, variant)
    command = [
        "valgrind",
        "--tool=callgrind",
        "--separate-threads=yes",
        "--cache-sim=yes",
        "--branch-sim=yes",
        "--zero-before=getppid",
        "--dump-before=getpgrp",
        f"--callgrind-out-file={prefix}.%p",
        sys.executable,
        os.path.abspath(__file__),
        "--run",
        variant,
        str(repeat),
        *map(str, lengths),
    ]
    with open(prefix + ".log", "w") as log:
        subprocess.run(command, check=True, stdout=log, stderr=subprocess.STDOUT)
    # a dump per run, thread 1 (the main thread): `<prefix>.<pid>.<dump>-01`
    dumps = sorted(
        glob.glob(prefix + ".*.*-01"), key=lambda p: int(p.rsplit(".", 1)[1][:-3])
    )
    if len(dumps) != repeat * len(lengths):
        raise RuntimeError(
            f"{variant}: {len(dumps)} dumps for {repeat * len(lengths)} runs "
            f"(did something else call getppid/getpgrp?); see {prefix}.log"
        )
    return [main_thread_totals(path) for path in dumps]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=(200, 600))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS + OPTIONAL
    )
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", help="keep callgrind's files here")
    parser.add_argument("--run", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        variant, repeat, *lengths = args.run
        return run_variant(variant, tuple(map(int, lengths)), int(repeat))
    lengths = tuple(sorted(set(args.steps)))
    if len(lengths) < 2 or args.repeat < 1:
        parser.error(f"--steps needs two lengths or more, got {args.steps}")
    first, second = lengths[0], lengths[-1]
    out = args.out or tempfile.mkdtemp(prefix="in_situ.")
    os.makedirs(out, exist_ok=True)
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = {
            v: pool.submit(callgrind, v, lengths, args.repeat, out)
            for v in args.variants
        }
        runs = {v: future.result() for v, future in futures.items()}

    def per_step(variant: str, a: int, b: int) -> list[dict[str, float]]:
        """Per step over the span a→b, once per repetition."""
        n = len(lengths)
        ia, ib = lengths.index(a), lengths.index(b)
        return [
            {
                e: (
                    runs[variant][r * n + ib].get(e, 0)
                    - runs[variant][r * n + ia].get(e, 0)
                )
                / (b - a)
                for e in EVENTS
            }
            for r in range(args.repeat)
        ]

    print(
        f"# main thread, per step: (a run of {second} steps − one of {first}) / "
        f"{second - first}, the median of {args.repeat} repetitions in one "
        f"process; callgrind's files in {out}\n"
    )
    print("| variant | " + " | ".join(EVENTS) + " | Ir range |")
    print("| --- |" + " ---: |" * (len(EVENTS) + 1))
    median = {}
    for variant in args.variants:
        reps = per_step(variant, first, second)
        median[variant] = {e: statistics.median(r[e] for r in reps) for e in EVENTS}
        irs = [r["Ir"] for r in reps]
        print(
            f"| {variant} | "
            + " | ".join(f"{median[variant][e]:,.0f}" for e in EVENTS)
            + f" | {min(irs):,.0f}–{max(irs):,.0f} |"
        )
    print("\n# instructions per step, each repetition and span\n")
    spans = list(itertools.combinations(lengths, 2)) if len(lengths) > 2 else []
    spans = [(first, second)] + [sp for sp in spans if sp != (first, second)]
    print(
        "| variant | span | "
        + " | ".join(f"rep {r + 1}" for r in range(args.repeat))
        + " |"
    )
    print("| --- | --- |" + " ---: |" * args.repeat)
    for variant in args.variants:
        for a, b in spans:
            cells = [r["Ir"] for r in per_step(variant, a, b)]
            print(
                f"| {variant} | {a}→{b} | "
                + " | ".join(f"{c:,.0f}" for c in cells)
                + " |"
            )
    pairs = [("loop_rawstep", "raw", "in situ"), ("host_loop", "host_raw", "alone")]
    pairs += [(v, "raw", "in situ") for v in ("loop", "train_loop", "flax")]
    shown = [(a, b, w) for a, b, w in pairs if a in median and b in median]
    if shown:
        print("\n| ciclo's part (medians) | " + " | ".join(EVENTS) + " |")
        print("| --- |" + " ---: |" * len(EVENTS))
        for a, b, where in shown:
            print(
                f"| {a} − {b} ({where}) | "
                + " | ".join(f"{median[a][e] - median[b][e]:+,.0f}" for e in EVENTS)
                + " |"
            )


if __name__ == "__main__":
    main()
