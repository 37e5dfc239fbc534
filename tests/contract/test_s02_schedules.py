"""API.md §2 — Schedules."""

from __future__ import annotations

import time

import numpy as np

import ciclo


def _fires(schedule, n, samples_per_step=1):
    """Steps (0..n-1) at which ``schedule`` fires, fed fresh Elapsed values."""
    out = []
    for i in range(n):
        e = ciclo.Elapsed.create(steps=i, samples=i * samples_per_step)
        if schedule(e):
            out.append(i)
    return out


def test_a_schedule_is_any_callable_in_a_loop():
    seen = []
    ciclo.loop(
        None,
        range(5),
        {(lambda e: e.steps == 2): [lambda state, batch: seen.append(batch)]},
    )
    assert seen == [2]


def test_every_steps_fires_at_multiples_including_zero():
    assert _fires(ciclo.every(3), 10) == [0, 3, 6, 9]
    assert _fires(ciclo.every(1), 4) == [0, 1, 2, 3]


def test_every_samples_fires_when_enough_samples_passed_since_last_fire():
    s = ciclo.every(samples=10)
    fired = []
    for i in range(8):
        e = ciclo.Elapsed.create(steps=i, samples=4 * i)  # 0, 4, 8, ..., 28
        if s(e):
            fired.append(4 * i)
    # whether the very first call (samples=0) fires is left open; after it, the
    # schedule fires each time >= 10 samples passed since it last fired
    assert [x for x in fired if x > 0] == [12, 24]


def test_every_time_fires_when_enough_seconds_passed_since_last_fire():
    s = ciclo.every(time=0.5)
    results = []
    for i, (e, _) in enumerate(ciclo.elapse(range(4))):
        results.append(bool(s(e)))
        if i == 1:
            time.sleep(0.7)
    # call 0 left open; call 1 is immediately after; call 2 after 0.7 s; call 3 right after
    assert results[1:] == [False, True, False]


def test_after_fires_once_the_period_is_reached():
    assert _fires(ciclo.after(3), 7) == [3, 4, 5, 6]
    assert _fires(ciclo.after(samples=20), 6, samples_per_step=10) == [2, 3, 4, 5]


def test_after_every():
    assert _fires(ciclo.after(3).every(5), 16) == [3, 8, 13]


def test_piecewise():
    s = ciclo.piecewise(ciclo.never(), {ciclo.at(4): ciclo.every(2)})
    assert _fires(s, 10) == [4, 6, 8]
    s = ciclo.piecewise(
        ciclo.always(), {ciclo.at(3): ciclo.never(), ciclo.at(6): ciclo.always()}
    )
    assert _fires(s, 9) == [0, 1, 2, 6, 7, 8]


def test_always_never():
    assert _fires(ciclo.always(), 4) == [0, 1, 2, 3]
    assert _fires(ciclo.never(), 4) == []


def test_combinators():
    assert _fires(ciclo.every(2) & ciclo.every(3), 13) == [0, 6, 12]
    assert _fires(ciclo.every(2) | ciclo.every(3), 10) == [0, 2, 3, 4, 6, 8, 9]
    assert _fires(~ciclo.every(2), 6) == [1, 3, 5]
    assert _fires(~ciclo.never() & ciclo.after(2), 4) == [2, 3]


def test_schedule_object_does_not_share_state_between_loops():
    sched = ciclo.every(samples=4)
    data = [np.zeros(2)] * 8  # 2 samples per batch

    def run():
        fired = []
        ciclo.loop(
            None,
            data,
            {sched: [lambda state, batch, elapsed: fired.append(elapsed.steps)]},
        )
        return fired

    first = run()
    second = run()
    assert len(first) >= 3
    assert second == first
