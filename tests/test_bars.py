"""Progress bars: keras_bar (pkbar) and tqdm_bar."""

import io
import os
import pathlib
import re
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _gate import Gate
from _guard import disallow_device_to_host

import ciclo


@jax.jit
def train_step(state, batch):
    logs = ciclo.logs()
    logs.add_loss("loss", 1.0 / (state + 1.0), add_metric=True)  # in both
    logs.add_metric("acc", state / 10.0)
    return logs, state + 1.0


def batches(n, size=1):
    return [np.zeros((size,), np.float32) for _ in range(n)]


class FakeTTY(io.StringIO):
    """A stream that says it is a terminal: the bars redraw in place on it."""

    def isatty(self):
        return True

    def take(self):
        text = self.getvalue()
        self.seek(0)
        self.truncate()
        return text


def as_tty(monkeypatch):
    """sys.stdout (where pkbar writes) as a terminal (set in the test itself: pytest
    installs its own capture after the fixtures)."""
    stream = FakeTTY()
    monkeypatch.setattr(sys, "stdout", stream)
    return stream


class FakeClock:
    """`time.time` and `time.monotonic`, moved on only by `tick`."""

    def __init__(self, monkeypatch):
        self.now = 1_000_000.0
        monkeypatch.setattr(time, "time", lambda: self.now)
        monkeypatch.setattr(time, "monotonic", lambda: self.now)

    def tick(self, state, batch):  # a loop callback: one second per step
        self.now += 1.0


def host_step(state, batch):
    """Python floats: always computed, so every line's values are exact."""
    logs = ciclo.logs()
    logs.add_loss("loss", 1.0 / (state + 1.0))
    logs.add_metric("acc", state / 10.0)
    return logs, state + 1


def last_line(text):
    """The last line drawn (pkbar redraws in place with \\b and \\r)."""
    return text.replace("\b", "").split("\r")[-1]


def keras_run(tty, bar, n=10, size=1, **loop_kwargs):
    _, _, elapsed = ciclo.loop(
        jnp.float32(0),
        batches(n, size),
        {ciclo.every(1): [train_step, bar]},
        **loop_kwargs,
    )
    return tty.take(), elapsed


# -- keras_bar ---------------------------------------------------------------------


def test_keras_bar_shows_final_losses_and_metrics_once_and_closes(monkeypatch):
    tty = as_tty(monkeypatch)
    bar = ciclo.keras_bar(total=10)
    out, _ = keras_run(tty, bar)
    line = last_line(out)
    assert line.startswith("10/10 [==============================]")
    # "loss" is a loss and a metric: shown once; values are those of the last step
    assert line.count("loss:") == 1
    assert "loss: 0.1000" in line and "acc: 0.9000" in line
    assert out.endswith("\n") and bar.closed


def test_keras_bar_spreads_and_self_registers_in_train_loop(monkeypatch):
    tty = as_tty(monkeypatch)
    bar = ciclo.keras_bar(total=6)
    spread = {**bar}
    assert list(spread.values()) == [[bar]] and spread.keys()
    assert bar.on_train_batch_end is bar
    ciclo.train_loop(
        jnp.float32(0),
        batches(6),
        {ciclo.on_train_step: train_step},
        callbacks=[bar],
        stop=6,
    )
    line = last_line(tty.take())
    assert line.startswith("6/6 [") and "acc: 0.5000" in line and bar.closed


def test_keras_bar_throttles_redraws(monkeypatch):
    tty = as_tty(monkeypatch)
    out, _ = keras_run(tty, ciclo.keras_bar(total=10, interval=60.0))
    # the first step and the final line; nothing in between
    assert out.count("/10 [") == 2
    out, _ = keras_run(tty, ciclo.keras_bar(total=10, interval=0.0))
    assert out.count("/10 [") == 10


