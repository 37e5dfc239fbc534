"""API.md §6 — Callbacks shipped with ciclo."""

from __future__ import annotations

import csv
import io
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ciclo
from ciclo import managed

EVERY = ciclo.every(1)


def _logs(losses=None, metrics=None):
    logs = ciclo.logs()
    for k, v in (losses or {}).items():
        logs.add_loss(k, v)
    for k, v in (metrics or {}).items():
        logs.add_metric(k, v)
    return logs


def _loss_step(state, batch):
    """Counts batches in ``state['n']`` and logs a decreasing loss."""
    n = state["n"] + 1
    return _logs(losses={"loss": 1.0 / n}, metrics={"acc": n / 10.0}), {"n": n}


def _arr_state(n=0.0):
    return {"n": jnp.asarray(float(n))}


# ------------------------------------------------------------------- bars


def test_keras_bar_in_loop_shows_losses_and_metrics(capsys):
    ciclo.loop(
        _arr_state(), range(3), {EVERY: [_loss_step], **ciclo.keras_bar(total=3)}
    )
    out = capsys.readouterr().out
    assert "3/3" in out
    assert "loss" in out and "acc" in out


def test_keras_bar_self_registers_on_train_batch_end(capsys):
    bar = ciclo.keras_bar(total=ciclo.at(steps=4))
    assert hasattr(bar, "on_train_batch_end")
    ciclo.train_loop(
        _arr_state(),
        range(4),
        {ciclo.on_train_step: [_loss_step]},
        callbacks=[bar],
        stop=4,
    )
    out = capsys.readouterr().out
    assert "4/4" in out and "loss" in out


def test_keras_bar_by_hand(capsys):
    bar = ciclo.keras_bar(total=3)
    state = _arr_state()
    for elapsed, batch in ciclo.elapse(range(3)):
        logs, state = _loss_step(state, batch)
        bar(elapsed, logs)
    out = capsys.readouterr().out
    assert "3/3" in out and "loss" in out


def test_tqdm_bar_in_loop_and_by_hand(capsys):
    bar = ciclo.tqdm_bar(total=3)
    assert hasattr(bar, "on_train_batch_end")
    ciclo.loop(_arr_state(), range(3), {EVERY: [_loss_step], **bar})
    err = capsys.readouterr().err
    assert "3/3" in err

    bar = ciclo.tqdm_bar(total=2)
    for elapsed, _ in ciclo.elapse(range(2)):
        bar(elapsed)
    err = capsys.readouterr().err
    assert "2/2" in err


# ------------------------------------------------------------------- checkpoint


def _target():
    return {"w": jnp.zeros(3)}


def _save_by_hand(d, n_batches=5):
    ckpt = ciclo.checkpoint(d)
    state = {"w": jnp.zeros(3)}
    for elapsed, i in ciclo.elapse(range(n_batches)):
        state = {"w": state["w"] + 1.0}
        if i == n_batches - 1:  # after batch 4 -- the 5th
            ckpt(elapsed, state)
    return ckpt


def test_checkpoint_by_hand_then_ckpt_restore_counts_the_batch(tmp_path):
    ckpt = _save_by_hand(str(tmp_path / "ckpt"))
    restored, r_elapsed = ckpt.restore(_target())
    np.testing.assert_allclose(np.asarray(restored["w"]), np.full(3, 5.0))
    assert isinstance(r_elapsed, ciclo.Elapsed)
    assert r_elapsed.steps == 5


def test_checkpoint_by_hand_then_ciclo_restore_in_same_process_sees_it(tmp_path):
    for trial in range(8):  # the save must always be visible, not just usually
        d = str(tmp_path / f"ckpt{trial}")
        _save_by_hand(d)
        restored, r_elapsed = ciclo.restore(d, _target())
        np.testing.assert_allclose(np.asarray(restored["w"]), np.full(3, 5.0))
        assert r_elapsed.steps == 5


