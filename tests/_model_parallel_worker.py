"""Model-parallel (`ciclo.sharded` with a mesh, rules, fsdp) runs on forced CPU
devices, for test_model_parallel.py.

Usage: python _model_parallel_worker.py MODE DEVICES OUT.pkl [DIR]
MODE: `train` (jit vs 2x2 rules vs 1x4 fsdp, shard shapes, memory, Flax),
`save` (train a sharded state, checkpoint it into DIR), `restore` (restore DIR on
devices devices onto a fresh mesh).
"""

import os
import pickle
import sys

if __name__ == "__main__":  # (imported by _model_parallel_multihost.py)
    # forced CPU devices share one thread pool: without intra-op threading a
    # collective can't stall waiting for a participant with no free thread
    os.environ["XLA_FLAGS"] = (
        f"--xla_force_host_platform_device_count={sys.argv[2]} "
        "--xla_cpu_multi_thread_eigen=false"
    )
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec as P

import ciclo
from ciclo import managed

STEPS, BATCH = 20, 8
RULES = [("Dense_0/kernel", P(None, "model")), ("Dense_1/kernel", P("model", None))]


def init_params():
    k0, k1 = jax.random.split(jax.random.key(0))
    return {
        "Dense_0": {
            "kernel": jax.random.normal(k0, (16, 128)) * 0.1,
            "bias": jnp.zeros(128),
        },
        "Dense_1": {
            "kernel": jax.random.normal(k1, (128, 4)) * 0.1,
            "bias": jnp.zeros(4),
        },
    }


@managed.train_step
def train_step(state, batch):
    x, y = batch
    p = state.params
    h = jnp.tanh(x @ p["Dense_0"]["kernel"] + p["Dense_0"]["bias"])
    out = h @ p["Dense_1"]["kernel"] + p["Dense_1"]["bias"]
    return (
        ciclo.logs().add_loss("loss", jnp.mean((out - y) ** 2)).add_output("out", out)
    )


class State(managed.ManagedState):
    """`train_loop` finds the train step as a method."""

    train_step = train_step


def dataset():
    rng = np.random.default_rng(0)
    return [
        (
            rng.normal(size=(BATCH, 16)).astype(np.float32),
            rng.normal(size=(BATCH, 4)).astype(np.float32),
        )
        for _ in range(STEPS)
    ]


def create(strategy, tx=None):
    tx = optax.adam(1e-2) if tx is None else tx
    return State.create(params=init_params(), tx=tx, strategy=strategy)


def host(tree):
    return jax.tree.map(np.asarray, tree)


def describe(x):
    """A leaf's spec and every device's shard shape."""
    return (
        tuple(getattr(x.sharding, "spec", ())),
        sorted({tuple(s.data.shape) for s in x.addressable_shards}),
    )


def layout(state):
    """Per leaf: its spec and every device's shard shape (params and Adam mu/nu)."""
    adam = state.opt_state[0]
    return {
        "params": jax.tree.map(describe, state.params),
        "mu": jax.tree.map(describe, adam.mu),
        "nu": jax.tree.map(describe, adam.nu),
        "memory": {d.id: b for d, b in state.memory().items()},
        "kernel_bytes": {
            s.device.id: s.data.nbytes
            for s in state.params["Dense_0"]["kernel"].addressable_shards
        },
    }


def train(strategy, fused=False, tx=None):
    state = create(strategy, tx)
    step = managed.train_step(train_step.fn, steps_per_call=5) if fused else train_step
    state, history, _ = ciclo.loop(state, dataset(), {**step})
    return state, history


