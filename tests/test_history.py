import threading
import tracemalloc

import jax.numpy as jnp
import numpy as np
import pytest
from _gate import Gate
from _guard import disallow_device_to_host

import ciclo
import ciclo._history.transfer as transfer


def _commit_steps(history, values):
    elapsed = ciclo.Elapsed.create()
    for logs in values:
        history.commit(elapsed, logs)
        elapsed = elapsed.update(batch_size=2)


def _logs(**collections):
    return ciclo.logs(collections)


def test_collect_aligns_over_steps_where_all_keys_present():
    history = ciclo.history()
    _commit_steps(
        history,
        [
            _logs(metrics={"loss": 1.0}),
            _logs(metrics={"loss": 0.5, "accuracy_test": 0.7}),
            _logs(metrics={"loss": 0.25}),
            _logs(metrics={"accuracy_test": 0.9}),
        ],
    )
    assert history.collect("loss") == [1.0, 0.5, 0.25]
    steps, loss, acc = history.collect("steps", "loss", "accuracy_test")
    assert (steps, loss, acc) == ([1], [0.5], [0.7])
    assert history.collect("elapsed.samples", "accuracy_test") == ([2, 6], [0.7, 0.9])
    assert history.collect("metrics.loss", "steps")[1] == [0, 1, 2]
    assert len(history) == 4


def test_collect_errors_name_the_problem():
    history = ciclo.history()
    _commit_steps(history, [_logs(losses={"loss": 1.0}, metrics={"loss": 1.0})])
    with pytest.raises(ValueError, match="'losses.loss'.*'metrics.loss'"):
        history.collect("loss")
    with pytest.raises(KeyError, match="'accuracy' was never logged"):
        history.collect("accuracy")
    with pytest.raises(KeyError, match="'accuracy' was never logged"):
        history.collect("losses.loss", "accuracy")
    assert history.collect("losses.loss") == [1.0]


def test_collect_of_a_name_never_logged_is_a_key_error_with_a_did_you_mean():
    history = ciclo.history()
    _commit_steps(history, [_logs(losses={"loss": 1.0}, metrics={"accuracy": 0.5})] * 2)
    with pytest.raises(KeyError) as info:
        history.collect("los")
    message = str(info.value)
    assert "'los' was never logged" in message
    assert "Did you mean 'loss'?" in message
    assert "history.keys()" in message  # where to see what was logged
    with pytest.raises(KeyError, match="Did you mean 'accuracy'"):
        history.collect("steps", "acuracy")
    with pytest.raises(KeyError, match="Did you mean 'losses.loss'"):
        history.collect("losses.los")
    with pytest.raises(KeyError, match="'zzz' was never logged") as info:
        history.collect("zzz")
    assert "Did you mean" not in str(info.value)  # nothing close: no guess
    # the elapsed keys always exist, also in an empty history
    assert history.collect("steps", "samples") == ([0, 1], [0, 2])
    assert ciclo.history().collect("steps", "time") == ([], [])


def test_collect_of_an_entry_logged_in_the_step_in_progress_is_empty():
    """An entry logged in the current step is not committed yet: a later callback
    of that step reading it gets an empty result, not an error."""
    seen = []

    def step(state, batch):
        logs = ciclo.logs().add_loss("loss", float(batch))
        if batch == 1:
            logs.add_metric("first_at_one", 1.0)
        return logs, state

    def reader(state, batch, elapsed, loop_state):
        seen.append(loop_state.history.collect("loss"))
        if batch >= 1:
            seen.append(loop_state.history.collect("steps", "first_at_one"))

    _, history, _ = ciclo.loop(None, range(3), {ciclo.every(1): [step, reader]})
    assert seen == [[], [0.0], ([], []), [0.0, 1.0], ([1], [1.0])]
    # without the step, the name is never logged: a typo, not "not yet"
    with pytest.raises(KeyError, match="'loss' was never logged"):
        ciclo.loop(None, range(3), {ciclo.every(1): [reader]})
    assert history.collect("first_at_one") == [1.0]