@pytest.mark.parametrize(
    "mode, values, best_index",
    [("min", [3.0, 1.0, 2.0, 5.0], 1), ("max", [3.0, 7.0, 2.0, 5.0], 1)],
)
def test_checkpoint_monitor_latest_vs_best_and_newest_kept(
    tmp_path, mode, values, best_index
):
    d = str(tmp_path / "ckpt")
    ckpt = ciclo.checkpoint(d, monitor="loss", mode=mode, keep=1)
    for (elapsed, i), v in zip(ciclo.elapse(range(4)), values):
        ckpt(elapsed, {"w": jnp.full(3, float(i))}, _logs(losses={"loss": v}))
    latest, l_elapsed = ckpt.restore(_target())
    best, b_elapsed = ckpt.restore(_target(), best=True)
    np.testing.assert_allclose(np.asarray(latest["w"]), np.full(3, 3.0))  # newest kept
    assert l_elapsed.steps == 4
    np.testing.assert_allclose(np.asarray(best["w"]), np.full(3, float(best_index)))
    assert b_elapsed.steps == best_index + 1
    # the module-level restore reads the same directory
    best2, _ = ciclo.restore(d, _target(), best=True)
    np.testing.assert_allclose(np.asarray(best2["w"]), np.full(3, float(best_index)))
    latest2, _ = ciclo.restore(d, _target())
    np.testing.assert_allclose(np.asarray(latest2["w"]), np.full(3, 3.0))


def test_checkpoint_monitored_metric_never_logged_is_named(tmp_path):
    ckpt = ciclo.checkpoint(str(tmp_path / "c"), monitor="never_logged_metric_q")

    def step(state, batch):
        return _logs(losses={"loss": 1.0})

    with pytest.raises(ValueError, match="never_logged_metric_q"):
        ciclo.loop(_target(), range(3), {EVERY: [step, ckpt]})


def _order_step(state, batch):
    # order dependent, so a repeated or skipped batch changes the result
    return {"w": state["w"] * 0.5 + batch}


def test_checkpoint_in_train_loop_then_resume_neither_repeats_nor_skips(tmp_path):
    batches = [jnp.full(3, float(i)) for i in range(8)]

    def data_from(k):
        return iter(batches[k:])

    tasks = {ciclo.on_train_step: [_order_step]}
    full, _, _ = ciclo.train_loop(_target(), data_from(0), tasks, stop=8)

    d = str(tmp_path / "ckpt")
    ciclo.train_loop(
        _target(),
        data_from(0),
        tasks,
        callbacks=[ciclo.checkpoint(d)],
        epoch_duration=5,
        stop=5,
    )
    state, elapsed = ciclo.restore(d, _target())
    assert elapsed.steps == 5
    resumed, _, end = ciclo.train_loop(
        state, data_from(elapsed.steps), tasks, elapsed=elapsed, stop=8
    )
    assert end.steps == 8
    np.testing.assert_allclose(
        np.asarray(resumed["w"]), np.asarray(full["w"]), rtol=0, atol=0
    )


def test_checkpoint_self_registers_on_epoch_end(tmp_path):
    d = str(tmp_path / "ckpt")
    ckpt = ciclo.checkpoint(d)
    assert hasattr(ckpt, "on_epoch_end")
    ciclo.train_loop(
        _target(),
        [jnp.ones(3)] * 6,
        {ciclo.on_train_step: [lambda state, batch: {"w": state["w"] + batch}]},
        callbacks=[ckpt],
        epoch_duration=2,
        stop=4,
    )
    state, elapsed = ciclo.restore(d, _target())
    assert elapsed.steps == 4
    np.testing.assert_allclose(np.asarray(state["w"]), np.full(3, 4.0))


# ------------------------------------------------------------------- early stopping