def test_keras_bar_total_in_samples_and_eta(monkeypatch):
    tty = as_tty(monkeypatch)
    bar = ciclo.keras_bar(total=ciclo.at(samples=40), interval=0.0)
    out, elapsed = keras_run(tty, bar, n=10, size=4)
    assert elapsed.samples == 40
    assert "4/40 [" in out and "ETA:" in out  # counts samples; ETA while running
    assert last_line(out).startswith("40/40 [")


def test_keras_bar_total_in_time_counts_seconds(monkeypatch):
    tty = as_tty(monkeypatch)
    now = time.time()
    # 30 s into a run of 60 s (by hand; a manual call counts the batch just done)
    elapsed = ciclo.Elapsed(steps=5, samples=5, date=now, date_start=now - 30.0)
    bar = ciclo.keras_bar(total=ciclo.at(time=60), interval=0.0)
    bar(elapsed, {"losses": {"loss": 1.5}})
    line = last_line(tty.take())
    # no rate measured yet: no ETA (pkbar alone would say "ETA: 0s")
    assert line.startswith("30/60 [") and "ETA" not in line and "loss: 1.5000" in line
    # once the bar has timed some progress, there is an ETA (over 0.2 s: a
    # loaded machine's ms between a call's clock reads move it less than 1 s)
    time.sleep(0.2)
    bar(elapsed, {"losses": {"loss": 1.25}})
    line = last_line(tty.take())
    assert re.search(r"ETA: (29|30)s", line) and "loss: 1.2500" in line
    bar.close()
    assert bar.closed and tty.take().endswith("\n")


def test_keras_bar_period_with_several_fields_follows_the_nearest(monkeypatch):
    tty = as_tty(monkeypatch)
    # samples (40) are reached long before steps (1000): the bar follows samples
    bar = ciclo.keras_bar(total=ciclo.at(steps=1000, samples=40), interval=0.0)
    out, _ = keras_run(tty, bar, n=10, size=4, stop=ciclo.at(samples=40))
    assert last_line(out).startswith("40/40 [")


def test_keras_bar_resumed_run_counts_from_restored_elapsed(monkeypatch):
    tty = as_tty(monkeypatch)
    bar = ciclo.keras_bar(total=10, interval=0.0)
    out, elapsed = keras_run(
        tty, bar, n=4, elapsed=ciclo.Elapsed.create(steps=6, samples=6)
    )
    assert elapsed.steps == 10
    assert " 7/10 [" in out and last_line(out).startswith("10/10 [")


def test_keras_bar_closes_cleanly_on_ctrl_c(monkeypatch):
    tty = as_tty(monkeypatch)

    def interrupt(state, batch, elapsed):
        if elapsed.steps == 3:
            raise KeyboardInterrupt

    bar = ciclo.keras_bar(total=10, interval=0.0)
    _, _, elapsed = ciclo.loop(
        jnp.float32(0), batches(10), {ciclo.every(1): [train_step, bar, interrupt]}
    )
    out = tty.take()
    assert bar.closed and out.endswith("\n")  # the line is ended, not left open
    line = last_line(out)
    assert line.startswith(" 4/10 [") and "acc: 0.3000" in line
    assert elapsed.steps == 4


def test_keras_bar_by_hand_finishes_at_total_or_on_close(monkeypatch):
    tty = as_tty(monkeypatch)
    bar = ciclo.keras_bar(total=5, interval=0.0)
    for elapsed, _batch in ciclo.elapse(batches(5)):
        logs = ciclo.logs()
        logs.add_metric("acc", elapsed.steps / 10)
        bar(elapsed, logs)
    out = tty.take()
    assert bar.closed and last_line(out).startswith("5/5 [") and "acc: 0.4000" in out
    early = ciclo.keras_bar(total=5)
    early(ciclo.Elapsed.create(), {"losses": {"loss": 2.0}})
    assert not early.closed
    early.close()
    out = tty.take()
    assert early.closed and out.endswith("\n") and "loss: 2.0000" in last_line(out)


