"""One process of the multi-host lock test (see test_checkpoint_faults.py).

Usage: python _lock_multihost_worker.py PROCESS_ID NUM_PROCESSES PORT DIR
Trains a state sharded over both processes for 6 steps with a checkpoint in DIR
every 3 steps under `jax.distributed` (gloo), then restores it (its checksums
summed on the devices); prints `HOLDER <pid>` (the pid in DIR's lock file at the
end) and `DONE 6`, or `REFUSED <message>` if another run holds DIR.
"""

import json
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import numpy as np

process_id, num_processes, port, directory = sys.argv[1:]
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
w0 = np.arange(8, dtype=np.float32)
init = {"w": jax.make_array_from_callback((8,), sharded, lambda index: w0[index])}


@jax.jit
def train_step(state, batch):
    return ciclo.logs().add_loss("loss", batch), {"w": state["w"] * 0.5 + batch}


def holder(state):
    with open(os.path.join(directory, "ciclo.lock")) as f:
        print("HOLDER", json.load(f)["pid"], flush=True)


print("PID", os.getpid(), flush=True)
try:
    ciclo.train_loop(
        init, [np.float32(i) for i in range(6)],
        {ciclo.on_train_step: train_step, ciclo.every(6): holder},
        callbacks=[ciclo.checkpoint(directory)], epoch_duration=3, stop=6,
    )  # fmt: skip
except RuntimeError as error:
    print("REFUSED", error, flush=True)
    sys.exit(0)
state, elapsed = ciclo.restore(directory, init)  # checksums checked, sharded
expected = w0
for i in range(6):
    expected = expected * np.float32(0.5) + np.float32(i)
local = np.concatenate([np.asarray(s.data) for s in state["w"].addressable_shards])
assert elapsed.steps == 6 and state["w"].sharding == sharded, state["w"].sharding
assert np.array_equal(local, expected[state["w"].addressable_shards[0].index]), local
print("DONE", elapsed.steps, flush=True)
