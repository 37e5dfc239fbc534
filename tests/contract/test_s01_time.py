"""API.md §1 — Time: ``Elapsed``, ``Period``, ``at``, ``elapse``."""

from __future__ import annotations

import dataclasses
import time
from datetime import timedelta

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ciclo

# --------------------------------------------------------------------------- Elapsed


def test_elapsed_create_defaults():
    before = time.time()
    e = ciclo.Elapsed.create()
    after = time.time()
    assert e.steps == 0
    assert e.samples == 0
    assert before - 1 <= float(e.date) <= after + 1
    assert before - 1 <= float(e.date_start) <= after + 1
    assert float(e.time) == pytest.approx(float(e.date) - float(e.date_start), abs=1e-3)


def test_elapsed_create_with_counts():
    e = ciclo.Elapsed.create(steps=5, samples=70)
    assert e.steps == 5
    assert e.samples == 70


def test_elapsed_is_immutable():
    e = ciclo.Elapsed.create(steps=1)
    with pytest.raises((AttributeError, TypeError, dataclasses.FrozenInstanceError)):
        e.steps = 2
    assert e.steps == 1


def test_elapsed_is_a_pytree_passed_into_jit():
    e = ciclo.Elapsed.create(steps=7, samples=21)
    assert len(jax.tree_util.tree_leaves(e)) >= 2

    @jax.jit
    def f(el):
        return el.steps * 10 + el.samples

    assert int(f(e)) == 7 * 10 + 21

    # round trip through jit keeps the type and values
    out = jax.jit(lambda el: el)(e)
    assert isinstance(out, ciclo.Elapsed)
    assert int(out.steps) == 7 and int(out.samples) == 21


def test_elapsed_passed_into_jitted_loop_callback():
    @jax.jit
    def cb(state, batch, elapsed):
        return state + elapsed.steps

    state, _, _ = ciclo.loop(jnp.asarray(0), range(4), {ciclo.every(1): [cb]})
    assert int(state) == 0 + 1 + 2 + 3


def test_elapsed_date_advances_and_time_is_date_minus_start():
    seen = []
    for i, (e, _) in enumerate(ciclo.elapse(range(3))):
        seen.append(e)
        if i == 0:
            time.sleep(0.15)  # the loop runs for a while before the next batch
    dates = [float(e.date) for e in seen]
    assert dates == sorted(dates)
    last = seen[-1]
    assert float(last.time) >= 0.1
    assert float(last.time) == pytest.approx(
        float(last.date) - float(last.date_start), abs=1e-3
    )


def test_elapsed_minus_elapsed_gives_the_difference():
    a = ciclo.Elapsed.create(steps=10, samples=100)
    b = ciclo.Elapsed.create(steps=3, samples=30)
    d = a - b
    assert isinstance(d, ciclo.Elapsed)
    assert d.steps == 7
    assert d.samples == 70


# --------------------------------------------------------------------------- Period


def test_at_requires_at_least_one_field():
    with pytest.raises((ValueError, TypeError)):
        ciclo.at()


def test_at_fields_and_timedelta():
    p = ciclo.at(3, samples=10)
    assert isinstance(p, ciclo.Period)
    assert p.steps == 3 and p.samples == 10
    assert ciclo.at(time=timedelta(seconds=90)).time == pytest.approx(90.0)
    assert ciclo.at(time=2.5).time == pytest.approx(2.5)


def test_period_create_equals_at():
    assert ciclo.Period.create(steps=3, samples=7) == ciclo.at(3, samples=7)
    assert ciclo.Period.create(time=timedelta(seconds=4)) == ciclo.at(time=4)


# elapsed: steps=5, samples=50; for each period the expected result of every operator
_E = dict(steps=5, samples=50)
_CASES = [
    # single field
    (dict(steps=5), dict(ge=True, gt=False, le=True, lt=False, eq=True, ne=False)),
    (dict(steps=4), dict(ge=True, gt=True, le=False, lt=False, eq=False, ne=True)),
    (dict(steps=6), dict(ge=False, gt=False, le=True, lt=True, eq=False, ne=True)),
    # ANY field semantics: steps 5 vs 10 (smaller), samples 50 vs 50 (equal)
    (
        dict(steps=10, samples=50),
        dict(ge=True, gt=False, le=True, lt=True, eq=True, ne=True),
    ),
    # steps 5 vs 1 (greater), samples 50 vs 100 (smaller)
    (
        dict(steps=1, samples=100),
        dict(ge=True, gt=True, le=True, lt=True, eq=False, ne=True),
    ),
]
_OPS = {
    "ge": lambda a, b: a >= b,
    "gt": lambda a, b: a > b,
    "le": lambda a, b: a <= b,
    "lt": lambda a, b: a < b,
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
}


