"""The original Ciclo 0.1 README (`shared/seeds/ciclo-readme.md`), snippet by
snippet, unmodified but for the model and the data: a linear softmax classifier on
scikit-learn's bundled digits (no download), trained with optax. Managed steps of
any arity and `create_flax_state`'s `avg_<loss>` included.
"""

import datetime

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ciclo

load_digits = pytest.importorskip(
    "sklearn.datasets", reason="the digits data needs scikit-learn (ciclo[test])"
).load_digits

# -- the user's model and data (what the README leaves as `...`) ---------------------
_digits = load_digits()
X = (_digits.data / 16.0).astype(np.float32)
Y = _digits.target.astype(np.int32)
BATCH = 32
TX = optax.adam(1e-2)


def batches(n, offset=0):
    out = []
    for i in range(n):
        start = ((i + offset) * BATCH) % (len(X) - BATCH)
        out.append((X[start : start + BATCH], Y[start : start + BATCH]))
    return out


def create_state():
    params = {"w": jnp.zeros((64, 10)), "b": jnp.zeros((10,))}
    return {"params": params, "opt_state": TX.init(params)}


def loss_and_accuracy(params, x, y):
    logits = x @ params["w"] + params["b"]
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    return loss, jnp.mean(jnp.argmax(logits, -1) == y)


def get_test_dataset():
    return batches(3, offset=40)


dataset = train_dataset = batches(30)
total_steps = 20
steps_per_epoch = 5


@jax.jit
def train_step(state, batch):
    x, y = batch
    (loss, accuracy), grads = jax.value_and_grad(loss_and_accuracy, has_aux=True)(
        state["params"], x, y
    )
    updates, opt_state = TX.update(grads, state["opt_state"], state["params"])
    state = {
        "params": optax.apply_updates(state["params"], updates),
        "opt_state": opt_state,
    }
    # -- from here as in the README
    logs = ciclo.logs()
    logs.add_metric("accuracy", accuracy)
    logs.add_metric("loss", loss)
    return logs, state


@jax.jit
def test_step(state, batch):
    loss, accuracy = loss_and_accuracy(state["params"], *batch)
    # -- from here as in the README
    logs = ciclo.logs()
    logs.add_metric("accuracy", accuracy)
    logs.add_metric("loss", loss)
    return logs, state


test_step.__test__ = False  # the README's name; not a pytest test


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the README writes to "logdir/model"


# -- 🌀 Loop Language -----------------------------------------------------------------
def test_loop_language():
    state = create_state()  # initial state

    state, history, elapsed = ciclo.loop(
        state,  # Pytree
        dataset,  # Iterable[Batch]
        {  # Schedule: List[Callback]
            ciclo.every(1): [train_step],
            ciclo.every(steps=10): [ciclo.checkpoint(f"logdir/model")],  # noqa: F541
            ciclo.every(1): [ciclo.keras_bar(total=total_steps)],
        },
        stop=total_steps,
    )
    assert elapsed.steps == total_steps
    assert len(history.collect("accuracy")) == total_steps
    assert history.collect("loss")[-1] < history.collect("loss")[0]
    _, restored = ciclo.restore("logdir/model", create_state())
    assert restored.steps == 11  # saved after batch 10 (steps 0 and 10 fire)


# -- 🧪 Predefined Loops ---------------------------------------------------------------
def test_train_loop():
    state = create_state()
    calls = []

    def some_callback(state, batch, elapsed):
        calls.append(elapsed.steps)

    state, history, elapsed = ciclo.train_loop(
        state,  # Pytree
        train_dataset,  # Iterable[Batch]
        {  # Schedule: List[Callback]
            ciclo.on_train_step: [train_step],  # named schedules
            ciclo.on_test_step: [test_step],  # named schedules
            ciclo.every(20): [some_callback],  # regular schedules also supported
        },
        test_dataset=lambda: get_test_dataset(),  # lazy test dataset definition
        epoch_duration=steps_per_epoch,
        callbacks=[
            # callback self-registration
            ciclo.keras_bar(total=total_steps),  # runs on ciclo.on_train_batch_end
            ciclo.checkpoint(f"logdir/model"),  # noqa: F541  # runs on ciclo.on_epoch_end
        ],
        stop=total_steps,
    )
    assert elapsed.steps == total_steps and calls == [0]
    # epochs end after the batch that completes them (not at step 0; see README)
    steps, accuracy_test = history.collect("steps", "accuracy_test")
    assert steps == [4, 9, 14, 19] and len(accuracy_test) == 4
    assert ciclo.restore("logdir/model", create_state())[1].steps == total_steps


