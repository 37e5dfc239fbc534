"""The bars' epoch summary in plain mode (output not a terminal, or plain=True):
one line per epoch end with every train and test scalar of that step, exact, and
the epoch's seconds per step, printed without waiting on the device."""

from __future__ import annotations

import io
import re
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import ciclo


class FakeClock:
    """`time.time` and `time.monotonic`, moved on only by `tick`."""

    def __init__(self, monkeypatch):
        self.now = 1_000_000.0
        monkeypatch.setattr(time, "time", lambda: self.now)
        monkeypatch.setattr(time, "monotonic", lambda: self.now)

    def tick(self, state, batch):  # a loop callback: `seconds` per step
        self.now += self.seconds

    seconds = 1.0


def host_step(state, batch):
    logs = ciclo.logs().add_loss("loss", 1.0 / (state + 1.0))
    return logs.add_metric("acc", state / 10.0), state + 1


def test_step(state, batch):
    return ciclo.logs().add_loss("loss", 2.0 * batch).add_metric("acc", 0.5)


test_step.__test__ = False  # not a pytest test


def train(bar, clock, n=9, **kwargs):
    return ciclo.train_loop(
        0, range(n),
        {ciclo.on_train_step: [host_step, clock.tick], ciclo.on_test_step: test_step},
        callbacks=[bar], test_dataset=lambda: [1.0, 2.0], epoch_duration=3, **kwargs,
    )  # fmt: skip


def test_keras_bar_prints_a_keras_epoch_line_per_epoch(capsys, monkeypatch):
    clock = FakeClock(monkeypatch)
    clock.seconds = 0.025
    train(ciclo.keras_bar(total=9), clock)
    lines = capsys.readouterr().out.splitlines()
    # train entries first, then the test ones (weighted means of 2.0 and 4.0);
    # one line per epoch and none more at the end (the last epoch's is the final)
    assert lines == [
        "3/9 - 0s - 25ms/step - loss: 0.3333 - acc: 0.2000 - loss_test: 3.0000"
        " - acc_test: 0.5000",
        "6/9 - 0s - 25ms/step - loss: 0.1667 - acc: 0.5000 - loss_test: 3.0000"
        " - acc_test: 0.5000",
        "9/9 - 0s - 25ms/step - loss: 0.1111 - acc: 0.8000 - loss_test: 3.0000"
        " - acc_test: 0.5000",
    ]


def test_tqdm_bar_summary_has_the_epochs_rate_and_test_values(monkeypatch):
    clock = FakeClock(monkeypatch)
    clock.seconds = 2.0
    out = io.StringIO()
    train(ciclo.tqdm_bar(total=9, file=out, desc="train"), clock, n=8)
    lines = out.getvalue().splitlines()
    # epochs end at 3 and 6; the run ends at 8, mid-epoch... which the data
    # ending makes an epoch end too: three summaries, no separate final line
    assert [line.split(" ")[1] for line in lines] == ["3/9", "6/9", "8/9"]
    assert lines[0] == (
        "train: 3/9 [00:06<00:12,  2.00s/step, loss=0.333, acc=0.2, loss_test=3, "
        "acc_test=0.5]"
    )
    assert "loss_test=3" in lines[2] and lines[2].startswith("train: 8/9 [00:16<")


def test_a_run_cut_mid_epoch_ends_with_its_final_line(capsys, monkeypatch):
    clock = FakeClock(monkeypatch)
    train(ciclo.keras_bar(total=9), clock, n=9, stop=8)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" ")[0] for line in lines] == ["3/9", "6/9", "8/9"], lines
    assert "s/step" in lines[0] and "s/step" in lines[1]
    assert "loss_test" in lines[1]


