"""`ciclo.sharded(mesh, rules=..., fsdp=...)`: model parallelism on forced CPU devices.

The multi-device runs happen once per module in fresh processes
(`_model_parallel_worker.py`): 4 devices train under `jit`, a 2x2 (data x model)
mesh with rules, a 1x4 mesh with fsdp, fused and donating variants, Flax Linen and
NNX models with partitioning annotations; a sharded checkpoint written on 4 devices
is restored in fresh processes with 2 devices and with 1. Construction checks run
in this process (1 device).
"""

from __future__ import annotations

import pickle
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _workers import _results, run_processes
from jax.sharding import PartitionSpec as P

import ciclo
from ciclo import managed

TOL = 1e-5


def _run(*args: str) -> dict:
    mode, devices, *rest = args
    return _results(
        "_model_parallel_worker.py", f"worker {args}", (mode, devices), tuple(rest)
    )


def _multihost(num_processes: int = 2) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.pkl"
        run_processes(
            "_model_parallel_multihost.py", str(out), num_processes=num_processes
        )
        with open(out, "rb") as f:
            return pickle.load(f)


@pytest.fixture(scope="module")
def trained() -> dict:
    return _run("train", "4")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict:
    directory = str(tmp_path_factory.mktemp("sharded") / "ckpt")
    return {
        "saved": _run("save", "4", directory),
        "on2": _run("restore", "2", directory),
        "on1": _run("restore", "1", directory),
    }


def max_diff(a, b) -> float:
    pairs = zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    return max(float(np.abs(np.asarray(x) - np.asarray(y)).max()) for x, y in pairs)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["rules", "fsdp", "rules_1x4", "donate"])
def test_params_after_20_steps_equal_jit(trained, name):
    assert max_diff(trained[name], trained["jit"]) < TOL
    np.testing.assert_allclose(trained[name + "_loss"], trained["jit_loss"], atol=TOL)
    # fused steps (5 per call) and the way back to one device give the same
    if name in ("rules", "fsdp"):
        assert max_diff(trained[name + "_fused"], trained["jit"]) < TOL
    assert max_diff(trained[name + "_to_jit"], trained["jit"]) < TOL


def _norm(spec) -> tuple:
    """A spec without trailing None entries (P('model', None) == P('model'))."""
    spec = list(spec)
    while spec and spec[-1] is None:
        spec.pop()
    return tuple(spec)


def _check_kernel(layout, name, spec, shard):
    for part in ("params", "mu", "nu"):  # optimizer moments follow the params
        got_spec, shapes = layout[part][name[0]][name[1]]
        assert _norm(got_spec) == _norm(spec), (part, name, got_spec)
        assert shapes == [shard], (part, name, shapes)


def test_2x2_rules_shard_params_and_adam_moments(trained):
    layout = trained["rules_layout"]
    _check_kernel(layout, ("Dense_0", "kernel"), (None, "model"), (16, 64))
    _check_kernel(layout, ("Dense_1", "kernel"), ("model", None), (64, 4))
    _check_kernel(layout, ("Dense_0", "bias"), (), (128,))  # no rule: replicated
    assert trained["rules_fused_layout"]["params"] == layout["params"]
    # the large leaves take half the replicated bytes on every device
    for nbytes in layout["kernel_bytes"].values():
        assert nbytes <= trained["jit_kernel_bytes"] / 2
    replicated = trained["jit_memory"][0]
    assert all(b < 0.6 * replicated for b in layout["memory"].values())


def test_1x4_fsdp_shards_large_leaves_on_the_data_axis(trained):
    layout = trained["fsdp_layout"]
    # largest axis divisible by 4: the 128 columns
    _check_kernel(layout, ("Dense_0", "kernel"), (None, "data"), (16, 32))
    # under 1024 elements: replicated
    _check_kernel(layout, ("Dense_1", "kernel"), (), (128, 4))
    _check_kernel(layout, ("Dense_0", "bias"), (), (128,))
    for nbytes in layout["kernel_bytes"].values():
        assert nbytes <= trained["jit_kernel_bytes"] / 4
    assert set(layout["memory"]) == {0, 1, 2, 3}


