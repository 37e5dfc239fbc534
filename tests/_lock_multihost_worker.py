"""One process of the multi-host lock test (see test_checkpoint_faults.py).

Usage: python _lock_multihost_worker.py PROCESS_ID NUM_PROCESSES PORT DIR
Trains a state sharded over both processes for 6 steps with a checkpoint in DIR
every 3 steps under `jax.distributed` (gloo), then restores it (its checksums
summed on the devices); prints `HOLDER <pid>` (the pid in DIR's lock file at the
end) and `DONE 6`, or `REFUSED <message>` if another run holds DIR.

With a fifth argument STOP (resume mode): `train_loop(..., resume=DIR)` to step
STOP, a checkpoint every 3 steps (keeping 3) of a 4096-float vector, then checks
this process's shard against the uninterrupted values and prints `DONE <steps>`.
"""

import faulthandler
import json
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import numpy as np

faulthandler.dump_traceback_later(100, exit=True)  # a hang: its stacks, then exit
process_id, num_processes, port, directory, *resume = sys.argv[1:]
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
w0 = np.arange(4096 if resume else 8, dtype=np.float32)
init = {"w": jax.make_array_from_callback(w0.shape, sharded, lambda i: w0[i])}


@jax.jit
def train_step(state, batch):
    return ciclo.logs().add_loss("loss", batch), {"w": state["w"] * 0.5 + batch}


def holder(state):
    with open(os.path.join(directory, "ciclo.lock")) as f:
        print("HOLDER", json.load(f)["pid"], flush=True)


def check(state, steps):
    expected = w0
    for i in range(steps):
        expected = expected * np.float32(0.5) + np.float32(i)
    shard = state["w"].addressable_shards[0]
    assert state["w"].sharding == sharded, state["w"].sharding
    assert np.array_equal(np.asarray(shard.data), expected[shard.index])


if resume:
    stop = int(resume[0])
    state, _, elapsed = ciclo.train_loop(
        init, lambda start: [np.float32(i) for i in range(start, stop)],
        {ciclo.on_train_step: train_step}, epoch_duration=3, stop=stop,
        resume=directory, callbacks=[ciclo.checkpoint(directory, keep=3)],
    )  # fmt: skip
    check(state, stop)
    print("DONE", elapsed.steps, flush=True)
    sys.exit(0)

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
assert elapsed.steps == 6, elapsed
check(state, 6)
print("DONE", elapsed.steps, flush=True)