# -- Managed API 🧪 ---------------------------------------------------------------------
def _managed_state():
    from ciclo import managed

    params = {"w": jnp.zeros((64, 10)), "b": jnp.zeros((10,))}
    state = managed.ManagedState.create(
        params=params,  # can be any pytree
        tx=optax.adamw(1e-3),  # optax optimizer
        strategy="jit",  # "data-parallel" or "eager"
    )
    return managed, state


def test_managed_train_step_and_step(capsys):
    managed, state = _managed_state()

    @managed.train_step
    def train_step(state, batch):
        loss = loss_and_accuracy(state.params, *batch)[0]  # compute loss
        logs = ciclo.logs()
        logs.add_loss("loss", loss)  # <<< register loss
        return logs, state

    for batch in train_dataset[:3]:
        logs, state = train_step(state, batch)
        print(f"loss: {logs.losses.loss}")
    assert capsys.readouterr().out.count("loss: ") == 3
    assert int(state.step) == 3

    @managed.step
    def test_step(state, batch):
        loss = loss_and_accuracy(state.params, *batch)[0]  # compute loss
        logs = ciclo.logs()
        logs.add_metric("loss", loss)
        return logs, state

    logs, state = test_step(state, train_dataset[0])
    assert np.isfinite(float(logs.metrics.loss))


def test_managed_steps_take_any_callback_arity_and_spread_into_tasks():
    managed, state = _managed_state()

    @managed.train_step
    def train_step(state, batch, elapsed):
        loss = loss_and_accuracy(state.params, *batch)[0]
        return ciclo.logs().add_loss("loss", loss), state

    @managed.step
    def count(state):
        return ciclo.logs().add_metric("step", state.step)

    state, history, _ = ciclo.loop(
        state, train_dataset[:4], {ciclo.every(1): [train_step, count]}
    )
    assert history.collect("step") == [1, 2, 3, 4]
    state, history, _ = ciclo.train_loop(state, train_dataset[:2], {**train_step})
    assert len(history.collect("loss")) == 2


def test_create_flax_state_logs_avg_loss():
    import flax.linen as nn

    def cross_entropy_loss(preds, target):
        return optax.softmax_cross_entropy_with_integer_labels(preds, target).mean()

    def accuracy(preds, target):
        return jnp.mean(jnp.argmax(preds, -1) == target)

    model = nn.Sequential([nn.Dense(10)])
    state = ciclo.create_flax_state(
        model,
        inputs=jnp.empty((1, 64)),
        tx=optax.adamw(1e-3),
        losses={"loss": cross_entropy_loss},
        metrics={"accuracy": accuracy},
        strategy="jit",
    )
    state, history, elapsed = ciclo.train_loop(
        state,  # methods are automatically registered
        train_dataset,
        callbacks=[ciclo.keras_bar(total=6)],
        test_dataset=lambda: get_test_dataset(),
        epoch_duration=3,
        stop=6,
    )
    assert len(history.collect("avg_loss")) == 6
    assert len(history.collect("avg_loss_test")) == 2


# -- Framework Support 🧪 -------------------------------------------------------------------
# The README's MNIST-shaped inputs, (28, 28, 1) pixels in 0..255: the digits images
# upscaled 3x (24x24) and padded. The README leaves `Accuracy` and `AverageLoss`
# undefined; they are clu metrics, as in the original's examples/05 (clu's own
# `Accuracy` here: ciclo hands it `logits` and `labels`).
IMAGES = np.pad(np.kron(_digits.images, np.ones((3, 3))), ((0, 0), (2, 2), (2, 2)))
IMAGES = (IMAGES[..., None] * 255.0 / 16.0).astype(np.float32)


def image_batches(n, offset=0):
    return [
        (IMAGES[(i + offset) * BATCH :][:BATCH], Y[(i + offset) * BATCH :][:BATCH])
        for i in range(n)
    ]