def test_1x4_rules_quarter_the_memory_of_the_sharded_leaves(trained):
    layout = trained["rules_1x4_layout"]
    _check_kernel(layout, ("Dense_0", "kernel"), (None, "model"), (16, 32))
    for nbytes in layout["kernel_bytes"].values():
        assert nbytes <= trained["jit_kernel_bytes"] / 4


def test_adafactor_factored_moments_follow_their_parameter_less_one_axis(trained):
    assert max_diff(trained["adafactor"], trained["adafactor_jit"]) < TOL
    layout = trained["adafactor_layout"]
    # optax factors out the largest axis in v_row, the other in v_col.
    # Dense_0/kernel (16, 128) on P(None, "model"): v_row (16,) replicated, v_col
    # (128,) split on "model"; Dense_1/kernel (128, 4) on P("model", None): v_row
    # (4,) replicated, v_col (128,) split on "model"
    for part, name, spec, shard in (
        ("v_row", "Dense_0", (), (16,)),
        ("v_col", "Dense_0", ("model",), (64,)),
        ("v_row", "Dense_1", (), (4,)),
        ("v_col", "Dense_1", ("model",), (64,)),
        ("v", "Dense_0", (), (1,)),  # a placeholder for a factored parameter
    ):
        got_spec, shapes = layout[part][name]["kernel"]
        assert _norm(got_spec) == _norm(spec), (part, name, got_spec)
        assert shapes == [shard], (part, name, shapes)


def test_logs_are_readable_and_outputs_are_the_batch_rows(trained):
    assert trained["outputs_shape"] == (8, 4)
    assert np.isfinite(trained["loss_value"])


@pytest.mark.parametrize("kind", ["linen", "nnx"])
def test_flax_annotations_through_create_flax_state(trained, kind):
    runs = trained["flax"][kind]
    # BatchNorm statistics and dropout keys behave as under jit
    assert max_diff(runs["mesh"]["params"], runs["jit"]["params"]) < TOL
    if kind == "linen":  # (the NNX model has no BatchNorm)
        stats = runs["mesh"]["batch_stats"]
        assert stats and max_diff(stats, runs["jit"]["batch_stats"]) < TOL
    np.testing.assert_allclose(runs["mesh"]["loss"], runs["jit"]["loss"], atol=TOL)
    specs = {k.replace(".value", ""): _norm(v) for k, v in runs["specs"].items()}
    first, second = ("Dense_0", "Dense_1") if kind == "linen" else ("l1", "l2")
    assert specs[f"['{first}']['kernel']"] == (None, "model")
    assert specs[f"['{second}']['kernel']"] == ("model",)
    assert specs[f"['{second}']['bias']"] == ()
    assert dict(runs["param_specs"])[f"{first}/kernel"] == P(None, "model")
    assert runs["unboxed"]


@pytest.mark.parametrize(
    "case, words",
    [
        ("unknown_axis", ["'tensor'", "Dense", "'data': 2, 'model': 2"]),
        ("no_match", ["Conv_9", "Dense_0/kernel"]),
        ("not_dividing", ["'w'", "(6, 3)", "P(None, 'model')", "'model': 2", "3"]),
        ("bad_data_axis", ["'batch'", "['data', 'model']"]),
        ("bad_batch", ["size 1", "multiple of 2"]),
    ],
)
def test_errors_name_the_parameter_shape_spec_and_mesh(trained, case, words):
    message = trained["errors"][case]
    assert message is not None and message.startswith("ValueError"), message
    for word in words:
        assert word in message, (word, message)


@pytest.mark.slow
def test_checkpoint_written_on_4_devices_restores_on_2_and_1(checkpoints):
    saved = checkpoints["saved"]
    for where in ("on2", "on1"):
        restored = checkpoints[where]
        assert restored["steps"] == 20
        assert max_diff(restored["params"], saved["params"]) == 0
        assert max_diff(restored["mu"], saved["mu"]) == 0
        assert restored["trained"] == 21  # and it trains on
    # restored straight into the target's shardings (2 devices: halves)
    on2 = checkpoints["on2"]["layout"]["params"]["Dense_0"]["kernel"]
    assert (_norm(on2[0]), on2[1]) == ((None, "model"), [(16, 64)])
    assert checkpoints["on1"]["layout"]["params"]["Dense_0"]["kernel"][1] == [(16, 128)]


