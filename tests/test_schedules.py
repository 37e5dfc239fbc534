"""Schedules (API.md §2): every, after, after().every, piecewise, always, never, &|~."""

from __future__ import annotations

import datetime
import doctest
import importlib
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ciclo
from ciclo._schedules import fresh as _fresh

DATE_START = 1_700_000_000.0
FEW = settings(max_examples=60, deadline=None)


def E(steps: int, samples: int = 0, time: float = 0.0) -> ciclo.Elapsed:
    """A synthetic Elapsed: `time` seconds after a fixed start date."""
    return ciclo.Elapsed(steps, samples, DATE_START + time, DATE_START)


def run(schedule, seq) -> list[bool]:
    return [bool(schedule(e)) for e in seq]


def fired_steps(schedule, seq) -> list[int]:
    return [e.steps for e in seq if schedule(e)]


def by_steps(n: int, start: int = 0) -> list[ciclo.Elapsed]:
    return [E(s, samples=8 * s, time=0.5 * s) for s in range(start, start + n)]


def build_seq(start: int, batches: list[int], gaps: list[float]) -> list:
    """Consecutive steps from `start`, non-decreasing samples and time."""
    seq, samples, time = [], 10 * start, 1.5 * start
    for i, (batch, gap) in enumerate(zip(batches, gaps)):
        seq.append(E(start + i, samples, time))
        samples, time = samples + batch, time + gap
    return seq


@st.composite
def sequences(draw, max_len: int = 60):
    n = draw(st.integers(0, max_len))
    start = draw(st.integers(0, 40))
    batches = draw(st.lists(st.integers(0, 40), min_size=n, max_size=n))
    gaps = draw(st.lists(st.floats(0, 4, allow_nan=False), min_size=n, max_size=n))
    return build_seq(start, batches, gaps)


# ---------------------------------------------------------------- every


def test_every_steps_fires_at_multiples_including_zero():
    s = ciclo.every(3)
    assert fired_steps(s, by_steps(10)) == [0, 3, 6, 9]
    assert fired_steps(ciclo.every(steps=1), by_steps(4)) == [0, 1, 2, 3]
    assert repr(s) == "every(steps=3)"


def test_every_steps_is_stateless_and_resumes():
    s = ciclo.every(4)
    assert fired_steps(s, by_steps(5, start=10)) == [12]
    # order and repetition of calls do not matter
    assert [s(E(8)), s(E(8)), s(E(3)), s(E(0))] == [True, True, False, True]


def test_every_samples_fires_first_then_since_last_firing():
    s = ciclo.every(samples=100)
    samples = [0, 30, 60, 90, 120, 150, 210, 215, 330]
    fired = [n for i, n in enumerate(samples) if s(E(i, n))]
    # 0 fires (first call); 120 - 0 >= 100; 210 < 220; 330 - 120 >= 100
    assert fired == [0, 120, 330]
    assert repr(s) == "every(samples=100)"


def test_every_samples_first_call_fires_when_resuming():
    s = ciclo.every(samples=100)
    assert run(s, [E(50, 5_000), E(51, 5_050), E(52, 5_100)]) == [True, False, True]


def test_every_time_seconds_and_timedelta():
    times = [0.0, 0.4, 1.0, 1.9, 2.0, 2.5, 3.1]
    for s in (ciclo.every(time=1), ciclo.every(time=datetime.timedelta(seconds=1))):
        fired = [t for i, t in enumerate(times) if s(E(i, time=t))]
        assert fired == [0.0, 1.0, 2.0, 3.1]
    assert repr(ciclo.every(time=datetime.timedelta(minutes=1))) == "every(time=60.0)"
    assert repr(ciclo.every(time=2.5)) == "every(time=2.5)"


def test_every_fresh_resets_state():
    s = ciclo.every(samples=10)
    assert run(s, [E(0, 0), E(1, 5)]) == [True, False]
    copy = s.fresh()
    assert copy is not s and repr(copy) == repr(s)
    assert copy(E(0, 5)) is True  # a fresh copy fires on its first call
    assert s(E(2, 9)) is False  # the original keeps its own state


