"""One process of the multi-process model-parallel test (test_model_parallel.py).

Usage: python _model_parallel_multihost.py PROCESS_ID NUM_PROCESSES PORT OUT.pkl
2 processes x 2 forced CPU devices form a 2x2 (data x model) mesh, each process a
row of it (its own data shard, both model shards); each feeds its local rows of
every batch. Process 0 writes the final params (gathered) and the shard layout.
"""

import os
import pickle
import sys

os.environ["XLA_FLAGS"] = (
    "--xla_force_host_platform_device_count=2 --xla_cpu_multi_thread_eigen=false"
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import numpy as np

process_id, num_processes, port, out = sys.argv[1:]
process_id, num_processes = int(process_id), int(num_processes)
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(
    coordinator_address=f"127.0.0.1:{port}",
    num_processes=num_processes,
    process_id=process_id,
    initialization_timeout=60,
)

import _model_parallel_worker as w  # noqa: E402  (after jax.distributed.initialize)
from jax.sharding import Mesh  # noqa: E402

import ciclo  # noqa: E402

assert jax.device_count() == 4, jax.devices()
# rows = processes (jax.devices() is in process order)
mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("data", "model"))
strategy = ciclo.sharded(mesh, rules=w.RULES)
local = w.BATCH // num_processes
rows = slice(process_id * local, (process_id + 1) * local)
data = [(x[rows], y[rows]) for x, y in w.dataset()]

state = w.create(strategy)
state, history, _ = ciclo.loop(state, data, {**w.train_step})
logs, _ = w.train_step(state, data[0])
assert logs.outputs.out.shape == (local, 4), logs.outputs.out.shape
kernel = state.params["Dense_0"]["kernel"]
shards = sorted({tuple(s.data.shape) for s in kernel.addressable_shards})
params = w.host(state.with_strategy("jit").params)  # gathers across processes
results = {
    "params": params,
    "loss": history.collect("loss"),
    "shards": shards,
    "memory": {d.id: b for d, b in state.memory().items()},
}
if process_id == 0:
    with open(out, "wb") as f:
        pickle.dump(results, f)
jax.distributed.shutdown()
print(f"process {process_id} done")