def framework_state():
    import flax.linen as nn

    metrics = pytest.importorskip("clu.metrics", reason="needs ciclo[flax] (clu)")

    Accuracy = metrics.Accuracy
    AverageLoss = metrics.Average.from_output("loss")

    def cross_entropy_loss(preds, target):
        return optax.softmax_cross_entropy_with_integer_labels(preds, target).mean()

    # -- from here as in the README
    model = nn.Sequential([
        lambda x: x.reshape((x.shape[0], -1)) / 255.0,
        nn.Dense(128),
        nn.relu,
        nn.Dense(10),
    ])  # fmt: skip
    state = ciclo.create_flax_state(
        model,
        inputs=jnp.empty((1, 28, 28, 1)),
        tx=optax.adamw(1e-3),
        losses={"loss": cross_entropy_loss},
        metrics={"accuracy": Accuracy, "avg_loss": AverageLoss},
        strategy="jit",  # "data-parallel" or "eager"
    )
    return state


def test_framework_support_create_flax_state_in_train_loop():
    state = framework_state()
    train_dataset = image_batches(20)

    def get_test_dataset():
        return image_batches(3, offset=40)

    state, history, elapsed = ciclo.train_loop(
        state,  # methods are automatically registered
        train_dataset,
        callbacks=[
            ciclo.keras_bar(total=total_steps),
        ],
        test_dataset=lambda: get_test_dataset(),
        epoch_duration=steps_per_epoch,
        stop=total_steps,
    )
    assert elapsed.steps == total_steps
    steps, loss, avg_loss, accuracy = history.collect(
        "steps", "loss", "avg_loss", "accuracy"
    )
    assert steps == list(range(total_steps)) and loss[-1] < loss[0]
    # the stateful metrics accumulate over the epoch (reset at each epoch end)
    expected = [np.mean(loss[i - i % steps_per_epoch : i + 1]) for i in steps]
    np.testing.assert_allclose(avg_loss, expected, rtol=1e-5)
    assert all(0.0 <= a <= 1.0 for a in accuracy)
    steps, accuracy_test, avg_loss_test = history.collect(
        "steps", "accuracy_test", "avg_loss_test"
    )
    assert steps == [4, 9, 14, 19] and avg_loss_test[-1] < avg_loss_test[0]
    assert all(0.0 <= a <= 1.0 for a in accuracy_test)


def test_framework_support_train_step_by_hand(capsys):
    state = framework_state()
    train_dataset = image_batches(5)

    for batch in train_dataset:
        logs, state = state.train_step(batch)
        print(f"loss: {logs.losses.loss}")

    printed = capsys.readouterr().out.splitlines()
    losses = [float(line.removeprefix("loss: ")) for line in printed]
    assert len(losses) == 5 and losses[-1] < losses[0]
    assert int(state.step) == 5


# -- Manual Iteration --------------------------------------------------------------------
def test_manual_iteration():
    state = create_state()
    call_checkpoint = ciclo.every(steps=10)  # Schedule (README: 1000)
    checkpoint = ciclo.checkpoint(f"logdir/model")  # noqa: F541  # Callback
    keras_bar = ciclo.keras_bar(total=total_steps)  # Callback
    history = ciclo.history()  # History
    # (Elapsed, Batch)
    for elapsed, batch in ciclo.elapse(train_dataset, stop=total_steps):
        logs = ciclo.logs()  # Logs
        # update logs and state
        logs.updates, state = train_step(state, batch)
        # periodically checkpoint state
        if call_checkpoint(elapsed):
            checkpoint(elapsed, state)  # serialize state

        keras_bar(elapsed, logs)  # update progress bar
        history.commit(elapsed, logs)  # commit logs to history

    assert history.collect("steps") == list(range(total_steps))
    assert len(history.collect("accuracy")) == total_steps
    _, restored = ciclo.restore("logdir/model", create_state())  # no wait() needed
    assert restored.steps == 11


