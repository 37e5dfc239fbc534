"""Model parallelism: a 2-D (data x model) mesh, sharding rules and FSDP.

`ciclo.sharded(mesh, rules=..., fsdp=...)` splits the batch on the mesh's `data`
axis and the parameters, with the Adam moments that mirror them, as the rules say
(here the Megatron layout: the first layer's columns and the second layer's rows on
`model`, both also split on `data`); with `fsdp=True` the remaining large
parameters are sharded on `data`.
Each device then holds only its shards; the script prints the per-device bytes of
parameters + optimizer state against the replicated (`"sharded"`) case.

On a CPU-only machine the script forces 4 CPU devices (it sets XLA_FLAGS to
"--xla_force_host_platform_device_count=4 --xla_cpu_multi_thread_eigen=false"
before importing jax, unless XLA_FLAGS is already set), so the mesh is 2 x 2:

    python examples/08_model_parallel.py
    CICLO_EXAMPLE_STEPS=20 python examples/08_model_parallel.py    # quick run

On a GPU host the same command uses the GPUs (the flag only concerns the CPU
platform): with 8 GPUs the mesh is 4 x 2. Under `jax.distributed` (one process
per host, the same command on each with its own --process-id) the mesh spans every
host's devices, each process holding one row of it; each process feeds its own rows
of every global batch:

    python examples/08_model_parallel.py --coordinator 10.0.0.1:1234 \\
        --num-processes 2 --process-id 0       # on host 0 (and 1 on host 1)

(Try it on one machine with two terminals, 127.0.0.1 as the coordinator and
XLA_FLAGS="--xla_force_host_platform_device_count=2
--xla_cpu_multi_thread_eigen=false": a 2 x 2 mesh.)
"""

import argparse
import os

# 4 CPU devices unless XLA_FLAGS says otherwise (forced CPU devices share one thread
# pool: without eigen's intra-op threads a collective can't wait on a busy thread)
os.environ.setdefault(
    "XLA_FLAGS",
    "--xla_force_host_platform_device_count=4 --xla_cpu_multi_thread_eigen=false",
)

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import ciclo

RULES = [
    # Megatron layout on `model` (columns, then rows), each also split on `data`
    # (FSDP-style: gathered inside the step, never stored whole)
    ("Dense_0/kernel", P("data", "model")),
    ("Dense_0/bias", P("model")),
    ("Dense_1/kernel", P("model", "data")),
]


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(512)(x))
        x = nn.relu(nn.Dense(512)(x))
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


def make_mesh() -> Mesh:
    """(devices / 2) x 2, rows in process order (a process holds whole rows)."""
    n = jax.device_count()
    model = 2 if n % 2 == 0 else 1
    return Mesh(np.array(jax.devices()).reshape(n // model, model), ("data", "model"))


def kib(state) -> str:
    per_device = state.memory()  # {device: bytes of params + optimizer state}
    return ", ".join(
        f"{d.id}: {b / 1024:.0f}"
        for d, b in sorted(per_device.items(), key=lambda item: item[0].id)
    )


def main(steps: int) -> float:
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=360, random_state=0, stratify=y
    )
    mesh = make_mesh()
    strategy = ciclo.sharded(mesh, rules=RULES, fsdp=True)
    global_batch = 64 // mesh.shape["data"] * mesh.shape["data"]
    create = lambda strategy: ciclo.create_flax_state(
        MLP(), x_train[:1], optax.adam(1e-3), strategy=strategy,
        losses={"loss": optax.softmax_cross_entropy_with_integer_labels},
        metrics={"accuracy": lambda preds, target: preds.argmax(-1) == target},
    )  # fmt: skip
    state = create(strategy)
    replicated = create("sharded")  # (every process: placing is collective)
    main_process = jax.process_index() == 0
    if main_process:
        print(
            f"mesh {dict(mesh.shape)} over {jax.device_count()} device(s) in "
            f"{jax.process_count()} process(es); global batch {global_batch}"
        )
        print(f"KiB per device, replicated: {kib(replicated)}")
        print(f"KiB per device, rules+fsdp: {kib(state)}")
        kernel = state.params["Dense_1"]["kernel"]
        print(
            f"Dense_1/kernel {kernel.shape}: spec {kernel.sharding.spec}, shard "
            f"{kernel.addressable_shards[0].data.shape}"
        )
    del replicated
    state, _, elapsed = ciclo.train_loop(
        state,
        local_batches(x_train, y_train, global_batch),
        callbacks=[ciclo.keras_bar(total=steps)] if main_process else [],
        stop=steps,
    )
    host = state.with_strategy("jit")  # the whole model on one device
    accuracy = float(jnp.mean(host.model(x_test).argmax(-1) == y_test))
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
    parser.add_argument("--coordinator", help="host:port of process 0 (multi-host)")
    parser.add_argument("--num-processes", type=int, default=1)
    parser.add_argument("--process-id", type=int, default=0)
    args = parser.parse_args()
    if args.coordinator:
        # (the CPU backend's collectives across processes; GPUs use NCCL)
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(
            coordinator_address=args.coordinator,
            num_processes=args.num_processes,
            process_id=args.process_id,
        )
    accuracy = main(args.steps)
    if args.steps >= 600 and accuracy < 0.95:
        raise SystemExit(f"test accuracy {accuracy:.4f} < 0.95")
    if args.coordinator:
        jax.distributed.shutdown()