def _run_es(es, values, n_steps=None):
    """Calls ``es`` by hand; returns the index of the first call that says stop."""
    state = {"w": jnp.asarray(-1.0)}
    for (elapsed, i), v in zip(ciclo.elapse(range(len(values))), values):
        stop, state = es(
            elapsed, {"w": jnp.asarray(float(i))}, _logs(losses={"loss": v})
        )
        if stop:
            return i, state
    return None, state


def test_early_stopping_patience_by_hand():
    # best at call 0, no improvement afterwards
    first, _ = _run_es(ciclo.early_stopping("loss", patience=3), [1.0] * 10)
    assert first is not None and 3 <= first <= 4
    # always improving: never stops
    first, _ = _run_es(
        ciclo.early_stopping("loss", patience=3), [10.0 - i for i in range(10)]
    )
    assert first is None


def test_early_stopping_patience_as_period_equals_int():
    a, _ = _run_es(ciclo.early_stopping("loss", patience=3), [1.0] * 10)
    b, _ = _run_es(ciclo.early_stopping("loss", patience=ciclo.at(steps=3)), [1.0] * 10)
    assert a == b and a is not None


def test_early_stopping_min_delta_mode_and_baseline():
    slowly = [1.0 - 0.001 * i for i in range(10)]
    assert _run_es(ciclo.early_stopping("loss", patience=2), slowly)[0] is None
    assert (
        _run_es(ciclo.early_stopping("loss", patience=2, min_delta=0.01), slowly)[0]
        is not None
    )

    rising = [float(i) for i in range(10)]
    assert (
        _run_es(ciclo.early_stopping("loss", patience=2, mode="max"), rising)[0] is None
    )
    assert _run_es(ciclo.early_stopping("loss", patience=2), rising)[0] is not None

    falling = [10.0 - i for i in range(10)]  # improving, but never beats baseline 0.5
    assert (
        _run_es(ciclo.early_stopping("loss", patience=3, baseline=0.5), falling)[0]
        is not None
    )


def test_early_stopping_restore_best_weights():
    values = [3.0, 1.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0]
    first, state = _run_es(
        ciclo.early_stopping("loss", patience=2, restore_best_weights=True), values
    )
    assert first is not None
    assert float(state["w"]) == 1.0
    first, state = _run_es(ciclo.early_stopping("loss", patience=2), values)
    assert float(state["w"]) == float(first)


def test_early_stopping_stops_a_loop():
    def step(state, batch):
        return _logs(losses={"loss": 1.0}), state + 1

    state, _, elapsed = ciclo.loop(
        0, range(50), {EVERY: [step, ciclo.early_stopping("loss", patience=3)]}
    )
    assert 3 <= state <= 6
    assert elapsed.steps < 50


def test_early_stopping_in_train_loop_on_epoch_end():
    def step(state, batch):
        return _logs(losses={"loss": 1.0}), state + 1

    es = ciclo.early_stopping("loss", patience=4)
    assert hasattr(es, "on_epoch_end")
    state, _, _ = ciclo.train_loop(
        0,
        range(100),
        {ciclo.on_train_step: [step]},
        callbacks=[es],
        epoch_duration=2,
        stop=100,
    )
    assert 4 <= state <= 8


# ------------------------------------------------------------------- inner_loop


def _inner_logger(state, batch):
    logs = ciclo.logs()
    logs.add_metric("m", jnp.asarray(batch))
    logs.add_loss("l", jnp.asarray(batch * 10.0))
    logs.add_output("o", jnp.full((2,), batch))
    return logs, state + 1


def _inner_fn(state):
    return ciclo.loop(state, [1.0, 2.0, 3.0, 4.0], {EVERY: [_inner_logger]})


def _run_inner(**kwargs):
    inner = ciclo.inner_loop("valid", _inner_fn, **kwargs)
    state, history, _ = ciclo.loop(100, range(1), {EVERY: [inner]})
    return state, history


_VALUES = [1.0, 2.0, 3.0, 4.0]