def test_every_accepts_numpy_ints():
    assert fired_steps(ciclo.every(np.int64(2)), by_steps(5)) == [0, 2, 4]
    assert repr(ciclo.every(samples=np.int32(5))) == "every(samples=5)"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "exactly one of steps, samples or time; got none"),
        ({"steps": 2, "samples": 3}, "got steps=2, samples=3"),
        ({"samples": 3, "time": 1.0}, "got samples=3, time=1.0"),
        ({"steps": 0}, r"every\(steps=...\)` must be positive"),
        ({"steps": -2}, "must be positive .* got -2"),
        ({"samples": 0}, r"every\(samples=...\)` must be positive"),
        ({"time": 0}, r"every\(time=...\)` must be positive"),
        ({"time": datetime.timedelta(0)}, "must be positive"),
        ({"time": math.inf}, "finite"),
        ({"time": math.nan}, "finite"),
    ],
)
def test_every_value_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ciclo.every(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"steps": 1.5}, r"every\(steps=...\)` must be an int; got 1.5 \(float\)"),
        ({"steps": True}, "must be an int; got True"),
        ({"samples": "10"}, "must be an int; got '10' .str."),
        ({"time": "1s"}, "number of seconds or a datetime.timedelta"),
    ],
)
def test_every_type_errors(kwargs, match):
    with pytest.raises(TypeError, match=match):
        ciclo.every(**kwargs)


# ---------------------------------------------------------------- after


def test_after_steps_samples_time():
    assert fired_steps(ciclo.after(3), by_steps(6)) == [3, 4, 5]
    assert fired_steps(ciclo.after(0), by_steps(3)) == [0, 1, 2]
    # by_steps: samples = 8 * steps, time = 0.5 * steps
    assert fired_steps(ciclo.after(samples=20), by_steps(5)) == [3, 4]
    assert fired_steps(ciclo.after(time=1.0), by_steps(4)) == [2, 3]
    td = ciclo.after(time=datetime.timedelta(seconds=1))
    assert fired_steps(td, by_steps(4)) == [2, 3]
    assert repr(ciclo.after(samples=20)) == "after(samples=20)"


def test_after_several_fields_fire_when_any_is_reached():
    s = ciclo.after(10, samples=16)
    assert fired_steps(s, by_steps(4)) == [2, 3]
    assert repr(s) == "after(steps=10, samples=16)"


def test_after_accepts_a_period():
    s = ciclo.after(ciclo.at(date=DATE_START + 1.0))
    assert fired_steps(s, by_steps(4)) == [2, 3]
    assert repr(s).startswith("after(at(date=")
    with pytest.raises(ValueError, match="got a Period .* and also samples=3"):
        ciclo.after(ciclo.at(steps=2), samples=3)


def test_after_errors():
    with pytest.raises(ValueError, match=r"after\(\)` needs at least one .* got none"):
        ciclo.after()
    with pytest.raises(ValueError, match=r"after\(steps=...\)` must be non-negative"):
        ciclo.after(-1)
    with pytest.raises(ValueError, match=r"after\(time=...\)` must be non-negative"):
        ciclo.after(time=-0.5)
    with pytest.raises(TypeError, match=r"after\(samples=...\)` must be an int"):
        ciclo.after(samples=2.0)


# ---------------------------------------------------------------- after().every()


def test_after_every_steps():
    s = ciclo.after(3).every(5)
    assert fired_steps(s, by_steps(16)) == [3, 8, 13]
    assert repr(s) == "after(steps=3).every(steps=5)"


def test_after_every_steps_is_stateless_when_resuming():
    s = ciclo.after(3).every(5)
    assert fired_steps(s, by_steps(10, start=10)) == [13, 18]
    assert s.stateless


def test_after_samples_every_steps_counts_from_first_firing():
    s = ciclo.after(samples=20).every(2)  # samples = 8 * steps: reached at step 3
    assert fired_steps(s, by_steps(10)) == [3, 5, 7, 9]
    assert not s.stateless