def test_keras_bar_verbose_2_and_short_time_totals(monkeypatch):
    tty = as_tty(monkeypatch)
    # verbose=2 prints its one line also when the loop ends before the total
    out, _ = keras_run(tty, ciclo.keras_bar(total=10, verbose=2), n=5)
    assert out.startswith("5/10 - ") and "acc: 0.4000" in out
    assert out.count("\n") == 1 and out.endswith("\n")
    # a time total under 10 s counts milliseconds (by hand: 0.15 s into 0.3 s)
    now = time.time()
    elapsed = ciclo.Elapsed(steps=1, samples=1, date=now, date_start=now - 0.15)
    bar = ciclo.keras_bar(total=ciclo.at(time=0.3))
    bar(elapsed, {"losses": {"loss": 1.5}})
    bar.close()
    line = last_line(tty.take())
    assert re.match(r"15\d/300 \[", line), line


def test_bars_in_test_and_predict_loops_but_not_in_a_nested_test_loop(monkeypatch):
    tty = as_tty(monkeypatch)
    bar = ciclo.keras_bar(total=3, interval=0.0)
    ciclo.test_loop(
        jnp.float32(0), batches(3), {ciclo.on_test_step: train_step}, callbacks=[bar]
    )
    assert last_line(tty.take()).startswith("3/3 [") and bar.closed
    out = io.StringIO()
    bar = ciclo.tqdm_bar(file=out, interval=0.0)
    ciclo.predict_loop(
        jnp.float32(0), batches(4), {ciclo.on_predict_step: train_step}, callbacks=[bar]
    )
    # not a terminal: a plain final line, as tqdm words an unknown total
    assert out.getvalue().startswith("4step [") and out.getvalue().count("\n") == 1
    assert bar.closed
    # given to train_loop, a bar follows training only: the test loops neither
    # move nor close it
    out = io.StringIO()
    bar = ciclo.tqdm_bar(total=6, file=out, interval=0.0)
    ciclo.train_loop(
        jnp.float32(0),
        batches(6),
        {ciclo.on_train_step: train_step, ciclo.on_test_step: train_step},
        callbacks=[bar],
        test_dataset=lambda: batches(5),
        epoch_duration=2,
    )
    text = out.getvalue()
    # not a terminal: one plain line per epoch end (steps 2 and 4) and the final
    # one, with the epoch's test results; the test loops (5 batches) show nowhere
    lines = text.splitlines()
    assert [line.split(" ")[0] for line in lines] == ["2/6", "4/6", "6/6"], text
    assert all("loss_test=" in line for line in lines)
    assert "\r" not in text and "\b" not in text


@pytest.mark.parametrize("make", [ciclo.keras_bar, ciclo.tqdm_bar])
def test_bar_reads_values_lagged_without_syncing_each_step(make, monkeypatch):
    # one step is held on the device (a host callback) until the loop is 8 steps
    # further: a bar that waited for a step's loss would never get there (the gate
    # gives up after its timeout and the test fails); holds on any backend
    tty = as_tty(monkeypatch)
    steps = 24
    with Gate(hold=2, ahead=8) as gate:

        @jax.jit
        def gated_step(state, batch):
            logs = ciclo.logs()
            logs.add_loss("loss", (state + 1.0) / 100.0 + gate.value(batch))
            return logs, state + 1.0

        # redraws every step on a terminal (pkbar writes to sys.stdout)
        file = {"file": tty} if make is ciclo.tqdm_bar else {}
        bar = make(total=steps, interval=0.0, **file)
        with disallow_device_to_host():  # no implicit float(x)
            ciclo.loop(
                jnp.float32(0),
                [np.float32(i) for i in range(steps)],
                {ciclo.every(1): [gate.delay, gated_step, bar, gate.tick]},
            )
    gate.check()
    # while running, pending values are simply not shown yet; the final line
    # (a single sync at the end) has the last step's loss
    assert "0.24" in last_line(tty.take()), "the final loss (24 / 100) is shown"


def test_bar_arguments_are_validated():
    with pytest.raises(TypeError, match="total"):
        ciclo.keras_bar(total="100")
    with pytest.raises(ValueError, match="positive"):
        ciclo.keras_bar(total=0)
    with pytest.raises(ValueError, match="interval"):
        ciclo.tqdm_bar(interval=-1)
    with pytest.raises(TypeError, match="initial"):
        ciclo.tqdm_bar(total=10, initial=3)


