"""One process of the history-under-`jax.distributed` test (test_checkpoint_history).

Usage: python _history_multihost_worker.py PROCESS_ID NUM_PROCESSES PORT DIR STOP OUT
Trains a vector sharded over the processes with `train_loop(..., resume=DIR)`, a
checkpoint every 2 steps (keeping 2), to STOP, logging its mean as the loss; writes
the history's steps and losses (float hex) to `OUT.<PROCESS_ID>.json`.
"""

import json
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np

process_id, num_processes, port, directory, stop, out = sys.argv[1:]
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(
    coordinator_address=f"127.0.0.1:{port}",
    num_processes=int(num_processes),
    process_id=int(process_id),
    initialization_timeout=60,
)

import ciclo  # noqa: E402

mesh = jax.sharding.Mesh(np.array(jax.devices()), ("d",))
sharded = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d"))
w0 = np.zeros(8, dtype=np.float32)
init = {"w": jax.make_array_from_callback(w0.shape, sharded, lambda i: w0[i])}


@jax.jit
def train_step(state, batch):
    w = state["w"] + batch
    return ciclo.logs().add_loss("loss", jnp.mean(w)), {"w": w}


_, history, _ = ciclo.train_loop(
    init,
    lambda start: (np.float32(i) for i in range(start, 100)),
    {ciclo.on_train_step: train_step},
    callbacks=[ciclo.checkpoint(directory, keep=2)],
    epoch_duration=2,
    stop=int(stop),
    resume=directory,
)
steps, losses = history.collect("steps", "loss")
with open(f"{out}.{process_id}.json", "w") as f:
    json.dump({"steps": steps, "loss": [float(v).hex() for v in losses]}, f)
jax.distributed.shutdown()