def test_after_steps_every_samples():
    s = ciclo.after(2).every(samples=20)  # samples 16, 24, 32, 40, 48, 56, ...
    assert [8 * st for st in fired_steps(s, by_steps(10))] == [16, 40, 64]


def test_after_time_every_time():
    s = ciclo.after(time=1).every(time=1.5)  # time = 0.5 * steps
    assert [0.5 * st for st in fired_steps(s, by_steps(12))] == [1.0, 2.5, 4.0, 5.5]
    assert repr(s) == "after(time=1).every(time=1.5)"


def test_after_every_fresh_resets_anchor():
    s = ciclo.after(samples=20).every(2)
    assert fired_steps(s, by_steps(6)) == [3, 5]
    assert fired_steps(s.fresh(), by_steps(6, start=4)) == [4, 6, 8]


def test_after_every_errors():
    with pytest.raises(ValueError, match="exactly one of steps, samples or time"):
        ciclo.after(3).every()
    with pytest.raises(ValueError, match="got steps=1, time=2"):
        ciclo.after(3).every(1, time=2)
    with pytest.raises(ValueError, match="must be positive"):
        ciclo.after(3).every(0)


# ---------------------------------------------------------------- piecewise


def test_piecewise_uses_last_boundary_reached():
    s = ciclo.piecewise(ciclo.every(1), {4: ciclo.every(2), 8: ciclo.every(4)})
    assert fired_steps(s, by_steps(14)) == [0, 1, 2, 3, 4, 6, 8, 12]
    assert (
        repr(s) == "piecewise(every(steps=1), {4: every(steps=2), 8: every(steps=4)})"
    )


def test_piecewise_period_boundaries_and_plain_callables():
    s = ciclo.piecewise(
        lambda e: e.steps == 1,
        {ciclo.at(samples=24): ciclo.never(), ciclo.at(samples=48): ciclo.always()},
    )
    assert fired_steps(s, by_steps(8)) == [1, 6, 7]
    assert "at(samples=24): never()" in repr(s)


def test_a_piece_counts_from_its_boundary_as_in_ciclo_0_1():
    # "from step 5, every 3": 5, 8, 11 (the original Ciclo's pieces got the
    # elapsed since they started), also when a run resumes past the boundary
    s = ciclo.piecewise(ciclo.never(), {5: ciclo.every(3)})
    assert fired_steps(s, by_steps(14)) == [5, 8, 11]
    assert fired_steps(s.fresh(), by_steps(7, start=7)) == [8, 11]
    assert fired_steps(ciclo.after(5).every(3), by_steps(14)) == [5, 8, 11]
    # a boundary in samples shifts the samples (8 per step: 40 at step 5)
    s = ciclo.piecewise(
        ciclo.never(), {ciclo.at(samples=40): lambda e: e.samples % 24 == 0}
    )
    assert fired_steps(s, by_steps(14)) == [5, 8, 11]


def test_piecewise_stateful_piece_starts_at_its_boundary():
    s = ciclo.piecewise(ciclo.never(), {3: ciclo.every(samples=20)})
    # only the active piece is called: it fires on its first call (step 3, samples 24)
    assert fired_steps(s, by_steps(10)) == [3, 6, 9]