@pytest.mark.parametrize(
    "aggregation, expected",
    [
        ("last", 4.0),
        ("first", 1.0),
        ("mean", 2.5),
        ("sum", 10.0),
        ("min", 1.0),
        ("max", 4.0),
        pytest.param(
            "std",
            float(np.std(_VALUES)),
            marks=(),
        ),
        (lambda values: float(sum(np.asarray(v) for v in values)) * 2, 20.0),
    ],
    ids=["last", "first", "mean", "sum", "min", "max", "std", "function"],
)
def test_inner_loop_aggregations(aggregation, expected):
    state, history = _run_inner(aggregation={"metrics": aggregation})
    assert state == 100  # output_state=False keeps the outer state
    (m,) = history.collect("m_valid")
    assert float(m) == pytest.approx(expected)


def test_inner_loop_default_is_last_and_suffixes_entries():
    _, history = _run_inner()
    m, ls = history.collect("m_valid", "l_valid")
    assert float(m[0]) == 4.0 and float(ls[0]) == 40.0


def test_inner_loop_concat_and_dict_per_collection():
    _, history = _run_inner(
        aggregation={"outputs": "concat", "metrics": "mean", "losses": "max"}
    )
    o, m, ls = history.collect("o_valid", "m_valid", "l_valid")
    np.testing.assert_allclose(np.asarray(o[0]), [1, 1, 2, 2, 3, 3, 4, 4])
    assert float(m[0]) == 2.5
    assert float(ls[0]) == 40.0


def test_inner_loop_dict_per_collection():
    _, history = _run_inner(aggregation={"metrics": "sum", "losses": "min"})
    m, ls = history.collect("m_valid", "l_valid")
    assert float(m[0]) == 10.0
    assert float(ls[0]) == 10.0


@pytest.mark.parametrize(
    "m_key, l_key", [("m", "l"), ("metrics.m", "losses.l")], ids=["bare", "qualified"]
)
def test_inner_loop_dict_per_entry(m_key, l_key):
    _, history = _run_inner(aggregation={m_key: "sum", l_key: "min"})
    m, ls = history.collect("m_valid", "l_valid")
    assert float(m[0]) == 10.0
    assert float(ls[0]) == 10.0


def test_inner_loop_single_string_aggregation():
    _, history = _run_inner(aggregation="mean")
    m, ls = history.collect("m_valid", "l_valid")
    assert float(m[0]) == 2.5 and float(ls[0]) == 25.0


def test_inner_loop_output_state():
    state, _ = _run_inner(output_state=True)
    assert state == 104


# ------------------------------------------------------------------- noop


def test_noop_changes_nothing():
    state, history, elapsed = ciclo.loop(7, range(3), {EVERY: [ciclo.noop]})
    assert state == 7 and len(history) == 0 and elapsed.steps == 3


# ------------------------------------------------------------------- observability


def _observed_run(*callbacks, n=4):
    def step(state, batch):
        return _logs(
            losses={"loss": 1.0 / (batch + 1)}, metrics={"acc": batch / 10.0}
        ), state

    return ciclo.loop(0, range(n), {EVERY: [step, *callbacks]})


def test_tensorboard_writer(tmp_path):
    pytest.importorskip(
        "tensorboardX", reason="needs ciclo[tensorboard] (tensorboardX)"
    )
    _observed_run(ciclo.tensorboard(str(tmp_path / "tb")))
    files = list((tmp_path / "tb").rglob("events.out.tfevents*"))
    assert files and sum(f.stat().st_size for f in files) > 0


def test_csv_logger(tmp_path):
    _observed_run(ciclo.csv_logger(str(tmp_path / "log.csv")))
    files = list(tmp_path.rglob("*.csv"))
    assert files
    rows = list(csv.DictReader(io.StringIO(files[0].read_text())))
    assert len(rows) == 4
    assert any("loss" in k for k in rows[0])


