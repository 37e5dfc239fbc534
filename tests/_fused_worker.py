"""Fused steps on 4 forced CPU devices (see test_fused.py).

Usage: python _fused_worker.py OUT.pkl
For each strategy: one run of single steps and one fused run (K=4, 10 batches:
calls of 4, 4 and 2 steps) of the same data; writes params and history columns.
"matrix": every strategy (the six names and a `ciclo.sharded` data x model mesh)
x steps_per_call (1, 4) through `train_loop`, and `loop` with prefetch on/off for
the splitting strategies: the trained params. "placement": for `data_parallel` and
`sharded`, the transfer calls (`jax.device_put`, `jax.make_array_from_callback`)
one placement makes and the numpy arrays they are handed: views of the caller's
memory or not (a host copy, a transpose).
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
import numpy as np
from jax.sharding import PartitionSpec as P

import ciclo
from ciclo import managed

assert jax.device_count() == 4, jax.devices()
K = 4
data = m.dataset(steps=10)
fused_step = managed.train_step(m.train_step.fn, steps_per_call=K)
out: dict = {}
for name in ["jit", "data_parallel", "sharded"]:
    runs = {}
    for label, step in [("single", m.train_step), ("fused", fused_step)]:
        state, history, elapsed = ciclo.loop(
            m.create(name), data, {ciclo.every(1): step}
        )
        runs[label] = {
            "params": m.host_params(state),
            "loss": history.collect("losses.loss"),
            "steps_seen": history.collect("steps_seen"),
            "steps": history.collect("steps"),
            "samples": history.collect("samples"),
            "logits_shape": [v.shape for v in history.collect("logits")],
            "elapsed": (elapsed.steps, elapsed.samples),
        }
    out[name] = runs


class Fit(managed.ManagedState):
    train_step = managed.train_step(m.train_step.fn)


TX = m.optax.sgd(0.1, momentum=0.9)  # one object: a strategy's runs share compiles
eight = data[:8]  # two full fused calls (no tail call to compile)


mesh = jax.make_mesh((2, 2), ("data", "model"))
two_axes = ciclo.sharded(mesh, rules=[("w1", P(None, "model")), ("w2", P("model"))])
strategies = {
    name: name
    for name in [
        "eager",
        "jit",
        "jit_donate",
        "data_parallel",
        "data_parallel_donate",
        "sharded",
    ]
}
strategies["sharded(2x2 mesh, rules)"] = two_axes
matrix: dict = {}
for label, strategy in strategies.items():
    for k in (1, 4):
        state = Fit.create(params=m.init_params(), tx=TX, strategy=strategy)
        try:
            state, _, elapsed = ciclo.train_loop(state, eight, steps_per_call=k)
            matrix[("train_loop", label, k, None)] = (
                m.host_params(state),
                elapsed.steps,
            )
        except Exception as error:  # reported by the test, with the others
            matrix[("train_loop", label, k, None)] = repr(error)
for label in ["data_parallel", "sharded", "sharded(2x2 mesh, rules)"]:
    for prefetch in (0, 1):
        state = Fit.create(params=m.init_params(), tx=TX, strategy=strategies[label])
        try:
            state, _, elapsed = ciclo.loop(
                state,
                eight,
                {ciclo.every(1): Fit.train_step},
                steps_per_call=K,
                prefetch=prefetch,
            )
            matrix[("loop", label, K, prefetch)] = (m.host_params(state), elapsed.steps)
        except Exception as error:
            matrix[("loop", label, K, prefetch)] = repr(error)
out["matrix"] = matrix

transfers: list = []  # per transfer call: the numpy arrays it was handed
put, from_callback = jax.device_put, jax.make_array_from_callback


def counting_put(x, *args, **kwargs):
    leaves = jax.tree.leaves(x)
    transfers.append([leaf for leaf in leaves if isinstance(leaf, np.ndarray)])
    return put(x, *args, **kwargs)


def counting_callback(shape, sharding, callback, *args, **kwargs):
    handed: list = []

    def recorded(index):
        handed.append(callback(index))
        return handed[-1]

    transfers.append(handed)
    return from_callback(shape, sharding, recorded, *args, **kwargs)


jax.device_put, jax.make_array_from_callback = counting_put, counting_callback
batch = data[0]
stacked = tuple(np.stack([b[i] for b in data[:3]]) for i in range(2))  # 3 steps
placement: dict = {}
for name in ["data_parallel", "sharded"]:
    strategy = ciclo.get_strategy(name)
    for label, fn, given in [
        ("batch", strategy.place_batch, batch),
        ("steps", strategy.place_steps, stacked),
    ]:
        jax.block_until_ready(fn(given))  # first call: caches
        transfers.clear()
        placed = jax.block_until_ready(fn(given))
        handed = [x for call in transfers for x in call]
        placement[(name, label)] = {
            "transfers": len(transfers),
            "views": bool(handed)
            and all(any(np.shares_memory(x, g) for g in given) for x in handed),
            "handed_shapes": [x.shape for x in handed],
            "shapes": [tuple(x.shape) for x in jax.tree.leaves(placed)],
        }
jax.device_put, jax.make_array_from_callback = put, from_callback
out["placement"] = placement
with open(sys.argv[1], "wb") as f:
    pickle.dump(out, f)