@pytest.mark.slow
def test_one_line_resume_with_a_sharded_state(checkpoints):
    saved = checkpoints["saved"]
    assert saved["first_steps"] == 10 and saved["resumed_steps"] == 20
    assert max_diff(saved["resumed"], saved["params"]) == 0
    kernel = saved["resumed_layout"]["params"]["Dense_0"]["kernel"]
    assert (_norm(kernel[0]), kernel[1]) == ((None, "model"), [(16, 64)])


@pytest.mark.slow
def test_two_processes_on_a_2x2_mesh_equal_the_single_process_run(trained):
    results = _multihost(num_processes=2)
    assert max_diff(results["params"], trained["rules"]) < TOL
    np.testing.assert_allclose(results["loss"], trained["rules_loss"], atol=TOL)
    assert results["shards"] == [(16, 64)]  # each device: half the kernel
    assert len(results["memory"]) == 2  # this process's two devices


# --- in this process (1 device) ---------------------------------------------------


def test_sharded_without_arguments_is_the_sharded_strategy():
    assert ciclo.sharded() is ciclo.get_strategy("sharded")


def test_same_arguments_give_the_same_registered_strategy():
    mesh = jax.make_mesh((1, 1), ("data", "model"))
    rules = [("kernel", P(None, "model"))]
    a = ciclo.sharded(mesh, rules=rules)
    assert ciclo.sharded(mesh, rules=list(rules)) is a
    assert ciclo.get_strategy(a.name) is a
    assert ciclo.sharded(mesh, rules=rules, fsdp=True) is not a


def test_a_one_device_mesh_trains_and_moves_between_strategies():
    mesh = jax.make_mesh((1, 1), ("data", "model"))
    strategy = ciclo.sharded(mesh, rules=[("w", P(None, "model"))], fsdp=True)

    @managed.train_step
    def fit(state, batch):
        return ciclo.logs().add_loss("l", jnp.mean((batch @ state.params["w"]) ** 2))

    state = managed.ManagedState.create(
        params={"w": jnp.ones((2, 3))}, tx=optax.adam(0.1), strategy=strategy
    )
    assert state.strategy == strategy.name
    assert state.params["w"].sharding.spec == P(None, "model")
    logs, state = fit(state, jnp.ones((4, 2)))
    assert int(state.step) == 1 and np.isfinite(float(logs.losses.l))
    host = state.with_strategy("jit")
    assert host.strategy == "jit" and host.params["w"].shape == (2, 3)
    assert set(state.memory().values()) == {state.memory()[jax.devices()[0]]}


def test_param_specs_annotations_on_a_managed_state():
    mesh = jax.make_mesh((1, 1), ("data", "model"))
    state = managed.ManagedState.create(
        params={"a": jnp.ones((2, 4)), "b": jnp.ones(3)},
        tx=optax.sgd(0.1),
        strategy=ciclo.sharded(mesh),
        param_specs={"a": P("data", "model"), "b": None},
    )
    assert state.param_specs == (("a", P("data", "model")),)
    assert state.params["a"].sharding.spec == P("data", "model")
    # an annotation naming an axis the mesh lacks is dropped (default mesh: 'data')
    plain = state.with_strategy("sharded")
    assert plain.params["a"].sharding.spec == P("data", None)


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        (dict(mesh="mesh"), TypeError, ["jax.sharding.Mesh", "str"]),
        (dict(rules="kernel"), TypeError, ["list of (regex, PartitionSpec)"]),
        (dict(rules=[("kernel", "model")]), TypeError, ["PartitionSpec", "'kernel'"]),
        (dict(rules=[("(", P())]), ValueError, ["regular expression"]),
        (dict(fsdp="yes"), TypeError, ["fsdp", "'yes'"]),
    ],
)
def test_bad_arguments_are_clear_errors(kwargs, error, words):
    with pytest.raises(error) as info:
        ciclo.sharded(**kwargs)
    for word in words:
        assert word in str(info.value), (word, str(info.value))
