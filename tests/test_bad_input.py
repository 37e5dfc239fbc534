"""Every bad input of API.md §3 and the "Bad input" list of docs/loop.md: one clear error
naming the culprit and the fix, or the documented handling (a warning)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ciclo
from ciclo import managed

ALWAYS = ciclo.every(1)
ROOT = Path(__file__).parent.parent


def _step(state, batch):
    return ciclo.logs().add_metric("x", batch), state + 1


def _subprocess(code: str, **env) -> subprocess.CompletedProcess:
    # the checkout first, the caller's path kept (packages may come from there)
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    environment = {**os.environ, "PYTHONPATH": path, "JAX_PLATFORMS": "cpu"}
    environment.pop("XLA_FLAGS", None)
    environment.update(env)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, env=environment, timeout=240,
    )  # fmt: skip


# -- API.md §3 ---------------------------------------------------------------------
def test_task_key_that_is_not_a_schedule():
    with pytest.raises(TypeError, match=r"Task key 3 \(int\) is not a schedule.*every"):
        ciclo.loop(0, [1], {3: _step})


def test_callback_that_is_not_callable():
    with pytest.raises(
        TypeError, match=r"tasks\[every\(steps=1\)\]\[0\] is 3 .*not callable"
    ):
        ciclo.loop(0, [1], {ALWAYS: 3})


def test_three_tuple_return_names_the_callback():
    def three(state):
        return 1, 2, 3

    with pytest.raises(TypeError, match=r"three returned a tuple of length 3"):
        ciclo.loop(0, [1], {ALWAYS: three})


def test_unknown_named_schedule_lists_the_valid_ones():
    with pytest.raises(
        ValueError, match=r"'on_trian_step'.*Did you mean 'on_train_step'"
    ):
        ciclo.train_loop(0, [1], {"on_trian_step": _step})


def test_monitored_metric_that_never_appears():
    for callback in (ciclo.early_stopping("nope", 2),):
        with pytest.raises(ValueError, match=r"'nope' was not logged.*metrics\.x"):
            ciclo.loop(0, [1], {ALWAYS: [_step, callback]})


# -- datasets, stop, schedules, periods -------------------------------------------
def test_empty_dataset_runs_nothing_and_train_loop_warns():
    with pytest.warns(UserWarning, match=r"ciclo.loop: `dataset` yielded no batch"):
        state, history, elapsed = ciclo.loop(0, [], {ALWAYS: _step})
    assert (state, len(history), elapsed.steps) == (0, 0, 0)  # documented: ends
    with pytest.warns(UserWarning, match=r"`dataset` yielded no batch"):
        ciclo.train_loop(0, iter([]), {ciclo.on_train_step: _step},
                         callbacks=[ciclo.keras_bar()])  # fmt: skip


def test_dataset_that_is_not_iterable():
    with pytest.raises(
        TypeError, match=r"`dataset` must be an iterable.*got 5 \(int\)"
    ):
        ciclo.loop(0, 5, {ALWAYS: _step})
    with pytest.raises(TypeError, match=r"train_loop: `dataset` is 5 \(int\)"):
        ciclo.train_loop(0, 5, {ciclo.on_train_step: _step})


@pytest.mark.parametrize("stop", ["10", 1.5, True, [3]])
def test_stop_of_a_wrong_type(stop):
    with pytest.raises(
        TypeError, match=r"`stop` must be an int \(steps\) or a ciclo.Period"
    ):
        ciclo.loop(0, [1], {ALWAYS: _step}, stop=stop)


@pytest.mark.parametrize("n", [0, -1])
def test_every_zero_or_negative(n):
    with pytest.raises(ValueError, match=r"must be positive \(> 0\)"):
        ciclo.every(n)


def test_negative_stop_or_patience_names_the_argument():
    with pytest.raises(ValueError, match=r"`stop` must be >= 0 steps, got -1"):
        ciclo.loop(0, [1], {ALWAYS: _step}, stop=-1)
    with pytest.raises(ValueError, match=r"`stop` must be >= 0 steps, got -1"):
        ciclo.train_loop(0, [1], {ciclo.on_train_step: _step}, stop=-1)
    with pytest.raises(ValueError, match=r"`patience` must be >= 0 steps, got -2"):
        ciclo.early_stopping("x", patience=-2)


def test_period_with_no_field():
    with pytest.raises(
        ValueError, match=r"at least one of steps, samples, time or date"
    ):
        ciclo.at()


# -- callbacks ---------------------------------------------------------------------
def test_callback_raising_mid_loop_reraises_with_a_note_and_keeps_the_history():
    def boom(state, batch):
        if batch == 2:
            raise RuntimeError("boom")

    history = ciclo.history()
    with pytest.raises(RuntimeError, match="boom") as info:
        ciclo.loop(0, range(5), {ALWAYS: [_step, boom]}, history=history)
    note = "\n".join(info.value.__notes__)
    assert "step 2" in note and "boom" in note and "2 rows" in note
    assert history.collect("steps", "x") == ([0, 1], [0, 1])  # up to the last step


def test_dataset_raising_mid_loop_is_named_with_the_step_it_was_fetching():
    def batches():
        yield from range(3)
        raise OSError("unreadable shard")

    history = ciclo.history()
    with pytest.raises(OSError, match="unreadable shard") as info:
        ciclo.loop(0, batches(), {ALWAYS: _step}, history=history)
    note = "\n".join(info.value.__notes__)
    assert "dataset" in note and "step 3" in note and "3 rows" in note, note
    assert history.collect("steps") == [0, 1, 2]


def test_bare_array_returned_for_a_structured_state_is_an_error_naming_it():
    def eval_step(state, batch):  # Jax Fit style: returns its accuracy
        return jnp.mean(batch)

    with pytest.raises(
        TypeError, match=r"eval_step returned an array of shape \(\).*add_metric"
    ):
        ciclo.loop({"w": jnp.ones(2)}, [jnp.ones(2)], {ALWAYS: eval_step})


def test_legit_state_returns_pass_the_check():
    import dataclasses

    @dataclasses.dataclass
    class State:
        w: float

    @dataclasses.dataclass
    class Subclass(State):
        pass

    cases = [
        (0, lambda s, b: s + b),  # int -> int
        (0, lambda s, b: jnp.asarray(s + b)),  # number -> array
        (jnp.zeros(()), lambda s, b: s + b),  # array -> array
        ({"w": 1}, lambda s, b: {"w": s["w"] + b}),  # dict -> dict
        (State(0.0), lambda s, b: Subclass(s.w + b)),  # class -> subclass
        (None, lambda s, b: 1),  # a first state
        ((1, 2), lambda s, b: (None, (s[0] + b, s[1]))),  # tuple state via (None, s)
    ]
    for state, callback in cases:
        ciclo.loop(state, [1, 2], {ALWAYS: callback})


def test_swapped_return_with_a_params_dict_state():
    with pytest.raises(
        TypeError, match=r"the logs come first\. Return \(logs, state\)"
    ):
        ciclo.loop({"w": 1}, [1], {ALWAYS: lambda s: ({"w": 2}, ciclo.logs())})


def test_a_logs_in_the_second_place_names_the_callback():
    def twice(state):
        return ciclo.logs().add_metric("a", 1), ciclo.logs().add_metric("b", 2)

    with pytest.raises(
        TypeError, match=r"twice returned \(Logs, Logs\).*second.*new state"
    ):
        ciclo.loop(0, [1, 2], {ALWAYS: twice})
    with pytest.raises(TypeError, match=r"returned \(NoneType, Logs\)"):
        ciclo.loop(0, [1], {ALWAYS: lambda: (None, ciclo.logs())})


def test_a_str_returned_for_a_number_state_is_an_error():
    def hello(state):
        return "hello"

    with pytest.raises(TypeError, match=r"hello returned a str where the state"):
        ciclo.loop(0, [1, 2], {ALWAYS: hello})


def test_keras_bar_without_the_call():
    with pytest.raises(TypeError, match=r"class keras_bar.*keras_bar\(\.\.\.\)"):
        ciclo.train_loop(
            0, [1], {ciclo.on_train_step: _step}, callbacks=[ciclo.keras_bar]
        )


@pytest.mark.parametrize("name", ["keras_bar", "tqdm_bar", "early_stopping"])
def test_uncalled_callback_class_or_factory_in_a_task_list(name):
    uncalled = getattr(ciclo, name)
    fix = rf"not a callback.*did you mean ciclo\.{name}\(\.\.\.\)"
    with pytest.raises(TypeError, match=rf"tasks\[every\(steps=1\)\]\[1\].*{fix}"):
        ciclo.loop(0, [1], {ALWAYS: [_step, uncalled]})
    with pytest.raises(TypeError, match=fix):
        ciclo.loop(0, [1], {ALWAYS: _step}, on_end=uncalled)
    with pytest.raises(TypeError, match=fix):
        ciclo.train_loop(0, [1], {ciclo.on_train_batch_end: [_step, uncalled]})


def test_spreading_an_uncalled_bar_class_names_the_fix():
    for bar in (ciclo.keras_bar, ciclo.tqdm_bar):
        with pytest.raises(TypeError, match=r"build one first.*\(\.\.\.\)\}"):
            ciclo.loop(0, [1], {ALWAYS: _step, **bar})
    assert len({**ciclo.keras_bar()}) == 1  # an instance spreads


def test_metric_name_clash_between_the_step_and_the_test_loop():
    class State(int):
        def train_step(self, batch):
            logs = ciclo.logs().add_metric("accuracy_test", 1.0)
            return logs, State(self + 1)

        def test_step(self, batch):
            return ciclo.logs().add_metric("accuracy", 0.5)

    with pytest.raises(
        ValueError, match=r"\['metrics.accuracy_test'\] were already logged"
    ):
        ciclo.train_loop(State(0), [1] * 2, test_dataset=lambda: [1], epoch_duration=1)
    # a bare name in two collections is ambiguous when read, with the fix
    _, history, _ = ciclo.loop(0, [1], {ALWAYS: lambda: ciclo.logs()
                                        .add_metric("l", 1).add_loss("l", 2)})  # fmt: skip
    with pytest.raises(ValueError, match=r"'l' is ambiguous.*'metrics.l', 'losses.l'"):
        history.collect("l")


# -- test_dataset, monitors ----------------------------------------------------------
class _Model(int):
    def train_step(self, batch):
        return ciclo.logs().add_loss("loss", 1.0), _Model(self + 1)

    def test_step(self, batch):
        return ciclo.logs().add_metric("acc", 0.5)


def test_test_dataset_yielding_no_batch_warns_and_monitors_see_no_stale_value():
    batches = (b for b in [1, 2])  # one generator: exhausted after epoch 1

    with pytest.warns(UserWarning, match=r"`test_dataset\(\)` yielded no batch.*FRESH"):
        _, history, _ = ciclo.train_loop(
            _Model(0), [1] * 4, test_dataset=lambda: batches, epoch_duration=2
        )
    assert history.collect("steps", "acc_test") == ([1], [0.5])
    batches = (b for b in [1, 2])
    with (
        pytest.warns(UserWarning),
        pytest.raises(
            ValueError,
            match=r"'acc_test' was not logged at step 3 \(it was at an earlier",
        ),
    ):  # early_stopping does not reuse the first epoch's value
        ciclo.train_loop(
            _Model(0), [1] * 4, test_dataset=lambda: batches, epoch_duration=2,
            callbacks=[ciclo.early_stopping("acc_test", patience=1, mode="max")],
        )  # fmt: skip


# -- managed -------------------------------------------------------------------------
def test_non_scalar_loss_in_a_managed_train_step():
    @managed.train_step
    def fit(state, batch):
        return ciclo.logs().add_loss("l", state.params * batch)

    state = managed.ManagedState.create(params=jnp.ones(3), tx=optax.sgd(0.1))
    with pytest.raises(
        TypeError, match=r"'losses.l' logged by .*fit has shape \(3,\).*jnp.mean"
    ):
        fit(state, jnp.ones(3))


def test_state_without_params_given_to_managed_train_step():
    @managed.train_step
    def fit(state, batch):
        return ciclo.logs().add_loss("l", jnp.mean(batch))

    with pytest.raises(
        TypeError, match=r"needs a ciclo.managed.ManagedState.*got dict"
    ):
        fit({"w": jnp.ones(3)}, jnp.ones(3))

    class NoParams:
        strategy = "jit"

    with pytest.raises(TypeError, match=r"NoParams it got has no `params`"):
        fit(NoParams(), jnp.ones(3))


def test_batch_not_divisible_across_devices():
    result = _subprocess(
        """
        import sys, jax
        if jax.device_count() != 4:  # the forced host devices did not take
            sys.exit(f"SKIP: {jax.device_count()} devices, not 4")
        import jax.numpy as jnp, optax, ciclo
        from ciclo import managed
        @managed.train_step
        def fit(state, batch):
            return ciclo.logs().add_loss("l", jnp.mean(state.params * batch))
        state = managed.ManagedState.create(
            params=jnp.ones(()), tx=optax.sgd(0.1), strategy="data_parallel")
        fit(state, jnp.ones(6))
        """,
        XLA_FLAGS="--xla_force_host_platform_device_count=4",
        JAX_NUM_CPU_DEVICES="4",
    )
    if "SKIP:" in result.stderr:
        pytest.skip(result.stderr.strip().splitlines()[-1])
    assert result.returncode != 0
    assert "does not split evenly across 4 devices" in result.stderr, result.stderr[
        -2000:
    ]


def test_missing_optional_dependency_says_what_to_install():
    result = _subprocess(
        """
        import sys
        sys.modules["orbax"] = None
        sys.modules["orbax.checkpoint"] = None
        import ciclo
        ciclo.checkpoint("/tmp/never")
        """
    )
    assert result.returncode != 0
    assert "pip install 'ciclo[checkpoint]'" in result.stderr, result.stderr[-2000:]


def test_an_import_error_of_an_installed_package_is_not_called_a_missing_extra():
    # orbax is installed but an import inside it fails (e.g. an incompatible
    # version): the message names the failing import and says to upgrade, not
    # that the extra is missing; an error in ciclo's own modules stays as it is
    result = _subprocess(
        """
        import sys, types
        broken = types.ModuleType("orbax.checkpoint")
        def __getattr__(name):
            raise ImportError("cannot import name 'CheckpointManager' from "
                              "'orbax.checkpoint'", name="orbax.checkpoint")
        broken.__getattr__ = __getattr__
        sys.modules["orbax.checkpoint"] = broken
        import ciclo
        try:
            ciclo.checkpoint
        except ImportError as error:
            print("MESSAGE:", error, file=sys.stderr)
            raise
        """
    )
    assert result.returncode != 0
    message = result.stderr.split("MESSAGE:", 1)[-1]
    assert "is installed but" in message and "CheckpointManager" in message, message
    assert "pip install -U 'ciclo[checkpoint]'" in message, message


# -- checkpoints -------------------------------------------------------------------
def _foreign(directory):
    """A directory with a step folder ciclo/orbax did not write."""
    (directory / "7").mkdir(parents=True)
    (directory / "7" / "weights.bin").write_bytes(b"\0" * 8)
    return directory


def _one_line(error):
    message = str(error)
    assert "\n" not in message and len(message) < 600, message
    return message


def test_checkpoint_directory_with_a_foreign_layout(tmp_path):
    directory = _foreign(tmp_path / "ckpts")
    foreign = (
        rf"{directory}.*not ciclo checkpoints.*7/.*weights\.bin.*directory of its own"
    )
    with pytest.raises(ValueError, match=foreign) as info:
        ciclo.restore(directory, {"w": jnp.zeros(2)})
    _one_line(info.value)
    with pytest.raises(ValueError, match=foreign):
        ciclo.restore(directory)
    with pytest.raises(ValueError, match=foreign):
        ciclo.train_loop(
            {"w": jnp.zeros(2)}, [1, 2], {ciclo.on_train_step: lambda s: s},
            resume=directory,
        )  # fmt: skip
    # a checkpoint used in a loop never deletes what it did not write
    for keep in (1, 3):
        ckpt = ciclo.checkpoint(directory, keep=keep)
        with pytest.raises(ValueError, match=foreign):
            ciclo.loop({"w": jnp.zeros(2)}, [1, 2, 3], {ALWAYS: ckpt})
    with pytest.raises(ValueError, match=foreign):
        ciclo.checkpoint(directory)(ciclo.Elapsed.create(steps=9), {"w": jnp.ones(2)})
    assert sorted(os.listdir(directory)) == ["7"]
    assert os.listdir(directory / "7") == ["weights.bin"]


def test_restoring_into_a_state_of_a_different_structure(tmp_path):
    ckpt = ciclo.checkpoint(tmp_path)
    ckpt(ciclo.Elapsed.create(), {"w": jnp.ones(2), "n": {"a": jnp.ones(3)}})
    ckpt.close()
    with pytest.raises(
        ValueError,
        match=r"structure.*not in the checkpoint: \['b'\].*only in the checkpoint: "
        r"\['n/a'\].*target_state",
    ) as info:
        ciclo.restore(tmp_path, {"w": jnp.zeros(2), "b": jnp.zeros(3)})
    message = _one_line(info.value)
    assert "ShapeDtypeStruct" not in message and "partial_restore" not in message
    with pytest.raises(
        ValueError, match=r"shape.*'w': saved \(2,\), target \(3,\)"
    ) as info:
        ciclo.restore(tmp_path, {"w": jnp.zeros(3), "n": {"a": jnp.zeros(3)}})
    _one_line(info.value)
    with pytest.raises(ValueError, match=r"not in the checkpoint: \['b'\]"):
        ciclo.train_loop(
            {"w": jnp.zeros(2), "b": jnp.zeros(3)}, [1], {ciclo.on_train_step: _step},
            resume=tmp_path,
        )  # fmt: skip


def test_two_checkpoint_writers_on_one_directory(tmp_path):
    a, b = ciclo.checkpoint(tmp_path), ciclo.checkpoint(tmp_path)
    with pytest.raises(ValueError, match=r"Two ciclo.checkpoint writers save to"):
        ciclo.loop(jnp.zeros(()), [1, 2], {ALWAYS: [lambda s, b: s + b, a, b]})


# -- messages ------------------------------------------------------------------------
def test_no_error_message_embeds_a_multi_line_array_repr():
    big = np.zeros((50, 50))
    with pytest.raises(TypeError) as info:
        ciclo.loop(0, big[0, 0], {ALWAYS: _step})  # a 0-d array: not iterable
    assert "\n" not in str(info.value)
    for bad in (big, jnp.zeros((50, 50))):
        for call in (
            lambda bad=bad: ciclo.loop(0, [1], {ALWAYS: bad}),
            lambda bad=bad: ciclo.loop(0, [1], {ALWAYS: _step}, stop=bad),
            lambda bad=bad: ciclo.train_loop(
                0, [1], {ciclo.on_train_step: _step}, test_dataset=bad
            ),
            lambda bad=bad: ciclo.loop(0, [1], {ALWAYS: _step}, elapsed=bad),
        ):
            with pytest.raises(TypeError) as info:
                call()
            assert len(str(info.value)) < 600 and str(info.value).count("\n") <= 1, str(
                info.value
            )
    # arrays inside a container (a list of batches given for a factory): each
    # by its type, shape and dtype, never its values
    batches = [(np.full((16, 8), 0.123456), np.zeros(16))]
    with pytest.raises(TypeError, match="zero-argument callable") as info:
        ciclo.train_loop(0, [1], {ciclo.on_train_step: _step}, test_dataset=batches)
    assert "[(ndarray(16, 8) float64, ndarray(16,) float64)] (list)" in str(info.value)
    assert "0.123" not in str(info.value)
    arrays = [np.full((16, 8), 0.123456)] * 3
    for call in (
        lambda: ciclo.every(arrays),
        lambda: ciclo.at(steps=arrays),
        lambda: list(ciclo.fuse([1], arrays)),
        lambda: ciclo.loop(0, [1], {ALWAYS: _step}, prefetch=arrays),
        lambda: ciclo.early_stopping("loss", 2, baseline=arrays),
        lambda: list(ciclo.elapse([1], initial=arrays)),
    ):
        with pytest.raises((TypeError, ValueError)) as info:
            call()
        assert "0.123" not in str(info.value) and "ndarray(16, 8)" in str(info.value)


def test_a_pair_state_returned_bare_is_an_error_at_step_0():
    # a step returning its new (params_dict, opt_state) state without (logs, state)
    # would be read as logs=params, state=opt_state; the error comes at step 0
    state = ({"w": np.ones(2)}, np.zeros(2))

    def step(state, batch):
        params, opt = state
        return {"w": params["w"] - 0.1}, opt + 1  # bare pair: ambiguous

    with pytest.raises(
        TypeError, match=r"Return \(None, state\) for a tuple state"
    ) as e:
        ciclo.loop(state, range(3), {ciclo.every(1): step})
    assert "structure of the state" in str(e.value)
    assert "raised at step 0" in "".join(getattr(e.value, "__notes__", []))

    def good(state, batch):  # the same step, unambiguous: both readings work
        params, opt = state
        return None, ({"w": params["w"] - 0.1}, opt + 1)

    (params, opt), _, _ = ciclo.loop(state, range(3), {ciclo.every(1): good})
    np.testing.assert_allclose(params["w"], 0.7)

    def logs_and_pair(state, batch):  # (logs dict, pair state): logs as ever
        return {"metrics": {"m": 1.0}}, state

    _, history, _ = ciclo.loop(state, range(2), {ciclo.every(1): logs_and_pair})
    assert history.collect("m") == [1.0, 1.0]


def test_elapse_and_elapsed_arguments_of_the_wrong_kind_name_the_argument():
    with pytest.raises(TypeError, match=r"`initial` must be a ciclo.Elapsed"):
        list(ciclo.elapse([1, 2], initial=5))
    with pytest.raises(TypeError, match=r"`dataset` must be iterable.*int"):
        list(ciclo.elapse(5))
    with pytest.raises(TypeError, match=r"batch_size_fn.*returned 'x'"):
        list(ciclo.elapse([np.zeros(2)] * 2, batch_size_fn=lambda shapes: "x"))
    with pytest.raises(TypeError, match=r"batch_size_fn.*returned 'x'"):
        ciclo.loop(None, [np.zeros(2)] * 2, {ciclo.every(1): lambda: None},
                   batch_size_fn=lambda shapes: "x")  # fmt: skip
    with pytest.raises(TypeError, match=r"Elapsed.create\(steps=...\)` must be an int"):
        ciclo.Elapsed.create(steps="a")
    with pytest.raises(ValueError, match=r"Elapsed.create\(samples=...\)` must be"):
        ciclo.Elapsed.create(samples=-1)


def test_create_flax_state_with_an_uncalled_or_named_optimizer_names_tx():
    import flax.linen as nn

    x = np.ones((1, 3), np.float32)
    xent = optax.softmax_cross_entropy_with_integer_labels
    for tx in (optax.adam, "adam"):
        with pytest.raises(TypeError, match=r"`tx` must be an optax") as info:
            ciclo.create_flax_state(nn.Dense(2), x, tx, losses={"loss": xent})
        assert repr(tx)[:20] in str(info.value)
    with pytest.raises(TypeError, match=r"did you mean optax.adam\(learning_rate"):
        ciclo.create_flax_state(nn.Dense(2), x, optax.adam, losses={"loss": xent})