def test_piecewise_fresh_copies_children():
    child = ciclo.every(samples=20)
    s = ciclo.piecewise(child, {})
    copy = s.fresh()
    assert copy.initial is not child
    assert fired_steps(copy, by_steps(5)) == [0, 3]
    assert child(E(0, 0)) is True  # the original child was never advanced


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((3, {}), TypeError, r"initial_schedule, ...\) must be a schedule .* got 3"),
        ((ciclo.never(), [(3, ciclo.always())]), TypeError, "must be a dict"),
        ((ciclo.never(), {"3": ciclo.always()}), TypeError, "boundary '3'"),
        ((ciclo.never(), {2.5: ciclo.always()}), TypeError, r"boundary 2\.5"),
        ((ciclo.never(), {True: ciclo.always()}), TypeError, "boundary True"),
        ((ciclo.never(), {-1: ciclo.always()}), ValueError, "-1 is negative"),
        ((ciclo.never(), {3: "every"}), TypeError, "boundary 3 maps to 'every'"),
        (
            (ciclo.never(), {8: ciclo.always(), 4: ciclo.never()}),
            ValueError,
            "increasing order, but 4 comes after 8",
        ),
        (
            (
                ciclo.never(),
                {
                    ciclo.at(samples=9): ciclo.always(),
                    1: ciclo.never(),
                    ciclo.at(samples=5): ciclo.never(),
                },
            ),
            ValueError,
            "its samples is not later",
        ),
        (
            (ciclo.never(), {5: ciclo.always(), ciclo.at(steps=5): ciclo.never()}),
            ValueError,
            "increasing order",
        ),
    ],
)
def test_piecewise_errors(args, error, match):
    with pytest.raises(error, match=match):
        ciclo.piecewise(*args)


# ---------------------------------------------------------------- always / never / combinators


def test_always_never():
    seq = by_steps(3)
    assert run(ciclo.always(), seq) == [True] * 3
    assert run(ciclo.never(), seq) == [False] * 3
    assert (repr(ciclo.always()), repr(ciclo.never())) == ("always()", "never()")
    # distinct objects: two `always()` keys are two tasks
    assert len({ciclo.always(): 1, ciclo.always(): 2}) == 2


def test_combinators_accept_plain_callables():
    late = lambda e: e.steps > 3
    assert fired_steps(ciclo.every(2) & late, by_steps(10)) == [4, 6, 8]
    assert fired_steps(late & ciclo.every(3), by_steps(10)) == [6, 9]
    assert fired_steps(late | ciclo.every(3), by_steps(6)) == [0, 3, 4, 5]
    assert fired_steps(~ciclo.every(2), by_steps(6)) == [1, 3, 5]
    assert repr(ciclo.every(2) & ~ciclo.never()) == "(every(steps=2) & ~never())"
    with pytest.raises(TypeError, match="Cannot combine a schedule with 3"):
        ciclo.every(2) & 3


def test_schedule_reused_by_two_loops_shares_no_state():
    fired = []
    s = ciclo.every(samples=5)
    data = [np.zeros((2,))] * 6  # 2 samples per batch: fires at 0, 6, (12)
    for _ in range(2):
        ciclo.loop(
            None, data, {s: lambda state, batch, elapsed: fired.append(elapsed.samples)}
        )
    assert fired == [0, 6, 0, 6]


def test_docstring_examples_run():
    for name in ("base", "every", "after", "piecewise", "constant"):
        module = importlib.import_module(f"ciclo._schedules.{name}")
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.failed == 0, name
        assert result.attempted > 0, name


# ---------------------------------------------------------------- properties
# A schedule "spec" is a small tuple; `build` makes the real schedule and `model`
# computes its firings over a sequence with simple, independent reference code.

VALUE = {
    "steps": lambda e: e.steps,
    "samples": lambda e: e.samples,
    "time": lambda e: e.time,
}
EVERY_AMOUNT = {
    "steps": st.integers(1, 7),
    "samples": st.integers(1, 100),
    "time": st.one_of(st.integers(1, 6), st.floats(0.1, 8.0)),
}
AFTER_AMOUNT = {
    "steps": st.integers(0, 60),
    "samples": st.integers(0, 600),
    "time": st.floats(0.0, 60.0),
}
UNIT = st.sampled_from(["steps", "samples", "time"])


def every_spec():
    return UNIT.flatmap(lambda u: EVERY_AMOUNT[u].map(lambda n: ("every", u, n)))


def after_every_spec():
    return st.tuples(UNIT, UNIT).flatmap(
        lambda us: st.tuples(AFTER_AMOUNT[us[0]], EVERY_AMOUNT[us[1]]).map(
            lambda ns: ("after_every", us[0], ns[0], us[1], ns[1])
        )
    )


