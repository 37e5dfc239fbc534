"""ciclo's host work in situ against alone: instructions, cache misses and branch
mispredictions per step, counted by valgrind (callgrind, main thread).

    PYTHONPATH=. python benchmarks/in_situ.py [--steps 200 600 [1000 ...]] [--jobs 2]

`host_work.py` times ciclo's host work alone (a step that only logs precomputed
device scalars); in `vs_raw.py` the same loop around a real jitted step costs
1.5–3× as much over the raw loop. On a shared 2-core VM timings cannot say why
(their spread is wider than the effect). Counts can: each variant runs under
`valgrind --tool=callgrind --cache-sim=yes --branch-sim=yes` twice, with
`--steps` N1 and N2 steps after the same warm-up, and the main thread's totals
of the two runs are subtracted, so the start-up, the compilation and the
warm-up cancel and what is left is per step, `(N2 − N1)` steps' worth. The
warm-up runs 64 steps twice, then each measured length, and compiles the
history's stack for every size a read can take: what either run would compile
once (the stack of a last transfer shorter than `lag`, of a bar's poll) is
compiled before anything is counted. The objects alive after the warm-up are
frozen (`gc.freeze()`) so that a full collection of them in one run and not
the other does not count as steps' work; keep `N2 − N1` in the hundreds (a
transfer every 64 rows must repeat).

Work still done once in one run and not the other (a full collection of the
objects made since the warm-up, a compile inside jax) moves the figure by
±10–15k instructions a step between runs of one tree (RESULTS.md,
2026-11-28, 20:14). With three lengths or more (`--steps 200 600 1000`) each
run is also compared with the next: the table's first figures span the
shortest and the longest run, and a second table gives the instructions per
step over each span, which disagree when one run did such work.

  raw           `vs_raw.py`'s raw loop (digits MLP, Adam, numpy batches)
  loop_rawstep  `ciclo.loop` around the same jitted raw step (`blocks.py`'s: a
                plain callback logging its loss): ciclo's loop in situ, the
                managed step aside
  loop          `vs_raw.py`'s `ciclo.loop` with a `managed.train_step`
  train_loop    `vs_raw.py`'s `train_loop` + `keras_bar` + history
  host_raw      a plain loop calling a step that only logs a precomputed
                device scalar (`host_work.py`'s "raw")
  host_loop     `ciclo.loop` over that step: ciclo's loop alone

`loop_rawstep − raw` against `host_loop − host_raw` is ciclo's loop in situ
against alone. Cache and branch figures are valgrind's models of a generic
CPU (first-level caches, a simple predictor), not the machine's counters: they
compare variants, they do not time them. Each run takes minutes (the
simulation is ~100× slower than the program); two run at once with `--jobs 2`.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gc
import glob
import itertools
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
VARIANTS = ("raw", "loop_rawstep", "loop", "train_loop", "host_raw", "host_loop")
EVENTS = ("Ir", "I1mr", "D1mr", "D1mw", "Bc", "Bcm", "Bi", "Bim")


def run_variant(variant: str, steps: int, lengths: tuple[int, ...]) -> None:
    """The measured program: warms `variant` up, then runs it for `steps` steps."""
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
    at[0] = 0
    run(steps)


def main_thread_totals(path: str) -> dict[str, int]:
    """The event totals of a callgrind output file."""
    events, totals = None, None
    with open(path) as file:
        for line in file:
            if line.startswith("events:"):
                events = line.split()[1:]
            elif line.startswith(("summary:", "totals:")):
                totals = [int(v) for v in line.split()[1:]]
    if events is None or totals is None:
        raise ValueError(f"{path}: no event totals (callgrind did not finish?)")
    return dict(zip(events, totals))


def callgrind(
    variant: str, steps: int, lengths: tuple[int, ...], out: str
) -> dict[str, int]:
    """Runs one variant under callgrind; the main thread's totals."""
    prefix = os.path.join(out, f"{variant}.{steps}")
    command = [
        "valgrind",
        "--tool=callgrind",
        "--separate-threads=yes",
        "--cache-sim=yes",
        "--branch-sim=yes",
        f"--callgrind-out-file={prefix}.%p",
        sys.executable,
        os.path.abspath(__file__),
        "--run",
        variant,
        str(steps),
        *map(str, lengths),
    ]
    with open(prefix + ".log", "w") as log:
        subprocess.run(command, check=True, stdout=log, stderr=subprocess.STDOUT)
    (main,) = glob.glob(prefix + ".*-01")  # thread 1: the main thread
    return main_thread_totals(main)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=(200, 600))
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", help="keep callgrind's files here")
    parser.add_argument("--run", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        variant, steps, *lengths = args.run
        return run_variant(variant, int(steps), tuple(map(int, lengths)))
    lengths = tuple(sorted(set(args.steps)))
    if len(lengths) < 2:
        parser.error(f"--steps needs two lengths or more, got {args.steps}")
    first, second = lengths[0], lengths[-1]
    out = args.out or tempfile.mkdtemp(prefix="in_situ.")
    os.makedirs(out, exist_ok=True)
    jobs = [(v, n) for v in args.variants for n in lengths]
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = {job: pool.submit(callgrind, *job, lengths, out) for job in jobs}
        totals = {job: future.result() for job, future in futures.items()}
    steps = second - first
    print(
        f"# main thread, per step: (totals at {second} steps − at {first}) / "
        f"{steps}; callgrind's files in {out}\n"
    )
    print("| variant | " + " | ".join(EVENTS) + " |")
    print("| --- |" + " ---: |" * len(EVENTS))
    per_step = {}
    for variant in args.variants:
        a, b = totals[(variant, first)], totals[(variant, second)]
        per_step[variant] = {e: (b.get(e, 0) - a.get(e, 0)) / steps for e in EVENTS}
        print(
            f"| {variant} | "
            + " | ".join(f"{per_step[variant][e]:,.0f}" for e in EVENTS)
            + " |"
        )
    if len(lengths) > 2:  # each span alone: a one-off in one run shows as a gap
        spans = list(itertools.pairwise(lengths))
        print(
            "\n# instructions per step over each span: work done once in one "
            "run (a compile, a full collection) makes the spans disagree\n"
        )
        print("| variant | " + " | ".join(f"{a}→{b}" for a, b in spans) + " |")
        print("| --- |" + " ---: |" * len(spans))
        for variant in args.variants:
            cells = [
                (totals[(variant, b)]["Ir"] - totals[(variant, a)]["Ir"]) / (b - a)
                for a, b in spans
            ]
            print(f"| {variant} | " + " | ".join(f"{c:,.0f}" for c in cells) + " |")
    pairs = [("loop_rawstep", "raw", "in situ"), ("host_loop", "host_raw", "alone")]
    pairs += [(v, "raw", "in situ") for v in ("loop", "train_loop")]
    shown = [(a, b, w) for a, b, w in pairs if a in per_step and b in per_step]
    if shown:
        print("\n| ciclo's part | " + " | ".join(EVENTS) + " |")
        print("| --- |" + " ---: |" * len(EVENTS))
        for a, b, where in shown:
            print(
                f"| {a} − {b} ({where}) | "
                + " | ".join(f"{per_step[a][e] - per_step[b][e]:+,.0f}" for e in EVENTS)
                + " |"
            )


if __name__ == "__main__":
    main()
