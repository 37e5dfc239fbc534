"""Ciclo 0.1's last behaviours (inject, inner_loop with a list history) and the
silent or raw cases that now warn or raise clearly (issue: nothing lost)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import ciclo


# -- ciclo.inject(f)(*args), as in Ciclo 0.1 ---------------------------------------
def test_inject_returns_a_caller_of_the_first_n_arguments():
    assert ciclo.inject(lambda a, b: (a, b))(1, 2, 3, 4) == (1, 2)
    assert ciclo.inject(lambda: "none")(1, 2) == "none"
    assert ciclo.inject(lambda *args: args)(1, 2, 3) == (1, 2, 3)


def test_inject_counts_defaults_and_methods():
    def with_default(state, batch=0, elapsed=None):
        return state, batch, elapsed

    assert ciclo.inject(with_default)(1, 2, 3, 4) == (1, 2, 3)
    assert ciclo.inject(with_default)(1) == (1, 0, None)

    class C:
        def m(self, a, b=None):
            return a, b

        def __call__(self, a):
            return a

    assert ciclo.inject(C().m)("x", "y", "z") == ("x", "y")
    assert ciclo.inject(C())("x", "y") == "x"


def test_inject_keeps_the_direct_form_and_its_clear_error():
    assert ciclo.inject(lambda a, b: a + b, 1, 2, 3) == 3
    with pytest.raises(TypeError, match="requires more arguments"):
        ciclo.inject(lambda a, b, c: a)(1, 2)
    with pytest.raises(TypeError, match="callable"):
        ciclo.inject(3)


# -- inner_loop with Ciclo 0.1's list history -----------------------------------------
ROWS = [
    {"metrics": {"acc": 0.5}, "losses": {"loss": 2.0}},
    {"metrics": {"acc": 1.0}, "losses": {"loss": 4.0}},
    {"metrics": {"acc": 0.0}, "losses": {"loss": 3.0}},
]


def as_history(rows):
    history = ciclo.history()
    for i, row in enumerate(rows):
        logs = ciclo.logs()
        for collection, entries in row.items():
            logs.add_entries(collection, **entries)
        history.commit(ciclo.Elapsed.create(steps=i, samples=i), logs)
    return history


@pytest.mark.parametrize(
    "aggregation",
    ["last", "first", "mean", "weighted_mean", "sum", "min", "max", "std", "concat",
     np.median, {"metrics": "max", "loss": "sum"}],
)  # fmt: skip
def test_inner_loop_takes_a_list_of_logs_and_aggregates_it_as_a_history(aggregation):
    from_list = ciclo.inner_loop(
        "t", lambda s: (s, ROWS, None), aggregation=aggregation
    )
    from_history = ciclo.inner_loop(
        "t", lambda s: (s, as_history(ROWS), None), aggregation=aggregation
    )
    got, _ = from_list(None)
    want, _ = from_history(None)
    assert set(got) == set(want) == {"metrics", "losses"}
    for collection in want:
        for name, value in want[collection].items():
            np.testing.assert_allclose(got[collection][name], value)
    assert "acc_t" in got["metrics"] and "loss_t" in got["losses"]


def test_inner_loop_list_rows_with_elapsed_weight_by_their_samples():
    rows = [
        {"losses": {"loss": 1.0}, "elapsed": {"steps": 0, "samples": 0}},
        {"losses": {"loss": 4.0}, "elapsed": {"steps": 1, "samples": 3}},
    ]
    inner = ciclo.inner_loop(
        "t",
        lambda s: (s, rows, ciclo.Elapsed.create(steps=2, samples=4)),
        aggregation="weighted_mean",
    )
    # batch sizes 3 and 1: (3 * 1 + 1 * 4) / 4
    assert float(inner(None)[0]["losses"]["loss_t"]) == pytest.approx(7 / 4)


def test_inner_loop_in_a_loop_with_an_original_style_loop_fn():
    def loop_fn(state):
        return state, [{"metrics": {"x": float(i)}} for i in range(3)], None

    def step(state, batch):
        return ciclo.logs().add_loss("loss", 1.0), state

    _, history, _ = ciclo.loop(
        None,
        range(2),
        {
            ciclo.every(1): [
                step,
                ciclo.inner_loop("valid", loop_fn, aggregation="mean"),
            ]
        },
    )
    assert history.collect("x_valid") == [1.0, 1.0]


def test_inner_loop_other_returns_still_name_the_fix():
    with pytest.raises(TypeError, match="list of log dicts"):
        ciclo.inner_loop("t", lambda s: (s, [1, 2], None))(None)


# -- silent and raw cases -------------------------------------------------------------
def step(state, batch):
    return ciclo.logs().add_loss("loss", 1.0), state


@pytest.mark.parametrize(
    ("run", "where"),
    [
        (lambda: ciclo.loop(None, [], {ciclo.every(1): step}), "ciclo.loop"),
        (lambda: ciclo.train_loop(None, iter([]), {ciclo.on_train_step: step}),
         "train_loop"),
        (lambda: ciclo.test_loop(None, [], {ciclo.on_test_step: step}),
         "ciclo.test_loop"),
        (lambda: ciclo.predict_loop(None, [], {ciclo.on_predict_step: step}),
         "ciclo.predict_loop"),
    ],
)  # fmt: skip
def test_an_empty_dataset_warns_naming_the_loop(run, where):
    with pytest.warns(UserWarning, match="yielded no batch") as caught:
        _, _, elapsed = run()
    assert elapsed.steps == 0
    assert len(caught) == 1 and str(caught[0].message).startswith(where)


def test_an_exhausted_test_set_warns_at_its_epoch():
    shared = iter([1, 2])  # one iterator: exhausted after the first epoch
    with pytest.warns(UserWarning, match="test_dataset.*yielded no batch.*FRESH"):
        ciclo.train_loop(
            None,
            [1, 2, 3, 4],
            {ciclo.on_train_step: step, ciclo.on_test_step: step},
            test_dataset=lambda: shared,
            epoch_duration=2,
        )


def test_a_stop_already_reached_or_a_full_dataset_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ciclo.loop(None, [], {ciclo.every(1): step}, stop=0)
        ciclo.loop(None, [1], {ciclo.every(1): step})
        ciclo.test_loop(None, [1], {ciclo.on_test_step: step})


def test_a_checkpoint_path_that_is_a_file_is_refused_at_construction(tmp_path):
    file = tmp_path / "model.ckpt"
    file.write_text("not a directory")
    with pytest.raises(ValueError, match=r"model\.ckpt.*existing file.*directory"):
        ciclo.checkpoint(file)
    with pytest.raises(ValueError, match="inside .*model.ckpt"):
        ciclo.checkpoint(file / "sub")
    with pytest.raises(ValueError, match="existing file"):
        ciclo.restore(file, None)