def leaf_spec():
    after = UNIT.flatmap(lambda u: AFTER_AMOUNT[u].map(lambda n: ("after", u, n)))
    constants = st.sampled_from([("always",), ("never",), ("plain", 3)])
    return st.one_of(every_spec(), after_every_spec(), after, constants)


def boundaries():
    steps = st.lists(st.integers(0, 80), unique=True, max_size=3).map(sorted)
    samples = st.lists(st.integers(0, 900), unique=True, max_size=3).map(sorted)
    return st.one_of(steps, samples.map(lambda xs: [ciclo.at(samples=x) for x in xs]))


def spec_trees():
    def extend(children):
        pieces = boundaries().flatmap(
            lambda keys: st.tuples(
                children, st.lists(children, min_size=len(keys), max_size=len(keys))
            ).map(lambda c: ("piecewise", c[0], list(zip(keys, c[1]))))
        )
        return st.one_of(
            st.tuples(st.just("and"), children, children),
            st.tuples(st.just("or"), children, children),
            st.tuples(st.just("not"), children),
            pieces,
        )

    return st.recursive(leaf_spec(), extend, max_leaves=6)


def as_schedule(schedule):
    """A plain callable wrapped as a Schedule (a piecewise with no boundaries)."""
    if isinstance(schedule, ciclo.Schedule):
        return schedule
    return ciclo.piecewise(schedule, {})


def build(spec):
    kind = spec[0]
    if kind == "every":
        return ciclo.every(**{spec[1]: spec[2]})
    if kind == "after":
        return ciclo.after(**{spec[1]: spec[2]})
    if kind == "after_every":
        return ciclo.after(**{spec[1]: spec[2]}).every(**{spec[3]: spec[4]})
    if kind == "always":
        return ciclo.always()
    if kind == "never":
        return ciclo.never()
    if kind == "plain":
        return lambda e: e.steps % spec[1] == 1
    if kind in ("and", "or"):
        a, b = build(spec[1]), build(spec[2])
        if not isinstance(b, ciclo.Schedule):
            a = as_schedule(a)  # two plain functions cannot be combined with & or |
        return a & b if kind == "and" else a | b
    if kind == "not":
        return ~as_schedule(build(spec[1]))
    if kind == "piecewise":
        return ciclo.piecewise(build(spec[1]), {k: build(c) for k, c in spec[2]})
    raise AssertionError(spec)


def model_since_last(values, amount) -> list[bool]:
    """Fires on the first value, then when `amount` passed since the last firing."""
    out, last = [], None
    for v in values:
        fire = last is None or v - last >= amount
        last = v if fire else last
        out.append(fire)
    return out


def model_after_every(spec, seq) -> list[bool]:
    _, a_unit, a, e_unit, b = spec
    reached = [VALUE[a_unit](e) >= a for e in seq]
    if a_unit == e_unit == "steps":
        return [r and (e.steps - a) % b == 0 for r, e in zip(reached, seq)]
    active = [e for r, e in zip(reached, seq) if r]
    if e_unit == "steps":
        inner = [(e.steps - active[0].steps) % b == 0 for e in active]
    else:
        inner = model_since_last([VALUE[e_unit](e) for e in active], b)
    return [False] * (len(seq) - len(active)) + inner


def boundary_reached(e, key) -> bool:
    return e.steps >= key if isinstance(key, int) else e.samples >= key.samples


