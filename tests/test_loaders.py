"""Real data loaders (API.md §1: "works with any iterable: lists, generators,
tf.data/Grain/PyTorch loaders"; docs/resume.md: a Grain iterator's position is
saved with each checkpoint and given back with `set_state`).

Grain is a test dependency. PyTorch is not (a CPU build is large): its tests
skip without it, and `.ci/run` installs it and runs them (`-k torch`).
Public API only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ciclo
from ciclo import managed

N, BATCH = 48, 4  # 12 batches


def records() -> list[dict]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, 3)).astype(np.float32)
    return [
        {"x": x[i], "y": np.float32(x[i].sum()), "idx": np.int32(i)} for i in range(N)
    ]


def numpy_batches(order: list[int] | None = None) -> list[dict]:
    rows = records()
    order = list(range(N)) if order is None else order
    return [
        {k: np.stack([rows[i][k] for i in order[b : b + BATCH]]) for k in rows[0]}
        for b in range(0, N, BATCH)
    ]


def fit(state, batch):
    loss = jnp.mean((batch["x"] @ state.params - batch["y"]) ** 2)
    # the batch's first record: the order the step saw, one history row a step
    return ciclo.logs().add_loss("loss", loss).add_metric("first", batch["idx"][0])


step = managed.train_step(fit)
fused_step = managed.train_step(fit, steps_per_call=4)


def create() -> managed.ManagedState:
    return managed.ManagedState.create(
        params=np.zeros(3, np.float32), tx=optax.sgd(0.05), strategy="jit"
    )


def firsts(history) -> list[int]:
    return [int(v) for v in history.collect("first")]


# -- Grain -----------------------------------------------------------------------
grain = pytest.importorskip("grain")


def grain_dataset():
    """Shuffled records in batches: its iterator is checkpointable."""
    return grain.MapDataset.source(records()).shuffle(seed=0).batch(BATCH)


def grain_order() -> list[int]:
    return [int(b["idx"][0]) for b in grain_dataset().to_iter_dataset()]


def test_a_grain_iterator_trains_its_batches_in_order():
    expected = grain_order()
    assert expected != [i * BATCH for i in range(N // BATCH)]  # shuffled
    data = iter(grain_dataset().to_iter_dataset())
    _, history, elapsed = ciclo.loop(create(), data, {ciclo.every(1): step})
    assert firsts(history) == expected
    assert (elapsed.steps, elapsed.samples) == (N // BATCH, N)


@pytest.mark.parametrize("steps_per_call", [1, 4])
def test_a_resumed_grain_iterator_trains_each_batch_once_in_order(
    tmp_path, steps_per_call
):
    """Stopped at step 5, the same call again with a fresh iterator and a later
    stop: the position saved with the checkpoint is given to the iterator (no
    batch read back and skipped: that would warn, an error here), and the run
    equals one that was never stopped, row for row and bit for bit."""
    train = step if steps_per_call == 1 else fused_step

    def run(stop, resume=None):
        data = iter(grain_dataset().to_iter_dataset())
        return ciclo.train_loop(
            create(), data, {ciclo.on_train_step: train},
            stop=stop, resume=resume, steps_per_call=steps_per_call,
        )  # fmt: skip

    whole, whole_history, _ = run(12)
    first, first_history, elapsed = run(5, resume=tmp_path)
    assert elapsed.steps == 5 and firsts(first_history) == grain_order()[:5]
    resumed, history, elapsed = run(12, resume=tmp_path)
    assert elapsed.steps == 12
    assert firsts(history) == firsts(whole_history) == grain_order()
    assert history.collect("steps") == list(range(12))
    np.testing.assert_array_equal(np.asarray(resumed.params), np.asarray(whole.params))


def test_a_grain_dataset_as_a_factory_of_the_start_step(tmp_path):
    batched = grain_dataset()

    def run(stop):
        return ciclo.train_loop(
            create(), lambda start: iter(batched[start:]),
            {ciclo.on_train_step: step}, stop=stop, resume=tmp_path,
        )  # fmt: skip

    run(7)
    _, history, _ = run(12)
    assert firsts(history) == grain_order()


# -- PyTorch ---------------------------------------------------------------------
def torch_loader(**kwargs):
    torch = pytest.importorskip("torch")
    return torch.utils.data.DataLoader(records(), batch_size=BATCH, **kwargs)


def test_torch_default_collate_batches_reach_callbacks_as_numpy():
    """A DataLoader's default collate gives torch tensors; the loop hands its
    callbacks numpy arrays (what a jitted step takes), with the loader's values."""
    seen = []

    def record(state, batch):
        seen.append({k: (type(v), v.dtype, v.shape) for k, v in batch.items()})
        assert np.array_equal(batch["idx"], np.arange(BATCH) + BATCH * len(seen[1:]))
        return None, state

    @jax.jit
    def jitted(params, batch):
        grad = jax.grad(lambda p: jnp.mean((batch["x"] @ p - batch["y"]) ** 2))
        return ciclo.logs().add_metric("first", batch["idx"][0]), params - 0.05 * (
            grad(params)
        )

    params, history, elapsed = ciclo.loop(
        np.zeros(3, np.float32), torch_loader(), {ciclo.every(1): [record, jitted]}
    )
    assert elapsed.samples == N and firsts(history) == list(range(0, N, BATCH))
    assert seen[0] == {
        "x": (np.ndarray, np.float32, (BATCH, 3)),
        "y": (np.ndarray, np.float32, (BATCH,)),
        "idx": (np.ndarray, np.int32, (BATCH,)),
    }
    reference, _, _ = ciclo.loop(
        np.zeros(3, np.float32), numpy_batches(), {ciclo.every(1): jitted}
    )
    np.testing.assert_array_equal(np.asarray(params), np.asarray(reference))