# -- tqdm_bar ----------------------------------------------------------------------


def test_tqdm_bar_postfix_total_and_close():
    out = io.StringIO()
    bar = ciclo.tqdm_bar(total=ciclo.at(samples=40), file=out, interval=0.0)
    ciclo.loop(jnp.float32(0), batches(10, size=4), {ciclo.every(1): train_step, **bar})
    text = out.getvalue()
    assert "\r" not in text and text.count("\n") == 1  # not a terminal: one line
    final = text
    assert "40/40" in final and "sample" in final
    assert "loss=0.1" in final and final.count("loss=") == 1 and "acc=0.9" in final
    assert bar.closed and text.endswith("\n")


def test_tqdm_bar_self_registers_and_closes_on_ctrl_c():
    out = io.StringIO()
    bar = ciclo.tqdm_bar(total=10, file=out, interval=0.0)
    assert bar.on_train_batch_end is bar

    def interrupt(state, batch, elapsed):
        if elapsed.steps == 2:
            raise KeyboardInterrupt

    ciclo.train_loop(
        jnp.float32(0),
        batches(10),
        {ciclo.on_train_step: [train_step, interrupt]},
        callbacks=[bar],
        stop=10,
    )
    text = out.getvalue()
    assert bar.closed and text.endswith("\n") and "\r" not in text
    assert text.startswith("3/10 [")


def test_tqdm_bar_redraws_in_place_on_a_terminal():
    out = FakeTTY()
    bar = ciclo.tqdm_bar(total=10, file=out, interval=0.0)
    ciclo.loop(jnp.float32(0), batches(10), {ciclo.every(1): train_step, **bar})
    text = out.getvalue()
    assert text.count("\r") >= 10 and text.count("\n") == 1  # one bar, redrawn
    assert "10/10" in text.split("\r")[-1] and bar.closed


# -- not a terminal: plain lines ---------------------------------------------------


def test_keras_bar_not_a_terminal_prints_a_plain_line_per_interval(capsys, monkeypatch):
    clock = FakeClock(monkeypatch)
    bar = ciclo.keras_bar(total=10, plain_interval=3)
    ciclo.loop(0, range(10), {ciclo.every(1): [host_step, clock.tick, bar]})
    out = capsys.readouterr().out
    # the first line one interval after the first step, then every 3 s, and the
    # final one; no redraws
    assert out.splitlines() == [
        "4/10 - 4s - ETA: 6s - loss: 0.2500 - acc: 0.3000",
        "7/10 - 7s - ETA: 3s - loss: 0.1429 - acc: 0.6000",
        "10/10 - 10s - loss: 0.1000 - acc: 0.9000",
    ]
    assert bar.closed


def test_tqdm_bar_not_a_terminal_prints_a_plain_line_per_interval(monkeypatch):
    clock = FakeClock(monkeypatch)
    out = io.StringIO()
    bar = ciclo.tqdm_bar(total=10, file=out, plain_interval=3, desc="train")
    ciclo.loop(0, range(10), {ciclo.every(1): [host_step, clock.tick, bar]})
    assert out.getvalue().splitlines() == [
        "train: 4/10 [00:04<00:06,  1.00step/s, loss=0.25, acc=0.3]",
        "train: 7/10 [00:07<00:03,  1.00step/s, loss=0.143, acc=0.6]",
        "train: 10/10 [00:10<00:00,  1.00step/s, loss=0.1, acc=0.9]",
    ]
    assert bar.closed