def model(spec, seq) -> list[bool]:
    kind = spec[0]
    if kind == "every" and spec[1] == "steps":
        return [e.steps % spec[2] == 0 for e in seq]
    if kind == "every":
        return model_since_last([VALUE[spec[1]](e) for e in seq], spec[2])
    if kind == "after":
        return [VALUE[spec[1]](e) >= spec[2] for e in seq]
    if kind == "after_every":
        return model_after_every(spec, seq)
    if kind in ("always", "never"):
        return [kind == "always"] * len(seq)
    if kind == "plain":
        return [e.steps % spec[1] == 1 for e in seq]
    if kind == "not":
        return [not x for x in model(spec[1], seq)]
    if kind in ("and", "or"):
        op = (lambda x, y: x and y) if kind == "and" else (lambda x, y: x or y)
        return list(map(op, model(spec[1], seq), model(spec[2], seq)))
    # piecewise: piece i is active where i is the last boundary reached
    keys = [k for k, _ in spec[2]]
    children = [spec[1]] + [c for _, c in spec[2]]
    piece = [
        max([0] + [i + 1 for i, k in enumerate(keys) if boundary_reached(e, k)])
        for e in seq
    ]
    out = [False] * len(seq)
    for i, child in enumerate(children):
        where = [j for j, p in enumerate(piece) if p == i]
        # a piece counts from its boundary (in the boundary's field)
        shifted = [
            seq[j] if i == 0 else counted_from(seq[j], keys[i - 1]) for j in where
        ]
        for j, fire in zip(where, model(child, shifted)):
            out[j] = fire
    return out


def counted_from(e, key):
    """`e` with the boundary `key` (int steps, or at(samples=...)) subtracted."""
    if isinstance(key, int):
        return ciclo.Elapsed(e.steps - key, e.samples, e.date, e.date_start)
    return ciclo.Elapsed(e.steps, e.samples - key.samples, e.date, e.date_start)


@FEW
@given(st.integers(1, 12), st.integers(0, 80))
def test_every_steps_fires_ceil_n_over_k_times(k, n):
    fired = fired_steps(ciclo.every(k), by_steps(n))
    assert len(fired) == math.ceil(n / k)
    assert fired == list(range(0, n, k))


@FEW
@given(st.integers(0, 30), st.integers(1, 9), st.integers(0, 40), st.integers(0, 60))
def test_after_every_steps_matches_formula(a, b, start, n):
    seq = by_steps(n, start=start)
    expected = [s for s in range(start, start + n) if s >= a and (s - a) % b == 0]
    assert fired_steps(ciclo.after(a).every(b), seq) == expected


@FEW
@given(every_spec(), sequences())
def test_every_matches_since_last_fired_model(spec, seq):
    assert run(build(spec), seq) == model(spec, seq)


@FEW
@given(after_every_spec(), sequences())
def test_after_every_matches_model(spec, seq):
    assert run(build(spec), seq) == model(spec, seq)


@settings(max_examples=100, deadline=None)
@given(spec_trees(), sequences())
def test_any_schedule_tree_matches_model(spec, seq):
    assert run(build(spec), seq) == model(spec, seq)


@FEW
@given(spec_trees(), spec_trees(), sequences())
def test_combinators_are_set_operations_of_independent_runs(a, b, seq):
    fa, fb = run(build(a), seq), run(build(b), seq)
    # build() applies &, | and ~ to fresh builds of the operands
    assert run(build(("and", a, b)), seq) == [x and y for x, y in zip(fa, fb)]
    assert run(build(("or", a, b)), seq) == [x or y for x, y in zip(fa, fb)]
    assert run(build(("not", a)), seq) == [not x for x in fa]


@FEW
@given(spec_trees(), sequences(), sequences())
def test_fresh_isolates_runs(spec, seq1, seq2):
    shared = build(spec)
    first = run(_fresh(shared), seq1)
    second = run(_fresh(shared), seq2)
    assert first == run(build(spec), seq1)
    assert second == run(build(spec), seq2)
    # a schedule already used directly still gives a clean copy
    run(shared, seq1)
    assert run(_fresh(shared), seq2) == run(build(spec), seq2)


# Named schedules are closed under &, |, ~ and .every (API.md §5): each composition
# is a named schedule again, usable as a task key of the predefined loops.
def _epoch_end_steps(key, epochs=8):
    def log(state, batch, elapsed):
        return ciclo.logs().add_metric("at", elapsed.steps)

    _, history, _ = ciclo.train_loop(None, range(2), {key: log}, epochs=epochs)
    if "metrics.at" not in list(history.keys()):  # never fired: never logged
        return []
    return history.collect("at")  # 2 batches per epoch: epoch k ends at step 2k-1