# -- the APIs the README's snippets and the 0.1 examples rely on -----------------------
def test_logs_calls_chain():
    logs = ciclo.logs().add_loss("loss", 1.0).add_metric("accuracy", 0.5)
    logs = logs.add_metrics({"a": 1}).add_losses(l2=0.1).add_stateful_metric("s", 2)
    logs = logs.add_output("y", 3).add_entry("custom", "z", 4)
    assert logs.losses.loss == 1.0 and logs.metrics.accuracy == 0.5
    assert logs.entry_value("z") == 4 and logs.stateful_metrics.s == 2


def test_history_collect_aligns_keys_and_a_never_logged_key_is_an_error():
    _, history, _ = ciclo.loop(
        create_state(), train_dataset[:4], {ciclo.every(1): train_step}
    )
    steps, loss, accuracy = history.collect("steps", "loss", "accuracy")
    assert steps == [0, 1, 2, 3] and len(loss) == len(accuracy) == 4
    # a deliberate difference (docs/differences.md): Ciclo 0.1 gave empty lists
    with pytest.raises(KeyError, match="never_logged"):
        history.collect("never_logged")
    with pytest.raises(KeyError, match="Did you mean 'accuracy'"):
        history.collect("steps", "acuracy")


def test_time_comparisons_and_period_create():
    elapsed = ciclo.Elapsed.create(steps=10, samples=320)
    period = ciclo.Period.create(steps=10)
    assert period == ciclo.at(10)
    assert elapsed >= period and elapsed <= period and elapsed == period
    assert not (elapsed > period) and (elapsed != period) is False
    assert elapsed > ciclo.Period.create(steps=5) and elapsed != ciclo.at(5)
    # ANY given field: samples reached, steps not
    assert elapsed >= ciclo.Period.create(steps=100, samples=320)
    assert elapsed <= ciclo.Period.create(steps=100, samples=0)
    assert ciclo.Period.create(time=datetime.timedelta(minutes=1)).time == 60
    later = elapsed.update(batch_size=32).update(batch_size=32)
    assert ((later - elapsed).steps, (later - elapsed).samples) == (2, 64)


def test_default_batch_size_is_the_largest_first_axis():
    batch = {"x": np.zeros((8, 3)), "mask": np.zeros((1,)), "y": np.zeros((8,))}
    _, _, elapsed = ciclo.loop(None, [batch, (np.zeros((4, 2)), 7)], {})
    assert (elapsed.steps, elapsed.samples) == (2, 12)
    _, _, elapsed = ciclo.loop(None, [1, 2, 3], {})
    assert elapsed.samples == 3  # leaves without a shape count as 1


def test_inject():
    def f(state, batch):
        return state + batch

    assert ciclo.inject(f, 1, 2, ciclo.Elapsed.create(), None) == 3


def test_callbacks_inner_loop():
    eval_loop = ciclo.callbacks.inner_loop(
        "test",
        lambda state: ciclo.test_loop(
            state, get_test_dataset(), {ciclo.on_test_step: test_step}
        ),
    )
    _, history, _ = ciclo.loop(
        create_state(),
        train_dataset[:4],
        {ciclo.every(1): [train_step], ciclo.every(2): [eval_loop]},
    )
    steps, accuracy_test = history.collect("steps", "accuracy_test")
    assert steps == [0, 2] and len(accuracy_test) == 2


def test_after_then_and_shift_elapsed_to_dict_and_positional_period_create():
    # Ciclo 0.1.9 spellings: `after(n).then(s)` / `after(n) >> s` (a piece from
    # n on, counting from n), `Elapsed.to_dict()`, `Period.create(steps, samples)`
    def fired(schedule, n=14):
        return [s for s in range(n) if schedule(ciclo.Elapsed.create(steps=s))]

    assert fired(ciclo.after(5).then(ciclo.every(3))) == [5, 8, 11]
    assert fired(ciclo.after(5) >> ciclo.every(3)) == [5, 8, 11]
    assert fired(ciclo.after(2) >> (lambda e: e.steps == 1)) == [3]
    e = ciclo.Elapsed.create(steps=3, samples=96)
    d = e.to_dict()
    assert d == {
        "steps": 3,
        "samples": 96,
        "date": e.date,
        "date_start": e.date_start,
        "time": e.time,
    }
    assert ciclo.Period.create(None, 100) == ciclo.at(samples=100)
    assert ciclo.Period.create(2, None, 1.5) == ciclo.at(2, time=1.5)