def test_jsonl_logger(tmp_path):
    _observed_run(ciclo.jsonl_logger(str(tmp_path / "log.jsonl")))
    files = list(tmp_path.rglob("*.jsonl"))
    assert files
    lines = [json.loads(x) for x in files[0].read_text().splitlines() if x.strip()]
    assert len(lines) == 4
    assert "loss" in json.dumps(lines[0])


def test_wandb_logger_logs_scalars_with_step():
    # ciclo.wandb_logger imports wandb even when given a run
    pytest.importorskip("wandb", reason="needs ciclo[wandb] (wandb)")

    class FakeRun:  # the original's wandb_logger(run) calls run.log(data, step=...)
        def __init__(self):
            self.calls = []

        def log(self, data, step=None, **kwargs):
            self.calls.append((dict(data), step))

    run = FakeRun()
    _observed_run(ciclo.wandb_logger(run))
    assert len(run.calls) == 4
    # at the completed steps, as Keras/clu/Jaxloop (History counts steps before)
    assert [s for _, s in run.calls] == [1, 2, 3, 4]
    assert any("loss" in k for k in run.calls[0][0])


def test_lr_monitor_logs_the_learning_rate():
    tx = optax.inject_hyperparams(optax.sgd)(learning_rate=0.125)
    state = managed.ManagedState.create(params=jnp.zeros(2), tx=tx, strategy="eager")
    seen = []

    def look(state, batch, elapsed, loop_state):
        for entries in loop_state.logs.values():
            for k, v in entries.items():
                if "lr" in k or "learning_rate" in k:
                    seen.append(float(v))

    ciclo.loop(state, range(2), {EVERY: [ciclo.lr_monitor(), look]})
    assert seen == [0.125, 0.125]


def test_nan_guard_stops_with_a_clear_message(capsys):
    def step(state, batch):
        loss = float("nan") if batch == 2 else 1.0
        return _logs(losses={"loss": jnp.asarray(loss)}), state + 1

    guard = ciclo.nan_guard()
    try:
        state, _, _ = ciclo.loop(0, range(10), {EVERY: [step, guard]})
    except Exception as e:  # a clear error is one acceptable way to stop
        assert "nan" in str(e).lower() and "loss" in str(e)
    else:
        assert state <= 4
        captured = capsys.readouterr()
        assert "nan" in (captured.out + captured.err).lower()


def test_profiler_window_writes_a_trace(tmp_path):
    f = jax.jit(lambda s: s + 1.0)
    ciclo.loop(
        jnp.asarray(0.0),
        range(12),
        {EVERY: [lambda state: f(state), ciclo.profiler(str(tmp_path / "prof"))]},
    )
    assert any(p.is_file() for p in (tmp_path / "prof").rglob("*"))


def _history_of_4():
    _, history, _ = _observed_run(n=4)
    return history


def test_history_to_dict():
    d = _history_of_4().to_dict()
    key = next(k for k in d if k.endswith("loss"))
    assert [float(x) for x in d[key]] == pytest.approx([1.0, 0.5, 1 / 3, 0.25])


def test_history_to_pandas():
    pytest.importorskip("pandas")
    df = _history_of_4().to_pandas()
    assert len(df) == 4
    col = next(c for c in df.columns if str(c).endswith("loss"))
    assert list(df[col]) == pytest.approx([1.0, 0.5, 1 / 3, 0.25])


def test_history_plot():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    before = set(plt.get_fignums())
    result = _history_of_4().plot("loss")
    try:
        assert result is not None or set(plt.get_fignums()) - before
    finally:
        plt.close("all")


def test_observability_names_exist():
    names = (
        "tensorboard",
        "csv_logger",
        "jsonl_logger",
        "wandb_logger",
        "lr_monitor",
        "nan_guard",
        "profiler",
    )
    missing = [n for n in names if not callable(getattr(ciclo, n, None))]
    assert missing == []
