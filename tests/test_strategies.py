"""Strategies: every strategy on 4 forced CPU devices gives the jit result.

The 4-device checks run once, in a subprocess (`_strategies_worker.py`); each test
asserts on a part of its results. Registry checks run in this process.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _workers import four_device_results

import ciclo
from ciclo import managed

TOL = 1e-5
ALL = ["jit", "jit_donate", "data_parallel", "data_parallel_donate", "sharded"]


@pytest.fixture(scope="module")
def results() -> dict:
    return four_device_results()


def max_diff(a: dict, b: dict) -> float:
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


@pytest.mark.slow
@pytest.mark.parametrize("name", ALL)
def test_same_params_as_jit_after_training(results, name):
    assert max_diff(results["params"][name], results["params"]["jit"]) < TOL
    np.testing.assert_allclose(
        results["logs"][name]["loss"], results["logs"]["jit"]["loss"], atol=TOL
    )


@pytest.mark.parametrize("name", ALL)
def test_compiled_once_per_strategy_while_elapsed_changes(results, name):
    assert results["traces"][name] == 1
    assert results["logs"][name]["steps_seen"] == [0, 1, 2, 3]


def test_donate_variants_consume_the_input_state(results):
    donated = results["donated"]
    assert donated["jit_donate"] and donated["data_parallel_donate"]
    assert not donated["jit"] and not donated["data_parallel"]


def test_data_parallel_state_is_replicated_per_device(results):
    assert results["replicated_shape"] == (4, 8, 16)


def test_with_strategy_round_trips(results):
    start, end, strategy = results["round_trip"]
    assert strategy == "jit"
    assert max_diff(start, end) == 0.0


@pytest.mark.parametrize("name", ["data_parallel", "sharded"])
def test_uneven_batch_is_a_clear_error(results, name):
    message = results["uneven"][name]
    assert "batch of size 10" in message and "4 devices" in message


def test_stateful_metrics_merged_across_devices(results):
    extra = results["extra"]
    for name in ["jit", "data_parallel", "sharded"]:
        assert extra[name]["masked_y"] == pytest.approx(extra["expected_masked_y"])


def test_outputs_concatenated_across_devices(results):
    extra = results["extra"]
    for name in ["data_parallel", "sharded"]:
        assert extra[name]["logits"].shape == (16, 4)
        np.testing.assert_allclose(
            extra[name]["logits"], extra["jit"]["logits"], atol=TOL
        )


def test_batch_stats_and_grads_averaged(results):
    extra = results["extra"]
    for name in ["jit", "data_parallel", "sharded"]:
        np.testing.assert_allclose(
            extra[name]["batch_stats"], extra["expected_batch_mean"], atol=TOL
        )
        assert max_diff(extra[name]["params"], extra["jit"]["params"]) < TOL


def test_rng_keys_split_per_device(results):
    extra = results["extra"]
    keys = extra["keys_per_device"]
    assert keys.shape == (4, 2) and len({tuple(k) for k in keys}) == 4
    chunks = extra["data_parallel"]["noise"].reshape(4, 4)
    assert len({tuple(c) for c in chunks}) == 4
    # sharded is one logical program: same draws as jit
    np.testing.assert_allclose(extra["sharded"]["noise"], extra["jit"]["noise"])


# -- registry (in this process) ----------------------------------------------------
def test_get_strategy_unknown_name_lists_registered():
    with pytest.raises(ValueError, match="Unknown strategy 'pmapp'") as info:
        ciclo.get_strategy("pmapp")
    for name in ["eager", "jit", "jit_donate", "data_parallel", "sharded"]:
        assert name in str(info.value)


def test_dash_and_underscore_are_the_same_name():
    assert ciclo.get_strategy("data-parallel") is ciclo.get_strategy("data_parallel")


def test_register_custom_strategy_is_used_by_managed_steps():
    compiled = []

    class Counting(ciclo.Strategy):
        def wrap(self, fn, *, donate=False):
            compiled.append((fn, donate))
            return jax.jit(fn)

    ciclo.register_strategy("counting", Counting("counting"), overwrite=True)

    @managed.step
    def double(state, batch):
        return None, state.replace(params=state.params * 2)

    state = managed.ManagedState.create(
        params=jnp.ones(2), tx=optax.sgd(0.1), strategy="counting"
    )
    for _ in range(3):
        _, state = double(state, None)
    assert len(compiled) == 1 and compiled[0][1] is False
    np.testing.assert_allclose(state.params, [8.0, 8.0])


def test_register_strategy_refuses_duplicates_and_incomplete_objects():
    with pytest.raises(ValueError, match="already registered"):
        ciclo.register_strategy("jit", ciclo.Strategy("jit"))
    with pytest.raises(TypeError, match="lacks"):
        ciclo.register_strategy("broken", object())


def test_data_parallel_round_trip_keeps_key_and_merges_metrics_in_the_state(results):
    carry = results["carry"]
    start, back = carry["start"], carry["round_trip"]
    np.testing.assert_array_equal(back["key"], start["key"])
    assert (back["total"], back["count"]) == (start["total"], start["count"])
    # every device merged its 2 rows of arange(8): the sum of all is merged back
    assert carry["accumulated"]["count"] == start["count"] + 8
    assert carry["accumulated"]["total"] == start["total"] + 28.0


def test_data_parallel_small_two_argument_step_and_log_reductions(results):
    small = results["small"]
    # per-device counts of x > 2 in [0 1 | 2 3 | 4 5 | 6 7]: 0, 1, 2, 2
    assert small["above_2"] == pytest.approx(1.25)
    assert small["mean"].shape == () and float(small["mean"]) == pytest.approx(3.5)


def test_stateful_metric_field_accumulates_and_grad_norm_under_every_strategy(results):
    acc = results["accumulated"]
    for name in ["data_parallel", "sharded"]:
        np.testing.assert_allclose(acc[name]["accuracy"], acc["jit"]["accuracy"])
        np.testing.assert_allclose(
            acc[name]["grad_norm"], acc["jit"]["grad_norm"], rtol=1e-5
        )
    # accumulated since the start, not per batch (equal batch sizes: the running
    # mean of the per-batch accuracies)
    for name in ["jit", "data_parallel", "sharded"]:
        batch = np.asarray(acc[name]["batch"])
        expected = np.cumsum(batch) / np.arange(1, len(batch) + 1)
        assert len(batch) == 4
        np.testing.assert_allclose(acc[name]["accuracy"], expected, rtol=1e-6)
    assert acc["jit"]["lift"] == 8
    assert acc["data_parallel"]["lift"] == acc["sharded"]["lift"] == 32


# -- a state carries its strategy as an object (in this process) ---------------------
def test_a_state_carries_its_strategy_object_resolved_from_a_name():
    jit = ciclo.get_strategy("jit")
    state = managed.ManagedState.create(
        params=jnp.zeros(2), tx=optax.sgd(0.1), strategy="jit"
    )
    assert state.strategy is jit
    # a registered strategy equals (and hashes as) the name it is registered under
    assert state.strategy == "jit" and state.strategy != "eager"
    assert hash(state.strategy) == hash("jit") and {"jit": 1}[state.strategy] == 1
    assert ciclo.get_strategy("data-parallel") == "data_parallel"
    eager = state.with_strategy("eager")
    assert eager.strategy is ciclo.get_strategy("eager")
    assert eager.with_strategy(jit).strategy is jit


def test_a_strategy_object_is_used_as_given_without_a_generated_name():
    mesh = jax.make_mesh((1, 1), ("data", "model"))
    strategy = ciclo.sharded(mesh, rules=[("w", jax.sharding.PartitionSpec())])
    assert "sharded_" not in strategy.name and "model" in strategy.name
    state = managed.ManagedState.create(
        params={"w": jnp.ones(2)}, tx=optax.sgd(0.1), strategy=strategy
    )
    assert state.strategy is strategy
    assert state.with_strategy(strategy.name) is state  # the name resolves to it


def test_a_state_holding_a_strategy_name_still_runs_and_moves():
    # states built before strategies were objects held the registered name
    @managed.train_step
    def fit(state, batch):
        return ciclo.logs().add_loss("loss", jnp.sum((state.params - batch) ** 2))

    state = managed.ManagedState.create(
        params=jnp.zeros(2), tx=optax.sgd(0.25), strategy="jit"
    ).replace(strategy="jit")
    _, state = fit(state, jnp.ones(2))
    np.testing.assert_allclose(state.params, [0.5, 0.5])
    moved = state.with_strategy("eager")
    assert moved.strategy is ciclo.get_strategy("eager")
    np.testing.assert_allclose(moved.params, [0.5, 0.5])


def test_a_state_copies_and_pickles_with_its_registered_strategy():
    import copy
    import pickle

    dp = ciclo.get_strategy("data_parallel")
    assert copy.deepcopy(dp) is dp
    assert pickle.loads(pickle.dumps(dp)) is dp
    state = managed.ManagedState.create(
        params=jnp.zeros(2), tx=optax.sgd(0.1), strategy="data_parallel"
    )
    assert copy.deepcopy(state).strategy is dp