def flax_runs():
    """Linen and NNX models with partitioning annotations, jit vs a 2x2 mesh."""
    import flax.linen as nn
    from flax import nnx

    mesh = jax.make_mesh((2, 2), ("data", "model"))
    init = nn.initializers.lecun_normal()

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x, training=False):
            part = nn.with_partitioning
            x = nn.Dense(64, use_bias=False, kernel_init=part(init, (None, "model")))(x)
            x = nn.BatchNorm(use_running_average=not training)(x)
            x = nn.Dropout(0.1, deterministic=not training)(nn.relu(x))
            return nn.Dense(4, kernel_init=part(init, ("model", None)))(x)

    class Net(nnx.Module):
        def __init__(self, rngs):
            part = nnx.with_partitioning
            self.l1 = nnx.Linear(
                16, 64, kernel_init=part(init, (None, "model")), rngs=rngs
            )
            self.drop = nnx.Dropout(0.1, rngs=rngs)
            self.l2 = nnx.Linear(
                64, 4, kernel_init=part(init, ("model", None)), rngs=rngs
            )

        def __call__(self, x):
            return self.l2(self.drop(nnx.relu(self.l1(x))))

    losses = {"loss": lambda preds, target: jnp.mean((preds - target) ** 2)}
    with nnx.use_eager_sharding(False):
        net = Net(nnx.Rngs(0))
    makers = {
        "linen": lambda s: ciclo.create_flax_state(
            MLP(), jnp.ones((1, 16)), optax.adam(1e-2), losses=losses, strategy=s
        ),
        "nnx": lambda s: ciclo.create_flax_state(
            net, optax.adam(1e-2), losses=losses, strategy=s
        ),
    }
    out = {}
    for name, make in makers.items():
        runs = {}
        for label, strategy in (("jit", "jit"), ("mesh", ciclo.sharded(mesh))):
            state, history, _ = ciclo.train_loop(make(strategy), dataset())
            leaves = jax.tree_util.tree_flatten_with_path(state.params)[0]
            runs[label] = {
                "params": {jax.tree_util.keystr(p): np.asarray(x) for p, x in leaves},
                "batch_stats": host(jax.tree.leaves(state.batch_stats)),
                "loss": history.collect("loss"),
            }
            if label == "mesh":
                runs["specs"] = {
                    jax.tree_util.keystr(p): tuple(x.sharding.spec) for p, x in leaves
                }
                runs["param_specs"] = state.param_specs
                # what the user's functions see: plain arrays, not boxes
                runs["unboxed"] = all(isinstance(x, jax.Array) for _, x in leaves)
        out[name] = runs
    return out


def errors():
    """The messages of the construction / placement errors."""
    mesh = jax.make_mesh((2, 2), ("data", "model"))
    cases = {
        "unknown_axis": lambda: ciclo.sharded(mesh, rules=[("Dense", P("tensor"))]),
        "no_match": lambda: create(ciclo.sharded(mesh, rules=[("Conv_9", P())])),
        "not_dividing": lambda: managed.ManagedState.create(
            params={"w": jnp.ones((6, 3))},
            tx=optax.sgd(0.1),
            strategy=ciclo.sharded(mesh, rules=[("w", P(None, "model"))]),
        ),
        "bad_data_axis": lambda: ciclo.sharded(mesh, data_axis="batch"),
        "bad_batch": lambda: train_step(
            create(ciclo.sharded(mesh, rules=RULES)),
            tuple(x[:1] for x in dataset()[0]),
        ),
    }
    out = {}
    for name, fn in cases.items():
        try:
            fn()
            out[name] = None
        except (ValueError, TypeError) as error:
            out[name] = f"{type(error).__name__}: {error}"
    return out


