"""Fused steps on 4 forced CPU devices (see test_fused.py).

Usage: python _fused_worker.py OUT.pkl
For each strategy: one run of single steps and one fused run (K=4, 10 batches:
calls of 4, 4 and 2 steps) of the same data; writes params and history columns.
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
with open(sys.argv[1], "wb") as f:
    pickle.dump(out, f)