def test_values_come_back_as_host_numbers_and_arrays():
    history = ciclo.history(lag=2)
    _commit_steps(
        history,
        [
            _logs(
                metrics={"acc": jnp.float32(i / 4), "count": jnp.int32(i)},
                outputs={"preds": jnp.arange(3) + i},
            )
            for i in range(5)
        ],
    )
    acc, count, preds = history.collect("acc", "count", "preds")
    assert acc == [0.0, 0.25, 0.5, 0.75, 1.0] and all(type(a) is float for a in acc)
    assert count == [0, 1, 2, 3, 4] and all(type(c) is int for c in count)
    assert all(isinstance(p, np.ndarray) for p in preds)
    np.testing.assert_array_equal(preds[4], [4, 5, 6])


def test_getitem_and_iter_rebuild_logs():
    history = ciclo.history()
    _commit_steps(history, [_logs(metrics={"a": 1.0}), _logs(losses={"b": 2.0})])
    last = history[-1]
    assert last.losses.b == 2.0 and last.elapsed.steps == 1
    assert "metrics" not in last
    assert [logs.elapsed.steps for logs in history] == [0, 1]
    with pytest.raises(IndexError):
        history[2]
    assert "elapsed.time" in history.keys() and "metrics.a" in history.keys()  # noqa: SIM118 (History.keys is a list)


@pytest.mark.parametrize("in_place", [True, False], ids=["in_place", "stacked"])
def test_device_values_are_fetched_lagged_in_batches(monkeypatch, in_place):
    if not in_place:  # an accelerator's path: the scalars stacked on the device
        monkeypatch.setattr(transfer, "_on_one_cpu", lambda first, last: False)
    started, read = [], []
    start, result = transfer.start, transfer.Transfer.result

    def counting(groups):  # one call per transfer, one group per column
        started.append(sum(len(g) for g in groups))
        return start(groups)

    monkeypatch.setattr(transfer, "start", counting)
    monkeypatch.setattr(
        transfer.Transfer, "result", lambda self: read.append(1) or result(self)
    )
    # device scalars of one dtype take the one-stack path (`transfer.Stacked`)
    stacked_result = transfer.Stacked.result
    monkeypatch.setattr(
        transfer.Stacked, "result", lambda self: read.append(1) or stacked_result(self)
    )
    # and on a CPU device, read where they are (`transfer.InPlace`)
    in_place_result = transfer.InPlace.result
    monkeypatch.setattr(
        transfer.InPlace, "result", lambda self: read.append(1) or in_place_result(self)
    )
    history = ciclo.history(lag=10)
    _commit_steps(history, [_logs(metrics={"v": jnp.float32(i)}) for i in range(45)])
    # every 10 commits the rows committed since start one transfer; one started
    # before (here: computed) is read
    assert started == [10, 10, 10, 10]
    assert 2 <= len(read) <= 3
    assert history.collect("v") == [float(i) for i in range(45)]
    assert started[-1] == 5  # reading fetches the rest
    assert len(read) == 5


def test_a_value_logged_twice_is_transferred_once():
    values = [jnp.float32(i) for i in range(4)]
    groups = [values, values[::-1], [values[0]] * 3]
    out = transfer.start(groups)
    assert out.result()[0].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert [v.tolist() for v in transfer.fetch(groups)] == [
        [0.0, 1.0, 2.0, 3.0],
        [3.0, 2.0, 1.0, 0.0],
        [0.0, 0.0, 0.0],
    ]
    (stacked,) = out._host.values()
    assert stacked.shape == (4,)  # 4 distinct values, each stacked once


def test_one_value_logged_in_several_columns_and_rows_comes_back_in_each():
    history = ciclo.history(lag=4)  # transfers started and read during the commits
    shared, other = jnp.float32(0.5), jnp.int32(7)
    with disallow_device_to_host():  # explicit transfers only (enforced on CPU too)
        for step in range(11):
            logs = ciclo.logs().add_loss("loss", shared, add_metric=True)
            logs.add_metric("count", other if step % 2 else jnp.int32(step))
            history.commit(ciclo.Elapsed.create(steps=step), logs)
        loss, metric, count = history.collect("losses.loss", "metrics.loss", "count")
    assert loss == metric == [0.5] * 11
    assert count == [7 if step % 2 else step for step in range(11)]
    assert all(type(c) is int for c in count)


