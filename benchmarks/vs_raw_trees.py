"""The loop ratios of two ciclo trees, timed alternately on one machine, pooled.

    python benchmarks/vs_raw_trees.py BASE_TREE [TREE] [--runs 4] [--rounds 21]

Runs `vs_raw.py` (this checkout's, so both trees are timed by the same script)
`--runs` times per tree, alternating the trees (base, tree, base, tree, ...),
with `PYTHONPATH` set to each tree in turn (a tree is a checkout's root, e.g. a
`git worktree add /tmp/base d7bda58`; `TREE` defaults to this checkout). Each
`vs_raw.py` run pairs every round of a variant with a raw run of its own;
this script pools the paired ratios of all runs of a tree and prints, per tree
and variant, the median of the pooled pairs, the quartiles, the share of pairs
at or above 0.80, and each run's median. A machine's speed drifts between
minutes; alternating the trees spreads that drift over both.

Variants: `ciclo.loop (managed step)` and `train_loop + keras_bar + history`
(`--variants` to choose others, by `vs_raw.py`'s names). Prints a Markdown table;
results go in benchmarks/RESULTS.md by hand, with the machine and date.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
VARIANTS = ["ciclo.loop (managed step)", "train_loop + keras_bar + history"]


def run_once(tree: Path, args, out: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    command = [
        sys.executable,
        str(HERE / "vs_raw.py"),
        "--rounds",
        str(args.rounds),
        "--steps",
        str(args.steps),
        "--ratios-out",
        str(out),
        "--only",
        *args.variants,
    ]
    # the script's own folder, not the working directory, is first on sys.path:
    # `import ciclo` finds the tree on PYTHONPATH
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
    result = json.loads(out.read_text())
    if Path(result["ciclo"]) != tree / "ciclo":
        raise SystemExit(f"vs_raw.py imported ciclo from {result['ciclo']}, not {tree}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", type=Path)
    parser.add_argument("tree", type=Path, nargs="?", default=HERE.parent)
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--steps", type=int, default=2048)
    parser.add_argument("--variants", nargs="+", default=VARIANTS)
    args = parser.parse_args()
    trees = {"base": args.base.resolve(), "tree": args.tree.resolve()}
    for name, tree in trees.items():
        if not (tree / "ciclo" / "__init__.py").exists():
            parser.error(f"{name} {tree} holds no ciclo/__init__.py")
    pooled = {t: {v: [] for v in args.variants} for t in trees}
    per_run = {t: {v: [] for v in args.variants} for t in trees}
    raw_speed = {t: [] for t in trees}
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with tempfile.TemporaryDirectory() as scratch:
        for i in range(args.runs):
            for name, tree in trees.items():
                result = run_once(tree, args, Path(scratch) / f"{name}{i}.json")
                for v in args.variants:
                    pooled[name][v] += result["ratios"][v]
                    per_run[name][v].append(float(np.median(result["ratios"][v])))
                raw = result["times"]["raw jitted loop"]
                raw_speed[name].append(result["steps"] / float(np.median(raw)))
                print(f"# run {i + 1}/{args.runs} {name} done", file=sys.stderr)
    print(
        f"# {platform.node()} | {platform.machine()} | {os.cpu_count()} cpus | "
        f"{started} | base {trees['base']} | tree {trees['tree']} | "
        f"{args.runs} runs x {args.rounds} rounds x {args.steps} steps per tree, "
        f"alternated"
    )
    print()
    print(
        "| tree | variant | × raw (median of pooled pairs) | quartiles "
        "| pairs ≥ 0.80 | each run's median | raw steps/s (median of runs) |"
    )
    print("| --- | --- | ---: | ---: | ---: | --- | ---: |")
    for name in trees:
        for v in args.variants:
            r = np.asarray(pooled[name][v])
            q1, med, q3 = np.percentile(r, [25, 50, 75])
            runs = ", ".join(f"{m:.2f}" for m in per_run[name][v])
            print(
                f"| {name} | {v} | {med:.2f} | {q1:.2f}–{q3:.2f} | "
                f"{np.mean(r >= 0.8):.0%} of {len(r)} | {runs} | "
                f"{np.median(raw_speed[name]):,.0f} |"
            )


if __name__ == "__main__":
    main()
