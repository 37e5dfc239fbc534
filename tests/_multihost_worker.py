"""One process of the multi-process `sharded` test (see test_multihost.py).

Usage: python _multihost_worker.py PROCESS_ID NUM_PROCESSES PORT OUT.npz
Each process has 2 forced CPU devices, feeds its local rows of every global batch,
and process 0 writes the final params to OUT.npz.
"""

import os
import sys

# forced CPU devices share one thread pool: without intra-op threading a collective
# can't stall waiting for a participant that has no free thread (seen on 2 cores)
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

import _managed_model as m  # noqa: E402  (after jax.distributed.initialize)

assert jax.device_count() == 2 * num_processes, jax.devices()
local = m.BATCH // num_processes
rows = slice(process_id * local, (process_id + 1) * local)
data = [(x[rows], y[rows]) for x, y in m.dataset()]

state = m.create("sharded")
state, history = m.train(state, data)
logs, _ = m.train_step(state, data[0])
# what comes back is readable by this process: replicated loss, local outputs
loss = float(logs.losses.loss)
assert logs.outputs.logits.shape == (local, 4), logs.outputs.logits.shape
assert len(history.collect("metrics.loss")) == m.STEPS
params = m.host_params(state)

# a typed PRNG key in the state: it can't be device_put across processes as is
keyed = m.KeyedState.create(
    params=m.init_params(),
    tx=m.optax.sgd(0.1),
    strategy="sharded",
    key=jax.random.key(3),
)
_, keyed = m.train_step(keyed, data[0])
keyed = keyed.with_strategy("jit")
assert int(keyed.step) == 1, keyed.step
assert (jax.random.key_data(keyed.key) == jax.random.key_data(jax.random.key(3))).all()

# a long loop with no host sync: without the strategy's bound on queued steps,
# XLA:CPU + gloo collectives stalled after ~100-160 queued steps
import itertools  # noqa: E402

import ciclo  # noqa: E402

long_state, long_history, _ = ciclo.loop(
    state, itertools.cycle(data), {ciclo.every(1): [m.train_step]}, stop=300
)
jax.block_until_ready(long_state)
assert len(long_history.collect("metrics.loss")) == 300

# `elapsed.samples` counts the global batch (what all processes feed), as the
# one-process run does: a stop, an epoch or a schedule in samples means the same
_, counted_history, counted = ciclo.loop(
    state, data, {ciclo.every(1): [m.train_step]}, stop=ciclo.at(samples=2 * m.BATCH)
)
assert (counted.steps, counted.samples) == (2, 2 * m.BATCH), counted
assert counted_history.collect("samples") == [0, m.BATCH], counted_history
_, _, counted = ciclo.train_loop(
    state, data, {ciclo.on_train_step: m.train_step}, stop=3,
    batch_size_fn=lambda shapes: shapes[0][0],  # the local slice's rows
)  # fmt: skip
assert (counted.steps, counted.samples) == (3, 3 * m.BATCH), counted

if process_id == 0:
    np.savez(out, loss=loss, **params)
jax.distributed.shutdown()
print(f"process {process_id} done, loss {loss:.6f}")