def test_values_not_yet_computed_are_not_waited_for():
    # `slow` is computed only once the gate lets it go (a host callback on the
    # device's side), however fast the device is
    with Gate(hold=0, ahead=None) as gate:
        history = ciclo.history(lag=5)
        slow = gate.pending(jnp.float32(0.5))
        _commit_steps(history, [_logs(metrics={"v": slow})])
        _commit_steps(history, [_logs(metrics={"v": jnp.float32(i)}) for i in range(9)])
        # two transfers started, neither waited for: the oldest row is still held
        assert not slow.is_ready() and len(history._in_flight) == 2
        # far behind (4 * lag rows not on the host): a commit waits for the oldest
        # lag rows, here until the gate lets `slow` go a moment later
        released = []
        threading.Timer(0.3, lambda: (released.append(True), gate.release())).start()
        _commit_steps(
            history, [_logs(metrics={"v": jnp.float32(i)}) for i in range(10)]
        )
        assert released and history._fetched >= 5  # returned after the release
    assert not gate.timed_out
    assert history.collect("v") == [0.5, *range(9), *range(10)]


def test_memory_per_logged_step_is_small():
    history = ciclo.history()
    steps = 5_000
    values = [jnp.float32(i) for i in range(7)]  # device scalars, made up front
    logs = (_logs(metrics={"loss": values[i % 7] + 0}) for i in range(steps))
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    _commit_steps(history, logs)
    history.collect("loss")
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    # one logged scalar + the 4 elapsed fields per step: ~80 bytes in typed arrays;
    # a dict of dicts per step (or kept device buffers) would cost over 1 KB
    assert (after - before) / steps < 150


def test_low_precision_and_bool_scalars_come_back_as_python_values():
    history = ciclo.history()
    _commit_steps(
        history,
        [
            {
                "metrics": {
                    "bf16": jnp.bfloat16(1.5),
                    "f16": jnp.float16(i),
                    "ok": jnp.bool_(i),
                }
            }
            for i in range(2)
        ],
    )
    bf16, f16, ok = history.collect("bf16", "f16", "ok")
    assert bf16 == [1.5, 1.5] and type(bf16[0]) is float
    assert f16 == [0.0, 1.0] and ok == [False, True] and type(ok[0]) is bool


def test_slices_and_plain_dict_commits():
    history = ciclo.history()
    _commit_steps(history, [{"metrics": {"a": i}} for i in range(4)])
    assert [logs.metrics.a for logs in history[1:3]] == [1, 2]
    with pytest.raises(TypeError, match="Collection 'metrics'"):
        history.commit(ciclo.Elapsed.create(), {"metrics": 1.0})
    assert len(history) == 4


def test_device_scalars_of_every_dtype_come_back_as_python_values():
    history = ciclo.history(lag=3)
    _commit_steps(
        history,
        [
            _logs(
                metrics={
                    "f32": jnp.float32(i / 4),
                    "bf16": jnp.bfloat16(i),
                    "i32": jnp.int32(-i),
                    "u8": jnp.uint8(i),
                    "flag": jnp.bool_(i % 2),
                    # a column whose type changes: int for a while, then float
                    "mixed": jnp.int32(i) if i < 4 else jnp.float32(i + 0.5),
                }
            )
            for i in range(7)
        ],
    )
    f32, bf16, i32, u8, flag, mixed = history.collect(
        "f32", "bf16", "i32", "u8", "flag", "mixed"
    )
    assert f32 == [i / 4 for i in range(7)] and all(type(v) is float for v in f32)
    assert bf16 == [float(i) for i in range(7)] and all(type(v) is float for v in bf16)
    assert i32 == [-i for i in range(7)] and all(type(v) is int for v in i32)
    assert u8 == list(range(7)) and all(type(v) is int for v in u8)
    assert flag == [bool(i % 2) for i in range(7)]
    assert all(isinstance(v, bool | np.bool_) for v in flag)
    assert mixed == [0, 1, 2, 3, 4.5, 5.5, 6.5]


def test_pickled_and_copied_histories_hold_the_same_rows_and_stay_independent():
    import copy
    import pickle

    history = ciclo.history(lag=4)
    elapsed = ciclo.Elapsed.create()
    for i in range(10):  # device values still pending when pickled
        logs = ciclo.logs()
        logs.add_metric("loss", jnp.float32(i) / 2)
        if i % 3 == 0:
            logs.add_output("vec", jnp.arange(2) + i)
        history.commit(elapsed, logs)
        elapsed = elapsed.update(batch_size=4)
    expected = history.collect("steps", "samples", "loss")
    for clone in (pickle.loads(pickle.dumps(history)), copy.deepcopy(history)):
        assert clone.collect("steps", "samples", "loss") == expected
        assert [v.tolist() for v in clone.collect("vec")] == [
            [0, 1], [3, 4], [6, 7], [9, 10]
        ]  # fmt: skip
        assert clone.lag == 4
        clone.commit(elapsed, {"metrics": {"loss": 99.0}})  # the original is untouched
        assert len(clone) == 11 and len(history) == 10
        assert history.collect("loss")[-1] == 4.5


