"""Data parallelism: the same managed training step on every local device
(`data_parallel`, pmap), or on every device of several hosts (`sharded`).

One process, all local devices (GPUs, TPU cores, or forced CPU devices):

    python examples/06_data_parallel.py                        # data_parallel
    python examples/06_data_parallel.py --strategy sharded
    XLA_FLAGS="--xla_force_host_platform_device_count=4 --xla_cpu_multi_thread_eigen=false" \\
        python examples/06_data_parallel.py                    # 4 CPU devices
    CICLO_EXAMPLE_STEPS=20 python examples/06_data_parallel.py # quick run

Several hosts (one process per host; every process runs the same command with its
own --process-id; the coordinator is process 0's address and a free port):

    python examples/06_data_parallel.py --coordinator 10.0.0.1:1234 \\
        --num-processes 2 --process-id 0       # on host 0
    python examples/06_data_parallel.py --coordinator 10.0.0.1:1234 \\
        --num-processes 2 --process-id 1       # on host 1

(Try it on one machine with two terminals, 127.0.0.1 as the coordinator, and
XLA_FLAGS=--xla_force_host_platform_device_count=2.) Across processes the strategy
is always `sharded`: each process reads the SAME shuffled stream of global batches
and feeds only its own rows of each; ciclo assembles the global batch, so the result
equals a single-process run on the same total number of devices.

With several processes the `sharded` strategy bounds how many steps are queued on
the devices (`max_in_flight`, 16): without that bound, CPU processes talking
through gloo were seen to stall inside XLA's all-reduce after ~100 queued steps.
tests/test_multihost.py runs a 300-step loop across two processes.
"""

import argparse
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import ciclo
from ciclo import managed


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(128)(x))
        return nn.Dense(10)(x)


def local_batches(x, y, global_batch, seed=0):
    """This process's rows of an endless stream of shuffled global batches."""
    local = global_batch // jax.process_count()
    start = jax.process_index() * local
    rng = np.random.default_rng(seed)  # same seed everywhere: same global batches
    while True:
        order = rng.permutation(len(x))
        for i in range(0, len(x) - global_batch + 1, global_batch):
            index = order[i : i + global_batch][start : start + local]
            yield x[index], y[index]


@managed.train_step
def train_step(state, batch):
    images, labels = batch
    logits = state.apply_fn({"params": state.params}, images)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    logs = ciclo.logs()
    logs.add_loss("loss", loss, add_metric=True)  # averaged across devices
    logs.add_metric("accuracy", jnp.mean(jnp.argmax(logits, -1) == labels))
    return logs, state


def main(steps: int, strategy: str) -> float:
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=360, random_state=0, stratify=y
    )
    n = jax.device_count()
    global_batch = max(64 // n, 1) * n  # must split evenly across the devices
    model = MLP()
    state = managed.ManagedState.create(
        params=model.init(jax.random.key(0), x_train[:1])["params"],
        apply_fn=model.apply,
        tx=optax.adam(1e-3),
        strategy=strategy,
    )
    main_process = jax.process_index() == 0
    if main_process:
        print(
            f"{strategy}: {jax.process_count()} process(es), {n} device(s) "
            f"({jax.local_device_count()} local), global batch {global_batch}"
        )
    state, _, elapsed = ciclo.train_loop(
        state,
        local_batches(x_train, y_train, global_batch),
        {ciclo.on_train_step: [train_step]},
        callbacks=[ciclo.keras_bar(total=steps)] if main_process else [],
        stop=steps,
    )
    # one device's full copy of the trained state (in every process)
    host = state.with_strategy("jit")
    logits = host.apply_fn({"params": host.params}, x_test)
    accuracy = float(jnp.mean(jnp.argmax(logits, -1) == y_test))
    if main_process:
        print(
            f"{elapsed.steps} steps in {elapsed.time:.1f}s: test accuracy {accuracy:.4f}"
        )
    return accuracy


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--steps", type=int, default=int(os.environ.get("CICLO_EXAMPLE_STEPS", "600"))
    )
    parser.add_argument(
        "--strategy",
        default="data_parallel",
        choices=["data_parallel", "data_parallel_donate", "sharded"],
    )
    parser.add_argument("--coordinator", help="host:port of process 0 (multi-host)")
    parser.add_argument("--num-processes", type=int, default=1)
    parser.add_argument("--process-id", type=int, default=0)
    args = parser.parse_args()
    if args.coordinator:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU only
        jax.distributed.initialize(
            coordinator_address=args.coordinator,
            num_processes=args.num_processes,
            process_id=args.process_id,
        )
        args.strategy = "sharded"  # pmap cannot span processes
    accuracy = main(args.steps, args.strategy)
    if args.steps >= 600 and accuracy < 0.95:
        raise SystemExit(f"test accuracy {accuracy:.4f} < 0.95")
    if args.coordinator:
        jax.distributed.shutdown()