def test_keras_verbose_2_is_one_line_per_epoch_also_on_a_terminal(monkeypatch):
    class TTY(io.StringIO):
        def isatty(self):
            return True

    stream = TTY()
    monkeypatch.setattr(sys, "stdout", stream)
    clock = FakeClock(monkeypatch)
    train(ciclo.keras_bar(total=9, verbose=2), clock)
    lines = stream.getvalue().splitlines()
    assert [line.split(" ")[0] for line in lines] == ["3/9", "6/9", "9/9"]
    assert all(" - 1s/step - " in line for line in lines)
    # verbose=1 on a terminal: one bar, redrawn; no summaries
    stream.seek(0), stream.truncate()
    train(ciclo.keras_bar(total=9, interval=0.0), clock)
    assert stream.getvalue().count("\n") == 1 and "\r" in stream.getvalue()
    # plain=True asks for them on a terminal
    stream.seek(0), stream.truncate()
    train(ciclo.keras_bar(total=9, plain=True), clock)
    assert stream.getvalue().count("/step") == 3


def test_summary_shows_epoch_logs_and_only_scalars(capsys, monkeypatch):
    clock = FakeClock(monkeypatch)

    def with_vector(state, batch):
        return ciclo.logs().add_metric("vec", np.ones(3))

    ciclo.train_loop(
        0, range(4),
        {ciclo.on_train_step: [host_step, with_vector, clock.tick]},
        callbacks=[ciclo.keras_bar()], epoch_duration=2, epoch_logs=True,
    )  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        "2/Unknown - 2s - 1s/step - loss: 0.5000 - acc: 0.1000 - loss_epoch: 0.7500"
        " - acc_epoch: 0.0500"
    )
    assert len(lines) == 2 and "vec" not in lines[1]


@jax.jit
def heavy_step(state, batch):
    # tens of ms of device work per step: the device falls behind the host
    def body(_, m):
        return jnp.tanh(m @ m / m.shape[0])

    m = jax.lax.fori_loop(0, 16, body, jnp.full((192, 192), state) + batch)
    return ciclo.logs().add_loss("loss", m.mean()), state + 1.0


def test_summaries_wait_for_nothing_and_show_the_epoch_ends_exact_values(capsys):
    heavy_step(jnp.float32(0), np.float32(0))  # compile outside the loop
    seen_ready = []

    def spy(state, batch, elapsed, loop_state):  # runs right after the bar
        seen_ready.append(loop_state.logs.losses.loss.is_ready())

    bar = ciclo.keras_bar(total=12, plain=True)
    with jax.transfer_guard_device_to_host("disallow"):  # no implicit float(x)
        _, history, _ = ciclo.train_loop(
            jnp.float32(0), [np.float32(0)] * 12,
            {ciclo.on_train_step: heavy_step, ciclo.on_train_batch_end: spy},
            callbacks=[bar], epoch_duration=4,
        )  # fmt: skip
    assert not all(seen_ready), seen_ready
    lines = capsys.readouterr().out.splitlines()
    steps, losses = history.collect("steps", "loss")
    at_ends = [losses[steps.index(s)] for s in (3, 7, 11)]
    shown = [float(re.search(r"loss: (\S+)", line).group(1)) for line in lines]
    assert [line.split(" ")[0] for line in lines] == ["4/12", "8/12", "12/12"]
    np.testing.assert_allclose(shown, at_ends, rtol=1e-3)


def test_no_summary_after_the_bar_reached_its_total(capsys, monkeypatch):
    clock = FakeClock(monkeypatch)
    train(ciclo.keras_bar(total=4), clock, n=9)  # epochs end at 3, 6, 9
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" ")[0] for line in lines] == ["3/4", "4/4"]
    assert "/step" in lines[0] and "/step" not in lines[1]


def test_lines_stay_in_order_while_a_summary_waits_for_the_device(capsys):
    heavy_step(jnp.float32(0), np.float32(0))  # compile outside the loop
    bar = ciclo.keras_bar(total=24, plain=True, plain_interval=0.0)  # every step
    ciclo.train_loop(
        jnp.float32(0), [np.float32(0)] * 24, {ciclo.on_train_step: heavy_step},
        callbacks=[bar], epoch_duration=8,
    )  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    done = [int(line.split("/")[0]) for line in lines]
    assert done == sorted(done), lines  # progress lines never overtake a summary
    summaries = [line for line in lines if "/step" in line]
    assert [line.split(" ")[0] for line in summaries] == ["8/24", "16/24", "24/24"]
