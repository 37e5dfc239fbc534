"""Linear regression in pure JAX (no Flax), driven by `ciclo.loop`.

python examples/00_linear_regression.py            # 2,000 steps
CICLO_EXAMPLE_STEPS=50 python examples/00_linear_regression.py
"""

import os

import jax
import jax.numpy as jnp
import numpy as np

import ciclo

STEPS = int(os.environ.get("CICLO_EXAMPLE_STEPS", 2_000))
BATCH = 32


def dataset(key: jax.Array, true_w: jax.Array, true_b: float):
    """An endless stream of noisy `(x, y)` batches of `y = x @ w + b`."""
    while True:
        key, kx, kn = jax.random.split(key, 3)
        x = jax.random.uniform(kx, (BATCH, true_w.shape[0]), minval=-1, maxval=1)
        y = x @ true_w + true_b + 0.1 * jax.random.normal(kn, (BATCH,))
        yield np.asarray(x), np.asarray(y)


def loss_fn(params, x, y):
    return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)


@jax.jit
def train_step(params, batch):
    x, y = batch
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    params = jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)
    logs = ciclo.logs()
    logs.add_loss("mse", loss)
    return logs, params


@jax.jit
def eval_step(params, batch):
    logs = ciclo.logs()
    logs.add_metric("eval_mse", loss_fn(params, *batch))
    return logs


def main() -> float:
    true_w, true_b = jnp.array([2.0, -3.0, 0.5]), 1.0
    params = {"w": jnp.zeros(3), "b": jnp.zeros(())}
    params, history, elapsed = ciclo.loop(
        params,
        dataset(jax.random.key(0), true_w, true_b),
        {
            ciclo.every(1): [train_step],
            ciclo.every(max(STEPS // 10, 1)): [eval_step],
        },
        stop=STEPS,
    )
    steps, mse = history.collect("steps", "eval_mse")
    for s, m in zip(steps, mse):
        print(f"step {s:5d}  eval_mse {m:.4f}")
    print(f"w = {np.round(params['w'], 2)}  b = {float(params['b']):.2f}")
    print(f"{elapsed.steps} steps, {elapsed.samples} samples in {elapsed.time:.1f}s")
    return float(jnp.abs(params["w"] - true_w).max())


if __name__ == "__main__":
    error = main()
    if STEPS >= 500 and error > 0.05:
        raise SystemExit(f"did not converge: max |w - w_true| = {error:.3f}")
