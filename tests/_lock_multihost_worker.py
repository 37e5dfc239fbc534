"""One process of the multi-host lock test (see test_checkpoint_faults.py).

Usage: python _lock_multihost_worker.py PROCESS_ID NUM_PROCESSES PORT DIR
Trains a small numpy state for 6 steps with a checkpoint in DIR every 3 steps under
`jax.distributed` (gloo); prints `HOLDER <pid>` (the pid in DIR's lock file at the
first save) and `DONE`, or `REFUSED <message>` if another run holds DIR.
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


def train_step(state, batch):
    return ciclo.logs().add_loss("loss", float(batch)), {"w": state["w"] + batch}


def holder(state):
    with open(os.path.join(directory, "ciclo.lock")) as f:
        print("HOLDER", json.load(f)["pid"], flush=True)


print("PID", os.getpid(), flush=True)
try:
    ciclo.train_loop(
        {"w": np.zeros(4, np.float32)}, [np.float32(i) for i in range(6)],
        {ciclo.on_train_step: train_step, ciclo.every(6): holder},
        callbacks=[ciclo.checkpoint(directory)], epoch_duration=3, stop=6,
    )  # fmt: skip
except RuntimeError as error:
    print("REFUSED", error, flush=True)
    sys.exit(0)
print("DONE 6", flush=True)