def main():
    mode, devices, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    directory = sys.argv[4] if len(sys.argv) > 4 else None
    assert jax.device_count() == devices, jax.devices()
    results = {}
    if mode == "train":
        ref, ref_history = train("jit")
        results["jit"] = host(ref.params)
        results["jit_loss"] = ref_history.collect("loss")
        results["jit_memory"] = {d.id: b for d, b in ref.memory().items()}
        results["jit_kernel_bytes"] = ref.params["Dense_0"]["kernel"].nbytes
        mesh2 = jax.make_mesh((2, 2), ("data", "model"))
        mesh4 = jax.make_mesh((1, 4), ("data", "model"))
        for name, strategy in (
            ("rules", ciclo.sharded(mesh2, rules=RULES)),
            ("fsdp", ciclo.sharded(jax.make_mesh((4,), ("data",)), fsdp=True)),
            ("rules_1x4", ciclo.sharded(mesh4, rules=RULES)),
            ("donate", ciclo.sharded(mesh2, rules=RULES, donate=True)),
        ):
            state, history = train(strategy)
            results[name] = host(state.params)
            results[name + "_loss"] = history.collect("loss")
            results[name + "_layout"] = layout(state)
            fused = None
            if name in ("rules", "fsdp"):
                fused, _ = train(strategy, fused=True)
            if fused is not None:
                results[name + "_fused"] = host(fused.params)
                results[name + "_fused_layout"] = layout(fused)
            results[name + "_to_jit"] = host(state.with_strategy("jit").params)
        # Adafactor: the factored moments follow their parameter less one axis
        ada = optax.adafactor(1e-2, min_dim_size_to_factor=4)
        ada_jit, _ = train("jit", tx=ada)
        ada_rules, _ = train(ciclo.sharded(mesh2, rules=RULES), tx=ada)
        results["adafactor_jit"] = host(ada_jit.params)
        results["adafactor"] = host(ada_rules.params)
        factored = ada_rules.opt_state[0]
        results["adafactor_layout"] = {
            part: jax.tree.map(describe, getattr(factored, part))
            for part in ("v_row", "v_col", "v")
        }
        # outputs come back as the rows of the batch, logs readable
        logs, _ = train_step(create(ciclo.sharded(mesh2, rules=RULES)), dataset()[0])
        results["outputs_shape"] = tuple(logs.outputs.out.shape)
        results["loss_value"] = float(logs.losses.loss)
        results["flax"] = flax_runs()
        results["errors"] = errors()
    elif mode == "save":
        mesh = jax.make_mesh((2, 2), ("data", "model"))
        state = create(ciclo.sharded(mesh, rules=RULES, fsdp=True))
        state, _, _ = ciclo.train_loop(
            state, dataset(), callbacks=[ciclo.checkpoint(directory)]
        )
        results["params"] = host(state.params)
        results["mu"] = host(state.opt_state[0].mu)
        results["layout"] = layout(state)
        # resume in one line: a run stopped after 10 steps (epochs of 5 steps,
        # a checkpoint at each epoch end) goes on to 20 as if uninterrupted
        resume_dir = directory + "_resume"
        strategy = ciclo.sharded(mesh, rules=RULES, fsdp=True)
        first, _, _ = ciclo.train_loop(
            create(strategy), dataset(), epoch_duration=5, stop=10, resume=resume_dir
        )
        results["first_steps"] = int(first.step)
        again, _, elapsed = ciclo.train_loop(
            create(strategy), dataset(), epoch_duration=5, resume=resume_dir
        )
        results["resumed"] = host(again.params)
        results["resumed_steps"] = elapsed.steps
        results["resumed_layout"] = layout(again)
    elif mode == "restore":
        if devices > 1:
            mesh = jax.make_mesh((1, devices), ("data", "model"))
            strategy = ciclo.sharded(mesh, rules=RULES)
        else:
            strategy = "jit"
        target = create(strategy)
        state, elapsed = ciclo.restore(directory, target)
        results["params"] = host(state.params)
        results["mu"] = host(state.opt_state[0].mu)
        results["steps"] = elapsed.steps
        results["layout"] = layout(state)
        _, state = train_step(state, dataset()[0])  # and it trains on
        results["trained"] = int(state.step)
    with open(out, "wb") as f:
        pickle.dump(results, f)


if __name__ == "__main__":
    main()