@pytest.mark.parametrize("kind", ["keras", "tqdm"])
def test_bars_not_a_terminal_print_a_plain_line_per_epoch(capsys, kind):
    out = io.StringIO()
    bar = (
        ciclo.keras_bar(total=9)
        if kind == "keras"
        else ciclo.tqdm_bar(total=9, file=out)
    )
    ciclo.train_loop(
        0,
        range(9),
        {ciclo.on_train_step: host_step},
        callbacks=[bar],
        epoch_duration=3,
    )
    text = capsys.readouterr().out if kind == "keras" else out.getvalue()
    assert "\r" not in text and "\b" not in text
    lines = text.splitlines()
    assert [line.split(" ")[0] for line in lines] == ["3/9", "6/9", "9/9"], text
    if kind == "keras":
        assert lines[0].endswith("loss: 0.3333 - acc: 0.2000")
        assert lines[2].endswith("loss: 0.1111 - acc: 0.8000")
    else:
        assert lines[0].endswith("loss=0.333, acc=0.2]")
        assert lines[2].endswith("loss=0.111, acc=0.8]")


def test_bars_plain_mode_can_be_forced_either_way(monkeypatch):
    out = FakeTTY()  # a terminal, but plain lines asked for
    bar = ciclo.tqdm_bar(total=4, file=out, plain=True)
    ciclo.loop(0, range(4), {ciclo.every(1): [host_step, bar]})
    assert "\r" not in out.getvalue() and out.getvalue().startswith("4/4 [")
    out = io.StringIO()  # not a terminal, but redrawn in place
    bar = ciclo.tqdm_bar(total=4, file=out, plain=False, interval=0.0)
    ciclo.loop(0, range(4), {ciclo.every(1): [host_step, bar]})
    assert out.getvalue().count("\r") >= 4
    with pytest.raises(ValueError, match="plain_interval"):
        ciclo.keras_bar(plain_interval=-1)
    with pytest.raises(TypeError, match="plain"):
        ciclo.tqdm_bar(plain="yes")


# -- what is true now: no ETA without a rate, the last step's values -------------


def test_keras_bar_shows_no_eta_before_it_has_a_rate(monkeypatch):
    tty = as_tty(monkeypatch)
    clock = FakeClock(monkeypatch)
    bar = ciclo.keras_bar(total=10, interval=0.0)
    ciclo.loop(
        jnp.float32(0), batches(10), {ciclo.every(1): [train_step, clock.tick, bar]}
    )
    out = tty.getvalue()
    assert "\r" in out  # a terminal: redrawn in place
    frames = [frame for frame in out.replace("\b", "").split("\r") if frame]
    # the first frame has no rate yet: no ETA at all (pkbar alone: "ETA: 0s")
    assert frames[0].startswith(" 1/10 [") and "ETA" not in frames[0], frames[0]
    # from the second on the rate is measured (1 s per step)
    assert frames[1].startswith(" 2/10 [") and "ETA: 8s" in frames[1], frames[1]
    assert "ETA: 0s" not in out


def test_keras_bar_after_ctrl_c_shows_the_last_steps_values(capsys, monkeypatch):
    def interrupt(state, batch, elapsed):
        if elapsed.steps == 3:  # after the 4th batch's step, before the bar
            raise KeyboardInterrupt

    # not a terminal
    bar = ciclo.keras_bar(total=10)
    _, history, elapsed = ciclo.loop(
        0, range(10), {ciclo.every(1): [host_step, interrupt, bar]}
    )
    out = capsys.readouterr().out
    assert elapsed.steps == 4 and history.collect("acc")[-1] == 0.3
    assert out.splitlines()[-1].startswith("4/10 - ")
    assert out.splitlines()[-1].endswith("loss: 0.2500 - acc: 0.3000") and bar.closed
    # a terminal, device values
    tty = as_tty(monkeypatch)
    bar = ciclo.keras_bar(total=10, interval=0.0)
    ciclo.loop(
        jnp.float32(0), batches(10), {ciclo.every(1): [train_step, interrupt, bar]}
    )
    out = tty.getvalue()
    line = last_line(out)
    assert line.startswith(" 4/10 [") and out.endswith("\n") and bar.closed
    assert "loss: 0.2500" in line and "acc: 0.3000" in line


