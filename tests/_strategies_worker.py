"""Runs every strategy on 4 forced CPU devices (see test_strategies.py).

Usage: python _strategies_worker.py OUT.pkl
Writes a pickle of plain Python / numpy results that the tests assert on.
"""

import os
import pickle
import sys

# forced CPU devices share one thread pool: without intra-op threading a collective
# can't stall waiting for a participant that has no free thread (seen on 2 cores)
os.environ["XLA_FLAGS"] = (
    "--xla_force_host_platform_device_count=4 --xla_cpu_multi_thread_eigen=false"
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import _managed_model as m
import jax
import jax.numpy as jnp
import numpy as np
from clu import metrics as clu_metrics

import ciclo
from ciclo import managed

STRATEGIES = ["jit", "jit_donate", "data_parallel", "data_parallel_donate", "sharded"]
assert jax.device_count() == 4, jax.devices()
out: dict = {"params": {}, "traces": {}, "logs": {}, "donated": {}}
data = m.dataset()

# 1. the same training run under every strategy (+ one step by hand after it)
for name in STRATEGIES:
    m.TRACES.clear()
    initial = m.create(name)
    state, history = m.train(initial, data)
    out["donated"][name] = jax.tree.leaves(initial.params)[0].is_deleted()
    out["params"][name] = m.host_params(state)
    out["traces"][name] = len(m.TRACES)
    out["logs"][name] = {
        "loss": [float(v) for v in history.collect("metrics.loss")],
        "steps_seen": [int(v) for v in history.collect("steps_seen")],
    }
    if name.startswith("data_parallel"):
        out["replicated_shape"] = state.params["w1"].shape

# 2. with_strategy round trips: jit -> data_parallel -> sharded -> eager -> jit
state = m.create("jit")
start = jax.tree.map(np.asarray, state.params)
for name in ["data_parallel", "sharded", "eager", "data_parallel_donate", "jit"]:
    state = state.with_strategy(name)
out["round_trip"] = (start, jax.tree.map(np.asarray, state.params), state.strategy)


# 3. uneven batches: a clear error naming batch size and device count
def error(name: str) -> str:
    x, y = data[0]
    try:
        m.train_step(m.create(name), (x[:10], y[:10]))
    except ValueError as e:
        return str(e)
    return "no error"


out["uneven"] = {name: error(name) for name in ["data_parallel", "sharded"]}


# 4. stateful metrics merged across devices, PRNG keys split, batch_stats averaged
class Extra(managed.ManagedState):
    key: jax.Array
    batch_stats: dict


@managed.train_step
def extra_step(state, batch):
    x, y = batch
    logits = m.apply(state.params, x)
    loss = jnp.mean((logits - jax.nn.one_hot(y, 4)) ** 2)
    logs = ciclo.logs()
    logs.add_loss("loss", loss)
    # masked average: devices hold different counts, so a plain mean would differ
    logs.add_stateful_metric(
        "masked_y", clu_metrics.Average.from_model_output(values=y * 1.0, mask=y > 1)
    )
    key, draw = jax.random.split(state.key)
    logs.add_output("noise", jax.random.uniform(draw, (x.shape[0],)))
    logs.add_output("logits", logits)
    state = state.replace(key=key, batch_stats={"mean": jnp.mean(x, axis=0)})
    return logs, state


extra = {}
for name in ["jit", "data_parallel", "sharded"]:
    state = Extra.create(
        params=m.init_params(),
        tx=m.optax.sgd(0.1, momentum=0.9),
        strategy=name,
        key=jax.random.key(1),
        batch_stats={"mean": jnp.zeros(8)},
    )
    if name == "data_parallel":
        extra["keys_per_device"] = np.asarray(jax.random.key_data(state.key))
    logs, state = extra_step(state, data[0])
    host = state.with_strategy("jit")
    extra[name] = {
        "masked_y": float(logs.stateful_metrics.masked_y),
        "noise": np.asarray(logs.outputs.noise),
        "logits": np.asarray(logs.outputs.logits),
        "batch_stats": np.asarray(host.batch_stats["mean"]),
        "params": jax.tree.map(np.asarray, host.params),
    }
x, y = data[0]
extra["expected_masked_y"] = float(y[y > 1].mean())
extra["expected_batch_mean"] = x.mean(axis=0)
out["extra"] = extra


# 5. round trip of a key and of a stateful metric held in the state; a metric
# accumulated per device is merged by with_strategy("jit")
class Carry(managed.ManagedState):
    key: jax.Array
    seen: clu_metrics.Average


@managed.step
def accumulate(state, batch):
    seen = state.seen.merge(clu_metrics.Average.from_model_output(batch))
    return None, state.replace(seen=seen)


def carried(state) -> dict:
    return {
        "key": np.asarray(jax.random.key_data(state.key)),
        "total": float(state.seen.total),
        "count": int(state.seen.count),
    }


start = Carry.create(
    params=jnp.zeros(()),
    tx=m.optax.sgd(0.1),
    key=jax.random.key(7),
    seen=clu_metrics.Average.from_model_output(jnp.arange(3.0)),
)
dp = start.with_strategy("data_parallel")
out["carry"] = {
    "start": carried(start),
    "round_trip": carried(dp.with_strategy("jit")),
    "accumulated": carried(accumulate(dp, np.arange(8.0))[1].with_strategy("jit")),
}


# 6. data_parallel: a (state, batch) step on a 3-leaf state+batch (a pmap bug with
# a None argument), integer metrics averaged, 0-d outputs not per device
@managed.train_step
def small(state, batch):
    logs = ciclo.logs()
    logs.add_loss("loss", jnp.mean((state.params - batch) ** 2))
    logs.add_metric("above_2", jnp.sum(batch > 2))
    logs.add_output("mean", jnp.mean(batch))
    return logs, state


small_logs, _ = small(
    managed.ManagedState.create(
        params=jnp.zeros(()), tx=m.optax.sgd(0.1), strategy="data_parallel"
    ),
    np.arange(8.0),
)
out["small"] = {
    "above_2": float(small_logs.metrics.above_2),
    "mean": np.asarray(small_logs.outputs.mean),
}


# 7. a stateful metric held in the state accumulates across batches and devices;
# grad_norm is the norm of the averaged gradients; lift_batch_size
class Tracked(managed.ManagedState):
    accuracy: clu_metrics.Accuracy


@managed.train_step(log_grad_norm=True)
def tracked_step(state, batch):
    x, y = batch
    logits = m.apply(state.params, x)
    loss = m.optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    logs = ciclo.logs().add_loss("loss", loss)
    logs.add_metric("batch_accuracy", jnp.mean(jnp.argmax(logits, -1) == y))
    return logs.add_stateful_metric(
        "accuracy", clu_metrics.Accuracy.from_model_output(logits=logits, labels=y)
    )


accumulated = {}
for name in ["jit", "data_parallel", "sharded"]:
    state = Tracked.create(
        params=m.init_params(),
        tx=m.optax.sgd(0.1),
        strategy=name,
        accuracy=clu_metrics.Accuracy.empty(),
    )
    _, history, _ = ciclo.loop(state, data, {**tracked_step})
    accumulated[name] = {
        "accuracy": [float(v) for v in history.collect("accuracy")],
        "grad_norm": [float(v) for v in history.collect("grad_norm")],
        "batch": [float(v) for v in history.collect("batch_accuracy")],
        "lift": ciclo.get_strategy(name).lift_batch_size(8),
    }
out["accumulated"] = accumulated

with open(sys.argv[1], "wb") as f:
    pickle.dump(out, f)
print("ok")