def _gap(op):
    return pytest.param(
        op,
        marks=(),
    )


@pytest.mark.parametrize(
    "op",
    [
        "ge",
        pytest.param(
            "lt",
            marks=(),
        ),
        _gap("gt"),
        _gap("le"),
        _gap("eq"),
        _gap("ne"),
    ],
)
def test_elapsed_period_comparisons_any_field(op):
    e = ciclo.Elapsed.create(**_E)
    got = [bool(_OPS[op](e, ciclo.at(**period))) for period, _ in _CASES]
    assert got == [expected[op] for _, expected in _CASES]


def test_time_period_comparison_uses_elapsed_time():
    e = ciclo.Elapsed.create()
    assert e >= ciclo.at(time=0)
    assert not (e >= ciclo.at(time=3600))
    assert e >= ciclo.at(steps=0, time=3600)  # ANY field


# --------------------------------------------------------------------------- elapse


def test_elapse_counts_steps_and_samples_before_each_batch():
    data = [np.zeros((4, 2))] * 3
    seen = list(ciclo.elapse(data))
    assert [e.steps for e, _ in seen] == [0, 1, 2]
    assert [e.samples for e, _ in seen] == [0, 4, 8]
    assert all(b is d for (_, b), d in zip(seen, data))


_LARGEST_GAP = ()


@pytest.mark.parametrize(
    "batch",
    [
        pytest.param(
            {"x": np.zeros((3, 2)), "y": np.zeros((4, 1))}, marks=_LARGEST_GAP
        ),
        {"a": np.zeros((4, 1)), "b": np.zeros((3, 2))},
        pytest.param((np.zeros((3, 2)), np.zeros((4, 1))), marks=_LARGEST_GAP),
    ],
    ids=["dict-x3-y4", "dict-a4-b3", "tuple-3-4"],
)
def test_elapse_batch_size_is_largest_first_axis(batch):
    seen = list(ciclo.elapse([batch, batch, batch]))
    assert [e.samples for e, _ in seen] == [0, 4, 8]


def test_elapse_batch_without_shaped_leaves_counts_one():
    seen = list(ciclo.elapse([5, 6, 7, 8]))
    assert [e.samples for e, _ in seen] == [0, 1, 2, 3]
    assert [b for _, b in seen] == [5, 6, 7, 8]


def test_elapse_batch_size_fn_gets_leaf_shapes_and_overrides():
    got = []

    def bs(shapes):
        got.append([tuple(s) for s in shapes])
        return 10

    batch = (np.zeros((3, 2)), np.zeros((4, 1)))
    seen = list(ciclo.elapse([batch, batch], batch_size_fn=bs))
    assert [e.samples for e, _ in seen] == [0, 10]
    assert got and got[0] == [(3, 2), (4, 1)]


def test_elapse_stop_int_steps():
    seen = list(ciclo.elapse(range(100), stop=5))
    assert [b for _, b in seen] == [0, 1, 2, 3, 4]


def test_elapse_stop_period_samples():
    data = [np.zeros((2,))] * 10
    seen = list(ciclo.elapse(data, stop=ciclo.at(samples=6)))
    assert len(seen) == 3


def test_elapse_stop_period_any_field():
    data = [np.zeros((2,))] * 10
    seen = list(ciclo.elapse(data, stop=ciclo.at(steps=10, samples=4)))
    assert len(seen) == 2


def test_elapse_initial_continues_count():
    init = ciclo.Elapsed.create(steps=10, samples=20)
    seen = list(ciclo.elapse([np.zeros(2)] * 3, initial=init))
    assert [e.steps for e, _ in seen] == [10, 11, 12]
    assert [e.samples for e, _ in seen] == [20, 22, 24]


def test_elapse_generators_and_numpy_arrays():
    gen = (np.zeros((2, 1)) for _ in range(3))
    assert [e.steps for e, _ in ciclo.elapse(gen)] == [0, 1, 2]

    arr = np.arange(15.0).reshape(5, 3)  # iterates over rows of shape (3,)
    seen = list(ciclo.elapse(arr))
    assert len(seen) == 5
    np.testing.assert_array_equal(seen[1][1], arr[1])
    assert [e.samples for e, _ in seen] == [0, 3, 6, 9, 12]
