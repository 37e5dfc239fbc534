"""The big model's step compiled two ways: the raw jitted step and ciclo's managed one.

    XLA_PYTHON_CLIENT_PREALLOCATE=false python benchmarks/step_compare.py [--steps 64]

`vs_raw.py --model big` on an H200 found every ciclo row ~1.8× the raw loop, while
the raw loop over batches already on the device is only ~1.06×. This times both
steps over the same device-resident batches, unbounded and with at most 8 calls
in flight (ciclo's History bounds how far the host runs ahead; the raw loop does
not), and each call blocked on and prints what XLA says of
each compiled computation (FLOPs, bytes accessed, the HLO's op counts), one JSON
line per step.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import time

import jax
import numpy as np
import vs_raw


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--shrink", type=int, default=1)
    args = parser.parse_args()
    vs_raw.configure("big", args.shrink)
    batches = [jax.device_put(b) for b in vs_raw.big_batches(2)]

    params = jax.device_put(vs_raw.init_params())
    opt_state = vs_raw.TX.init(params)
    state = vs_raw.managed_state()
    step = vs_raw.train_step

    def raw(i):
        nonlocal params, opt_state
        params, opt_state, loss = vs_raw.raw_step(params, opt_state, *batches[i % 2])
        return loss

    def ciclo_step(i):
        nonlocal state
        _, state = step(state, batches[i % 2])
        return state.params

    report = {}
    for name, call, bound in [
        ("raw", raw, None),
        ("raw, 8 in flight", raw, 8),
        ("managed", ciclo_step, None),
        ("managed, 8 in flight", ciclo_step, 8),
    ]:
        jax.block_until_ready(call(0))
        jax.block_until_ready(call(1))
        start = time.perf_counter()
        queued = collections.deque()
        for i in range(args.steps):
            out = call(i)
            queued.append(out)
            if bound is not None and len(queued) > bound:
                jax.block_until_ready(queued.popleft())
        jax.block_until_ready(out)
        del queued
        unblocked = (time.perf_counter() - start) / args.steps
        times = []
        for i in range(8):
            start = time.perf_counter()
            jax.block_until_ready(call(i))
            times.append(time.perf_counter() - start)
        report[name] = {
            "ms_per_step_unblocked": round(unblocked * 1e3, 3),
            "ms_per_step_blocked_median": round(float(np.median(times)) * 1e3, 3),
        }
    lowered = {
        "raw": vs_raw.raw_step.lower(params, opt_state, *batches[0]),
    }
    compiled = {k: v.compile() for k, v in lowered.items()}
    for name, c in compiled.items():
        cost = c.cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        text = c.as_text()
        ops = collections.Counter(re.findall(r"= \S+ (\w[\w-]*)\(", text))
        report[name]["flops"] = cost.get("flops") if cost else None
        report[name]["bytes_accessed"] = cost.get("bytes accessed") if cost else None
        report[name]["hlo_ops"] = dict(ops.most_common(12))
    report["device"] = str(jax.devices()[0])
    print(json.dumps(report))


if __name__ == "__main__":
    main()