@pytest.mark.parametrize("steps_per_call", [1, 4])
def test_torch_default_collate_under_train_loop_equals_numpy_batches(steps_per_call):
    """Managed steps, fused or not, over two epochs of a shuffled DataLoader
    (a new pass each epoch) train as over the same batches given as numpy."""
    torch = pytest.importorskip("torch")
    generator = torch.Generator().manual_seed(0)
    loader = torch_loader(shuffle=True, generator=generator)
    train = step if steps_per_call == 1 else fused_step
    state, history, elapsed = ciclo.train_loop(
        create(), loader, {ciclo.on_train_step: train},
        epochs=2, steps_per_call=steps_per_call,
    )  # fmt: skip
    assert elapsed.steps == 2 * N // BATCH
    order = firsts(history)
    assert order[:12] != order[12:]  # reshuffled: two passes
    # the same batches as numpy, in the order the loader gave them
    generator.manual_seed(0)
    passes = [
        [int(i) for b in loader for i in b["idx"]] for _ in range(2)
    ]  # the loader's two permutations, drawn again from the same seed
    batches = numpy_batches(passes[0]) + numpy_batches(passes[1])
    reference, ref_history, _ = ciclo.loop(
        create(), batches, {ciclo.every(1): train}, steps_per_call=steps_per_call
    )
    assert order == firsts(ref_history)
    np.testing.assert_array_equal(
        np.asarray(state.params), np.asarray(reference.params)
    )


def test_torch_bfloat16_tensors_become_jax_bfloat16_arrays():
    """numpy has no bfloat16: the tensor's bits are read as jax's (ml_dtypes)
    bfloat16, the values unchanged, fused or not."""
    torch = pytest.importorskip("torch")
    batch = {"w": torch.tensor([1.5, -2.25, 3.0, 0.0], dtype=torch.bfloat16)}
    seen = []

    def record(state, batch):
        seen.append(batch["w"])
        return None, state

    ciclo.loop(None, [batch] * 2, {ciclo.every(1): record})
    assert str(seen[0].dtype) == "bfloat16"
    assert seen[0].astype(np.float32).tolist() == [1.5, -2.25, 3.0, 0.0]
    assert float(jax.jit(jnp.sum)(seen[0])) == 2.25
    (fused,) = ciclo.fuse([batch] * 2, 2)
    assert str(fused.batch["w"].dtype) == "bfloat16" and fused.batch["w"].shape == (
        2,
        4,
    )