def test_tqdm_bar_after_ctrl_c_shows_the_last_steps_values():
    def interrupt(state, batch, elapsed):
        if elapsed.steps == 3:
            raise KeyboardInterrupt

    out = io.StringIO()
    bar = ciclo.tqdm_bar(total=10, file=out)
    ciclo.train_loop(
        0,
        range(10),
        {ciclo.on_train_step: [host_step, interrupt]},
        callbacks=[bar],
    )
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("4/10 [")
    assert lines[0].endswith("loss=0.25, acc=0.3]") and bar.closed


# setuptools >= 81 warns when pkg_resources is imported (pkbar's __init__ does, to
# read its own version) and the newest setuptools (84) no longer ships it: fakes
# for both, ahead of whatever setuptools this environment has
FAKE_PKG_RESOURCES = {
    "warns": """
import warnings
warnings.warn("pkg_resources is deprecated as an API.", UserWarning, stacklevel=2)
class DistributionNotFound(Exception):
    pass
def get_distribution(name):
    raise DistributionNotFound(name)
""",
    "missing": """
raise ModuleNotFoundError("No module named 'pkg_resources'", name="pkg_resources")
""",
}

TRAIN_WITH_THE_KERAS_BAR = """
import sys
import jax.numpy as jnp
import ciclo

def step(state, batch):
    return ciclo.logs().add_loss("loss", jnp.mean(batch)), state + 1

state, history, _ = ciclo.loop(
    0, [jnp.ones(2)] * 3, {ciclo.every(1): [step], **ciclo.keras_bar(total=3)}
)
assert state == 3 and "pkg_resources" not in sys.modules, sorted(sys.modules)
print("trained")
"""


@pytest.mark.parametrize("setuptools", ["warns", "missing"])
def test_keras_bar_works_whatever_setuptools_ships(tmp_path, setuptools):
    (tmp_path / "pkg_resources.py").write_text(FAKE_PKG_RESOURCES[setuptools])
    root = pathlib.Path(__file__).resolve().parents[1]
    path = os.pathsep.join(
        filter(None, [str(tmp_path), str(root), os.environ.get("PYTHONPATH")])
    )
    env = {**os.environ, "PYTHONPATH": path, "JAX_PLATFORMS": "cpu"}

    def python(*args):
        return subprocess.run(
            [sys.executable, "-W", "error", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )

    control = python("-c", "import pkg_resources")  # the fake is what is found
    assert control.returncode != 0 and "pkg_resources" in control.stderr
    result = python("-c", TRAIN_WITH_THE_KERAS_BAR)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (
        "3/3 - " in result.stdout and "loss: 1.0000" in result.stdout
    )  # plain: a pipe
    assert result.stdout.strip().endswith("trained")


@pytest.mark.parametrize("by_hand", [False, True])
def test_bar_shows_names_in_the_order_first_logged(by_hand, monkeypatch):
    # names that first appear between two redraws (never in a drawn step's logs)
    # still take their place: first logged first; in one step, losses before
    # metrics (a loss named in both is shown once, where it first came)
    tty = as_tty(monkeypatch)

    def step(state, batch):
        i, logs = int(state), ciclo.logs()
        logs.add_loss("loss", 1.0 + i)
        if i == 3:
            logs.add_metric("b", 3.0)
        if i == 5:
            logs.add_metric("a", 5.0)
        if i == 7:
            logs.add_metric("m", 7.0).add_loss("l", 7.5)
        return logs, state + 1

    bar = ciclo.keras_bar(total=10, interval=1000.0)  # draws at the first step only
    if by_hand:
        state = 0
        for elapsed, batch in ciclo.elapse(batches(10)):
            logs, state = step(state, batch)
            bar(elapsed, logs)
    else:
        ciclo.loop(0, batches(10), {ciclo.every(1): [step, bar]})
    line = last_line(tty.take())
    assert line.startswith("10/10"), line
    names = re.findall(r" - (\w+): ", line)
    assert names == ["loss", "b", "a", "l", "m"], line
    assert "b: 3.0000" in line and "a: 5.0000" in line and "loss: 10.0000" in line
