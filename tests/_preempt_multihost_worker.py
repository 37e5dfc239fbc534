"""One process of the SIGTERM-under-`jax.distributed` test (test_preemption.py).

Usage: python _preempt_multihost_worker.py PROCESS_ID NUM_PROCESSES PORT DIR
Trains a vector sharded over both processes (gloo) with `train_loop(...,
resume=DIR)` for up to 400 steps of ~20 ms, printing `STEP <n>` after each;
process 0 sends itself SIGTERM after step 10. Both processes are expected to stop
after one agreed step, save it, and end as SIGTERM ends a process.
"""

import faulthandler
import os
import signal
import sys
import time

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import numpy as np

faulthandler.dump_traceback_later(200, exit=True)  # a hang: its stacks, then exit
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
w0 = np.zeros(8, dtype=np.float32)
init = {"w": jax.make_array_from_callback(w0.shape, sharded, lambda i: w0[i])}


@jax.jit
def train_step(state, batch):
    return {"w": state["w"] + batch}


def report(state, batch, elapsed, loop_state):
    steps = int(loop_state.elapsed_after.steps)
    print("STEP", steps, flush=True)
    if steps == 10 and process_id == "0":
        os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.02)


ciclo.train_loop(
    init,
    lambda start: (np.float32(i) for i in range(start, 400)),
    {ciclo.on_train_step: train_step, ciclo.on_train_batch_end: report},
    epoch_duration=1000,
    stop=400,
    resume=directory,
)
print("ENDED without preemption", flush=True)
jax.distributed.shutdown()
