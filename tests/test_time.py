import dataclasses
import datetime

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ciclo


def test_elapsed_create_and_update():
    e = ciclo.Elapsed.create(steps=2, samples=10)
    assert (e.steps, e.samples) == (2, 10)
    assert e.time == pytest.approx(0.0, abs=1e-3)
    e2 = e.update(batch_size=5)
    assert (e2.steps, e2.samples) == (3, 15)
    assert e2.date >= e.date and e2.date_start == e.date_start
    assert e2.time == pytest.approx(e2.date - e2.date_start)


def test_elapsed_is_frozen():
    e = ciclo.Elapsed.create()
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.steps = 3


def test_elapsed_is_pytree_and_jittable_without_retrace():
    traces = []

    @jax.jit
    def f(elapsed):
        traces.append(1)
        return elapsed.steps * 2 + elapsed.samples, elapsed.time

    e = ciclo.Elapsed(steps=3, samples=7, date=1.7e9 + 12.5, date_start=1.7e9)
    out, t = f(e)
    assert int(out) == 13
    # time is its own leaf, so it stays precise in float32
    assert float(t) == pytest.approx(12.5)
    f(e.update(4))
    assert len(traces) == 1
    leaves = jax.tree.leaves(e)
    assert len(leaves) == 5


def test_period_requires_a_field_and_validates():
    with pytest.raises(ValueError, match="at least one"):
        ciclo.at()
    with pytest.raises(TypeError, match="steps"):
        ciclo.at(steps=1.5)
    with pytest.raises(ValueError, match="samples must be non-negative"):
        ciclo.at(samples=-1)
    with pytest.raises(ValueError, match="time must be non-negative"):
        ciclo.at(time=-1)
    with pytest.raises(TypeError, match="time"):
        ciclo.at(time=True)


def test_numpy_numbers_are_accepted_where_periods_are_built():
    assert ciclo.at(np.int64(3)).steps == 3 and type(ciclo.at(np.int64(3)).steps) is int
    assert ciclo.at(time=np.float32(1.5)).time == 1.5
    _, _, elapsed = ciclo.loop(0, range(10), {}, stop=np.int64(3))
    assert elapsed.steps == 3


def test_period_any_field_reached():
    e = ciclo.Elapsed(steps=10, samples=100, date=1000.0, date_start=900.0)
    assert e >= ciclo.at(steps=10)
    assert not e >= ciclo.at(steps=11)
    assert e >= ciclo.at(steps=11, samples=100)
    assert e >= ciclo.at(steps=11, time=100)
    assert not e >= ciclo.at(steps=11, time=101)
    assert e >= ciclo.at(time=datetime.timedelta(seconds=99))
    assert e >= ciclo.at(date=999.0)
    assert e >= ciclo.at(date=datetime.datetime.fromtimestamp(1000.0))
    assert e >= 10 and not e >= 11


def test_elapse_counts_steps_and_samples():
    data = [np.zeros((4, 3)), np.zeros((4, 3)), np.zeros((2, 3))]
    seen = [(e.steps, e.samples, b.shape[0]) for e, b in ciclo.elapse(data)]
    assert seen == [(0, 0, 4), (1, 4, 4), (2, 8, 2)]


def test_elapse_stop_does_not_draw_extra_batches():
    drawn = []

    def gen():
        for i in range(100):
            drawn.append(i)
            yield np.zeros((2,))

    steps = [e.steps for e, _ in ciclo.elapse(gen(), stop=3)]
    assert steps == [0, 1, 2]
    assert drawn == [0, 1, 2]


def test_elapse_stop_by_samples_and_bad_stop():
    data = [np.zeros((5, 1))] * 10
    assert len(list(ciclo.elapse(data, stop=ciclo.at(samples=12)))) == 3
    with pytest.raises(TypeError, match="stop"):
        list(ciclo.elapse(data, stop="10"))


def test_elapse_initial_resumes_counts():
    initial = ciclo.Elapsed(steps=5, samples=50, date=100.0, date_start=40.0)
    (e, _), *_ = list(ciclo.elapse([1, 2], initial=initial))
    assert (e.steps, e.samples) == (5, 50)
    assert e.time == pytest.approx(60.0, abs=1.0)  # the clock restarts, time kept


@dataclasses.dataclass
class _Batch:
    x: np.ndarray
    y: np.ndarray


@pytest.mark.parametrize(
    "batch, expected",
    [
        ((np.zeros((7, 2)), np.zeros((7,))), 7),
        ({"x": jnp.zeros((3, 2)), "y": jnp.zeros((3,))}, 3),
        (_Batch(np.zeros((6, 1)), np.zeros(6)), 6),
        (jnp.zeros((9, 9)), 9),
        (5, 1),
        ("text", 1),
        ((np.float32(1.0), np.zeros((4, 2))), 4),
    ],
)
def test_batch_size_from_any_pytree(batch, expected):
    (_, _), (e, _) = list(ciclo.elapse([batch, batch]))
    assert e.samples == expected


def test_batch_size_fn_gets_leaf_shapes():
    got = []

    def fn(shapes):
        got.append(shapes)
        return 11

    data = [(np.zeros((2, 3)), np.zeros((2,)))] * 2
    (_, _), (e, _) = list(ciclo.elapse(data, batch_size_fn=fn))
    assert e.samples == 11
    assert got[0] == [(2, 3), (2,)]
