"""Prefetch on 4 forced CPU devices (see test_prefetch.py).

Usage: python _prefetch_worker.py OUT.pkl
For `data_parallel` and `sharded`, unfused and fused: a run with `prefetch=0` and
one with `prefetch=2` of the same data; records the batches each step got, how
many the source had read by then, the final params, and whether each batch's
copy placed ahead has the placement the strategy gives a batch.
"""

import os
import pickle
import sys

os.environ["XLA_FLAGS"] = (
    "--xla_force_host_platform_device_count=4 --xla_cpu_multi_thread_eigen=false"
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import _managed_model as m
import jax

import ciclo
from ciclo import managed
from ciclo._input.batch import placed_for
from ciclo.managed._placement import place_ahead

assert jax.device_count() == 4, jax.devices()


@managed.train_step
def step(state, batch):
    x, y = batch
    logits = m.apply(state.params, x)
    import optax

    loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    return ciclo.logs().add_loss("loss", loss), state


fused = managed.train_step(step.fn, steps_per_call=4)
data = m.dataset(steps=10)
ids = {b[0].tobytes(): i for i, b in enumerate(data)}  # a batch read ahead is a copy
assert len(ids) == len(data)


class Source:
    def __init__(self):
        self.it, self.read = iter(data), 0

    def __iter__(self):
        return self

    def __next__(self):
        batch = next(self.it)
        self.read += 1
        return batch


out: dict = {}
for name in ["data_parallel", "sharded"]:
    strategy = ciclo.get_strategy(name)
    for label, train in [("", step), ("_fused", fused)]:
        runs = {}
        for prefetch in (0, 2):
            source, rows, read, ok = Source(), [], [], []

            def spy(
                state, batch, elapsed, loop_state, *, strategy=strategy,
                prefetch=prefetch, ok=ok, label=label, rows=rows, read=read,
                source=source,
            ):  # fmt: skip
                ahead = placed_for(loop_state.placed, strategy)
                if prefetch:
                    want = place_ahead(strategy, batch)
                    ok.append(
                        ahead is not None
                        and all(
                            a.sharding == w.sharding and a.shape == w.shape
                            for a, w in zip(
                                jax.tree.leaves(ahead), jax.tree.leaves(want)
                            )
                        )
                    )
                if label:
                    rows.extend(
                        (ids[b[0].tobytes()], elapsed.steps + i)
                        for i, b in enumerate(
                            data[elapsed.steps : elapsed.steps + batch.n]
                        )
                    )
                else:
                    rows.append((ids[batch[0].tobytes()], elapsed.steps))
                read.append(source.read)

            state, history, elapsed = ciclo.train_loop(
                m.create(name),
                source,
                {ciclo.on_train_step: [spy, train]},
                prefetch=prefetch,
            )
            runs[prefetch] = {
                "rows": rows,
                "read": read,
                "params": jax.tree.leaves(m.host_params(state)),
                "placed": all(ok) and len(ok) > 0,
            }
        out[name + label] = runs
with open(sys.argv[1], "wb") as f:
    pickle.dump(out, f)