def test_named_schedule_compositions_compose_again():
    every_2nd = ciclo.on_epoch_end & ciclo.every(4)  # epoch ends after 4, 8, ... steps
    assert _epoch_end_steps(every_2nd) == [3, 7, 11, 15]
    assert _epoch_end_steps(every_2nd.every(2)) == [7, 15]  # every 2nd of those
    assert _epoch_end_steps(ciclo.on_epoch_end.every(2).every(2)) == [7, 15]
    assert _epoch_end_steps(ciclo.on_epoch_end.every(2).every(3)) == [11]
    assert _epoch_end_steps(ciclo.on_epoch_end.every(2) & ciclo.after(9)) == [11, 15]


def test_named_schedule_negation_and_union():
    every_2nd = ciclo.on_epoch_end & ciclo.every(4)
    assert _epoch_end_steps(~every_2nd) == [1, 5, 9, 13]
    assert _epoch_end_steps(~ciclo.on_epoch_end.every(4)) == [1, 3, 5, 9, 11, 13]
    assert _epoch_end_steps(~ciclo.on_epoch_end) == []
    union = ciclo.on_epoch_end.every(4) | (ciclo.on_epoch_end & ciclo.after(11))
    assert _epoch_end_steps(union) == [7, 11, 13, 15]
    assert _epoch_end_steps(ciclo.on_epoch_end.every(4) | ciclo.after(14)) == [
        7,
        13,
        15,
    ]
    assert _epoch_end_steps(ciclo.every(4) & ciclo.on_epoch_end) == [3, 7, 11, 15]
    assert _epoch_end_steps(ciclo.on_epoch_end | ciclo.never()) == [
        1,
        3,
        5,
        7,
        9,
        11,
        13,
        15,
    ]


def test_named_schedules_of_two_places_do_not_combine():
    with pytest.raises(TypeError, match="give both keys in `tasks`"):
        ciclo.on_epoch_end | ciclo.on_train_end
    with pytest.raises(TypeError, match="expected an ordinary schedule"):
        (ciclo.on_epoch_end & ciclo.every(2)) & 3
    with pytest.raises(ValueError, match="int >= 1"):
        (ciclo.on_epoch_end & ciclo.every(2)).every(0)


def test_named_schedule_compositions_are_named_schedules():
    # API.md §5: `&`, `|`, `~` and `.every(k)` give a named schedule again
    composed = [
        ciclo.on_epoch_end & ciclo.every(2),
        ciclo.every(2) & ciclo.on_epoch_end,
        ciclo.on_epoch_end.every(2),
        ~ciclo.on_epoch_end,
        ciclo.on_epoch_end | ciclo.after(4),
        ciclo.after(4) | ciclo.on_epoch_end,
        (ciclo.on_epoch_end & ciclo.every(2)).every(3),
        ~(ciclo.on_train_step & ciclo.every(2)) | ciclo.on_train_step.every(5),
    ]
    for key in composed:
        assert isinstance(key, ciclo.NamedSchedule), repr(key)
    assert isinstance(ciclo.on_epoch_end, ciclo.NamedSchedule)
    assert isinstance(ciclo.on_epoch_end, str) and ciclo.on_epoch_end == "on_epoch_end"
    assert not isinstance(ciclo.every(2), ciclo.NamedSchedule)
    assert not isinstance("on_epoch_end", ciclo.NamedSchedule)  # a plain str


def test_named_schedule_compositions_are_distinct_task_keys():
    # a bare named schedule is its name's string; a composition is a key of its
    # own (compared by identity), so two equal-looking ones are two keys
    a, b = ciclo.on_epoch_end.every(2), ciclo.on_epoch_end.every(2)
    assert a != b and a == a and len({a, b, ciclo.on_epoch_end}) == 3
    assert {ciclo.on_epoch_end: 1}["on_epoch_end"] == 1
    assert _epoch_end_steps(a) == [3, 7, 11, 15]