def test_a_commit_with_a_bad_elapsed_raises_and_adds_no_row():
    history = ciclo.history()
    history.commit(ciclo.Elapsed.create(steps=1), ciclo.logs().add_loss("loss", 1.0))
    with pytest.raises(TypeError, match="Elapsed.create"):
        history.commit(None, ciclo.logs().add_loss("loss", 2.0))
    assert len(history) == 1
    assert history.collect("steps", "loss") == ([1], [1.0])


def test_elapsed_fields_read_between_commits_are_exact():
    history = ciclo.history(lag=4)
    seen = []
    for step in range(30):
        elapsed = ciclo.Elapsed.create(steps=step, samples=3 * step)
        history.commit(elapsed, ciclo.logs().add_metric("m", jnp.float32(step)))
        if step % 7 == 0:  # reads in the middle of a lag window
            seen.append(history.collect("steps")[-1])
    steps, samples, m = history.collect("steps", "samples", "m")
    assert steps == list(range(30)) and samples == [3 * s for s in range(30)]
    assert m == [float(s) for s in range(30)] and seen == [0, 7, 14, 21, 28]
    assert history[12]["elapsed"]["steps"] == 12


def test_a_loops_rows_land_in_their_columns_whatever_each_step_logs():
    # steps logging different entries, one column holding host numbers and
    # device values, a row committed by a callback's own dict, and reads of
    # the history in the middle of the loop: every value in its row
    seen = []

    def step(state, batch):
        logs = ciclo.logs().add_loss("loss", jnp.float32(batch))
        if batch % 3 == 0:
            logs.add_metric("acc", jnp.float32(10 * batch))
        # host numbers first, then device values, then host numbers again
        lr = jnp.float32(batch / 2) if 4 <= batch < 9 else batch / 2
        logs.add_entry("stateful_metrics", "lr", lr)
        return logs, state + 1

    def read(state, batch):
        seen.append(loop_history.collect("steps", "loss"))
        return None, state

    loop_history = ciclo.history(lag=4)
    state, history, elapsed = ciclo.loop(
        0,
        range(20),
        {ciclo.every(1): [step], ciclo.every(7): [read]},
        history=loop_history,
    )
    assert history is loop_history and state == 20 and len(history) == 20
    steps, loss, lr = history.collect("steps", "loss", "lr")
    assert steps == list(range(20)) and loss == [float(b) for b in range(20)]
    assert lr == [b / 2 for b in range(20)]
    assert history.collect("steps", "acc") == (
        [0, 3, 6, 9, 12, 15, 18],
        [0.0, 30.0, 60.0, 90.0, 120.0, 150.0, 180.0],
    )
    # a read at step s sees the rows of steps 0 .. s-1 (step s not committed yet)
    assert seen == [(list(range(s)), [float(b) for b in range(s)]) for s in (0, 7, 14)]
    assert history[5]["stateful_metrics"]["lr"] == 2.5
    assert "acc" not in history[4].get("metrics", {})


def test_a_commit_by_hand_keeps_the_values_of_logs_changed_after():
    history = ciclo.history()
    logs = ciclo.logs().add_metric("m", jnp.float32(1.0))
    history.commit(ciclo.Elapsed.create(steps=0), logs)
    logs.add_metric("m", jnp.float32(2.0)).add_metric("n", 3.0)
    history.commit(ciclo.Elapsed.create(steps=1), logs)
    assert history.collect("steps", "m") == ([0, 1], [1.0, 2.0])
    assert history.collect("steps", "n") == ([1], [3.0])


def test_a_loops_rows_logging_the_same_entries_keep_their_order():
    def step(state, batch):
        logs = ciclo.logs().add_loss("loss", jnp.float32(batch))
        return logs.add_metric("host", batch * 2.0), state

    _, history, _ = ciclo.loop(
        None, range(11), {ciclo.every(1): [step]}, history=ciclo.history(lag=4)
    )
    assert history.collect("steps", "loss", "host") == (
        list(range(11)),
        [float(b) for b in range(11)],
        [b * 2.0 for b in range(11)],
    )
