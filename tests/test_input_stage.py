"""The input stage (API.md §9): the placed batch travels with its batch, so a
loader that refills one buffer for every batch (pooled loaders do) trains on the
right data — read ahead (`prefetch=1`), fused (`steps_per_call`), and both."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ciclo
from ciclo import managed

N = 8


class RefillingLoader:
    """Hands out the same two arrays every time, refilled with batch i's values
    (x == i everywhere, y == i % 4)."""

    def __init__(self, n=N):
        self.n = n
        self.x = np.zeros((4, 3), np.float32)
        self.y = np.zeros((4,), np.int32)

    def __iter__(self):
        for i in range(self.n):
            self.x[...] = i
            self.y[...] = i % 4
            yield self.x, self.y


def seen(state, batch):
    x, y = batch
    loss = jnp.mean((x @ state.params["w"]) ** 2) * 0.0
    logs = ciclo.logs().add_loss("loss", loss)
    return logs.add_metrics(x_seen=x[0, 0], y_seen=y[0].astype(jnp.float32)), state


HOST: list[float] = []


def host_seen(state, batch):
    """A plain (unmanaged) callback beside the step: the host batch it gets (a
    fused call's `ciclo.Steps` holds its batches stacked)."""
    if isinstance(batch, ciclo.Steps):
        HOST.extend(np.asarray(batch.batch[0])[:, 0, 0].tolist())
    else:
        HOST.append(float(np.asarray(batch[0])[0, 0]))


def create():
    params = {"w": np.ones((3, 1), np.float32)}
    return managed.ManagedState.create(params=params, tx=optax.sgd(0.1))


@pytest.mark.parametrize("loop", ["loop", "train_loop"])
@pytest.mark.parametrize("prefetch, steps_per_call", [(1, 1), (0, 4), (1, 4), (2, 3)])
def test_a_loader_refilling_one_buffer_trains_on_the_right_data(
    loop, prefetch, steps_per_call
):
    step = managed.train_step(seen, steps_per_call=steps_per_call)
    HOST.clear()
    kwargs = dict(prefetch=prefetch, steps_per_call=steps_per_call)
    if loop == "loop":
        tasks = {ciclo.every(1): [step, host_seen]}
        _, history, elapsed = ciclo.loop(create(), RefillingLoader(), tasks, **kwargs)
    else:
        tasks = {ciclo.on_train_step: [step, host_seen]}
        _, history, elapsed = ciclo.train_loop(
            create(), RefillingLoader(), tasks, **kwargs
        )
    assert elapsed.steps == N
    steps, x_seen, y_seen = history.collect("steps", "x_seen", "y_seen")
    assert steps == list(range(N))
    assert x_seen == [float(i) for i in range(N)]  # not [3, 3, 3, 3, 7, ...]
    assert y_seen == [float(i % 4) for i in range(N)]
    # a plain callback beside it gets the dataset's values, not the next refill's
    assert [float(i) for i in range(N)] == HOST
