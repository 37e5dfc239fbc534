"""Blocking device-to-host reads of a process that trains only fused.

    PYTHONPATH=. python benchmarks/fused_reads.py [--steps 4096] [--steps-per-call 32]

`ciclo.train_loop(..., steps_per_call=32)` on a managed state (an MLP
64-512-10 at batch 256: a call takes milliseconds, so the device is behind), in
this fresh process, with nothing else in the loop (no epoch end until the run's
last step). A read is blocking when it is asked for a device value that is not
computed yet: every `jax.device_get` and every read of a started transfer
(`Transfer.result`) is counted while the loop runs, and a blocking one when one
of its arrays is not ready at that moment; a drain when the newest step
dispatched was computing before the read and is computed once it returns (it
waited for the whole queue, as a stack dispatched behind the newest step does,
whatever its inputs). The history's bound (a commit
waits for the oldest `lag` rows once `4 * lag` are not on the host: the device
is far behind, and `3 * lag` steps stay queued) is a blocking read, not a drain.
The loop returns without flushing the history; reading it afterwards is not
counted. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import platform

import jax
import jax.numpy as jnp
import numpy as np
import optax

import ciclo
from ciclo import managed
from ciclo._history import transfer


def _not_ready(tree) -> bool:
    leaves = [x for x in jax.tree.leaves(tree) if isinstance(x, jax.Array)]
    return any(not x.is_ready() for x in leaves)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4096)
    parser.add_argument("--steps-per-call", type=int, default=32)
    args = parser.parse_args()

    counts = {"reads": 0, "blocking": 0, "drains": 0}
    newest: list = [None]  # the state after the newest call dispatched
    running = [True]
    device_get, result = jax.device_get, transfer.Transfer.result

    def newest_pending() -> bool:
        return newest[0] is not None and _not_ready(newest[0])

    def count(blocking: bool, pending: bool) -> None:
        counts["reads"] += 1
        counts["blocking"] += blocking
        # it waited for the whole queue: the newest step was computing before
        # the read and is computed after it
        counts["drains"] += pending and not newest_pending()

    def counted_get(tree):
        if not running[0]:
            return device_get(tree)
        blocking, pending = _not_ready(tree), newest_pending()
        out = device_get(tree)
        count(blocking, pending)
        return out

    def counted_result(self):
        if not running[0]:
            return result(self)
        blocking, pending = not self.ready(), newest_pending()
        running[0] = False  # its own copies are part of this read
        try:
            out = result(self)
        finally:
            running[0] = True
        count(blocking, pending)
        return out

    jax.device_get = counted_get
    transfer.Transfer.result = counted_result

    rng = np.random.default_rng(0)
    data = [
        (rng.normal(size=(256, 64)).astype(np.float32), rng.integers(0, 10, 256))
        for _ in range(args.steps)
    ]

    @managed.train_step
    def train_step(state, batch):
        x, y = batch
        logits = jnp.tanh(x @ state.params["w1"]) @ state.params["w2"]
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
        accuracy = (logits.argmax(-1) == y).mean()
        return ciclo.logs().add_loss("loss", loss).add_metric(
            "accuracy", accuracy
        ), state

    params = {
        "w1": rng.normal(size=(64, 512)).astype(np.float32) * 0.1,
        "w2": rng.normal(size=(512, 10)).astype(np.float32) * 0.1,
    }
    state = managed.ManagedState.create(params=params, tx=optax.sgd(0.1))

    _, history, elapsed = ciclo.train_loop(
        state,
        data,
        {
            ciclo.on_train_step: train_step,
            ciclo.on_train_batch_end: lambda state: newest.__setitem__(0, state),
        },
        steps_per_call=args.steps_per_call,
        stop=args.steps,
    )
    during = dict(counts)
    running[0] = False  # reading the history afterwards is a deliberate flush
    rows = len(history.collect("loss"))
    print(
        json.dumps(
            {
                "steps": int(elapsed.steps),
                "rows": rows,
                "steps_per_call": args.steps_per_call,
                "reads_during_loop": during["reads"],
                "blocking_reads_during_loop": during["blocking"],
                "drains_during_loop": during["drains"],
                "device": str(jax.devices()[0]),
                "machine": platform.node(),
                "jax": jax.__version__,
            }
        )
    )


if __name__ == "__main__":
    main()
