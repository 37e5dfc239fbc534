"""The input stage (API.md §9): the placed batch travels with its batch, so a
loader that refills one buffer for every batch (pooled loaders do) trains on the
right data — read ahead (`prefetch=1`), fused (`steps_per_call`), and both."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ciclo
from ciclo import managed

N = 8


class RefillingLoader:
    """Hands out the same two arrays every time, refilled with batch i's values
    (x == i everywhere, y == i % 4)."""

    def __init__(self, n=N):
        self.n = n
        self.x = np.zeros((4, 3), np.float32)
        self.y = np.zeros((4,), np.int32)

    def __iter__(self):
        for i in range(self.n):
            self.x[...] = i
            self.y[...] = i % 4
            yield self.x, self.y


def seen(state, batch):
    x, y = batch
    loss = jnp.mean((x @ state.params["w"]) ** 2) * 0.0
    logs = ciclo.logs().add_loss("loss", loss)
    return logs.add_metrics(x_seen=x[0, 0], y_seen=y[0].astype(jnp.float32)), state


HOST: list[float] = []


def host_seen(state, batch):
    """A plain (unmanaged) callback beside the step: the host batch it gets (a
    fused call's `ciclo.Steps` holds its batches stacked)."""
    if isinstance(batch, ciclo.Steps):
        HOST.extend(np.asarray(batch.batch[0])[:, 0, 0].tolist())
    else:
        HOST.append(float(np.asarray(batch[0])[0, 0]))


def create():
    params = {"w": np.ones((3, 1), np.float32)}
    return managed.ManagedState.create(params=params, tx=optax.sgd(0.1))


@pytest.mark.parametrize("loop", ["loop", "train_loop"])
@pytest.mark.parametrize("prefetch, steps_per_call", [(1, 1), (0, 4), (1, 4), (2, 3)])
def test_a_loader_refilling_one_buffer_trains_on_the_right_data(
    loop, prefetch, steps_per_call
):
    step = managed.train_step(seen, steps_per_call=steps_per_call)
    HOST.clear()
    kwargs = dict(prefetch=prefetch, steps_per_call=steps_per_call)
    if loop == "loop":
        tasks = {ciclo.every(1): [step, host_seen]}
        _, history, elapsed = ciclo.loop(create(), RefillingLoader(), tasks, **kwargs)
    else:
        tasks = {ciclo.on_train_step: [step, host_seen]}
        _, history, elapsed = ciclo.train_loop(
            create(), RefillingLoader(), tasks, **kwargs
        )
    assert elapsed.steps == N
    steps, x_seen, y_seen = history.collect("steps", "x_seen", "y_seen")
    assert steps == list(range(N))
    assert x_seen == [float(i) for i in range(N)]  # not [3, 3, 3, 3, 7, ...]
    assert y_seen == [float(i % 4) for i in range(N)]
    # a plain callback beside it gets the dataset's values, not the next refill's
    assert [float(i) for i in range(N)] == HOST


# --- one input stage: what is read, when, and what counts (API.md §3, §5, §9, §11)


class Pulls:
    """A re-iterable dataset of `n` batches per pass (batch i of a pass holds
    x == i): counts the batches pulled from it in all, and raises
    once more than `allowed` were pulled (None: no bound). With
    `checkpointable`, a single pass has Grain's `get_state()` / `set_state()`."""

    def __init__(self, n, allowed=None, checkpointable=False):
        self.n, self.allowed, self.pulled = n, allowed, 0
        self.checkpointable = checkpointable
        self.index = 0

    def __iter__(self):
        outer = self
        self.index = 0

        class Pass:
            def __iter__(self):
                return self

            def __next__(self):
                if outer.index >= outer.n:
                    raise StopIteration
                if outer.allowed is not None and outer.pulled >= outer.allowed:
                    raise RuntimeError(
                        f"read past what the loop consumed: batch {outer.pulled}"
                    )
                outer.pulled += 1
                outer.index += 1
                x = np.full((4, 3), outer.index - 1, np.float32)
                return x, np.zeros((4,), np.int32)

        it = Pass()
        if self.checkpointable:
            it.get_state = lambda: {"next_index": outer.index}
            it.set_state = lambda state: setattr(outer, "index", state["next_index"])
        return it


def test_an_epoch_end_reads_the_next_batch_only_to_learn_that_the_pass_ended():
    """Unfused, nothing read ahead (`prefetch=0, steps_per_call=1`): while the
    batch of step s trains, exactly s + 1 batches were pulled. The epoch-end
    check then pulls the next batch (s + 2 pulled) to learn whether the pass
    ended, except when the batch ends the pass (the pull found its end: s + 1).
    That pulled batch is the next one trained: nothing is pulled and dropped."""
    data = Pulls(5)
    record = {}

    def step(state, batch, elapsed):
        record[elapsed.steps] = [data.pulled, float(batch[0][0, 0])]

    def batch_end(state, batch, elapsed):
        record[elapsed.steps].append(data.pulled)

    ends = []
    tasks = {
        ciclo.on_train_step: step,
        ciclo.on_epoch_end: lambda state, batch, elapsed: ends.append(elapsed.steps),
        ciclo.on_train_batch_end: batch_end,
    }
    _, _, elapsed = ciclo.train_loop(
        None, data, tasks, epochs=2, prefetch=0, steps_per_call=1
    )
    assert elapsed.steps == 10 and ends == [4, 9]
    last = {4, 9}
    assert record == {
        s: [s + 1, float(s % 5), s + 1 if s in last else s + 2] for s in range(10)
    }
    assert data.pulled == 10


def test_an_epoch_end_never_reads_past_a_stop_or_an_epoch_decided_by_its_duration():
    """With `epoch_duration=2, stop=7`: a batch whose epoch end is decided by the
    duration (steps 2, 4, 6 done) or the stop (7) reads nothing ahead; the others
    read one batch ahead, which is the next trained. The dataset raises if a
    batch is pulled beyond the 7 the loop consumes."""
    data = Pulls(100, allowed=7)
    pulled_at_end = []
    ends = []
    tasks = {
        ciclo.on_train_step: lambda: None,
        ciclo.on_epoch_end: lambda s, b, e, loop_state: ends.append(
            loop_state.elapsed_after.steps
        ),
        ciclo.on_train_batch_end: lambda: pulled_at_end.append(data.pulled),
    }
    _, _, elapsed = ciclo.train_loop(
        None, iter(data), tasks, epoch_duration=2, stop=7, prefetch=0
    )
    assert elapsed.steps == 7 and ends == [2, 4, 6, 7]
    assert pulled_at_end == [2, 2, 4, 4, 6, 6, 7]


def test_callbacks_after_the_epoch_end_check_get_their_batch_from_a_refilling_loader():
    """Learning the pass end reads the next batch during the current one: with
    a loader that refills one buffer, the callbacks running after that check
    (`on_epoch_end`, `on_train_batch_end`) still get the current batch."""
    step = managed.train_step(seen)
    HOST.clear()
    after: list[float] = []
    tasks = {
        ciclo.on_train_step: step,
        ciclo.on_epoch_end: lambda s, batch: after.append(float(batch[0][0, 0])),
        ciclo.on_train_batch_end: host_seen,
    }
    _, history, _ = ciclo.train_loop(create(), RefillingLoader(), tasks, prefetch=0)
    assert history.collect("x_seen") == [float(i) for i in range(N)]
    assert [float(i) for i in range(N)] == HOST  # not [1, 2, ..., 7, 7]
    assert after == [float(N - 1)]


@pytest.mark.parametrize("container", [list, tuple])
def test_an_epoch_end_over_a_list_reads_nothing_ahead_and_copies_no_batch(container):
    """A list (tuple) of batches says how many are left: the epoch-end check
    learns the pass end without reading the next batch, so every callback gets
    the list's own batch objects (no copy made to protect a buffer that reading
    on could refill), and the epochs end where they end."""
    batches = container(
        (np.full((2, 3), i, np.float32), np.full(2, i, np.int32)) for i in range(5)
    )
    same, ends = [], []
    tasks = {
        ciclo.on_train_step: lambda state, batch, elapsed: same.append(
            batch is batches[elapsed.steps % 5]
        ),
        ciclo.on_epoch_end: lambda state, batch, elapsed: ends.append(elapsed.steps),
        ciclo.on_train_batch_end: lambda state, batch, elapsed: same.append(
            batch is batches[elapsed.steps % 5]
        ),
    }
    _, _, elapsed = ciclo.train_loop(None, batches, tasks, epochs=2, prefetch=0)
    assert elapsed.steps == 10 and ends == [4, 9]
    assert same == [True] * 20


def test_the_data_position_excludes_the_batch_read_to_learn_the_pass_end():
    """A checkpointable iterator: the position saved with a step is after that
    step's batch, and when the loop stops, the iterator is put back after the
    last batch trained (the batch read to learn the pass end is read again by
    whoever iterates next)."""
    data = Pulls(10, checkpointable=True)
    source = iter(data)
    positions = []

    def batch_end(state, batch, elapsed, loop_state):
        positions.append(loop_state.data_state()["next_index"])
        if elapsed.steps == 5:
            loop_state.stop_after_batch()  # after the epoch-end check read ahead

    tasks = {
        ciclo.on_train_step: lambda: None,
        ciclo.on_epoch_end: lambda: None,
        ciclo.on_train_batch_end: batch_end,
    }
    _, _, elapsed = ciclo.train_loop(None, source, tasks, prefetch=0)
    assert elapsed.steps == 6 and data.pulled == 7  # batch 6 read to learn the end
    assert positions == [1, 2, 3, 4, 5, 6]
    assert source.get_state() == {"next_index": 6}
    assert float(next(source)[0][0, 0]) == 6.0


def test_a_dataset_error_while_learning_the_pass_end_surfaces_at_its_batch():
    """The dataset raises reading batch 3, which the epoch-end check of batch 2
    reads: batch 2 completes (its epoch-end and batch-end callbacks run), and
    the error surfaces when batch 3 is fetched, as without the check."""

    class Failing(Pulls):
        def __iter__(self):
            inner = super().__iter__()
            return (b if i != 3 else _raise() for i, b in enumerate(inner))

    def _raise():
        raise ValueError("corrupt record")

    notes = []
    for tasks in (
        {ciclo.on_train_step: lambda: None},
        {ciclo.on_train_step: lambda: None, ciclo.on_epoch_end: lambda: None},
    ):
        done = []
        tasks[ciclo.on_train_batch_end] = lambda s, b, e: done.append(e.steps)  # noqa: B023
        history = ciclo.history()
        with pytest.raises(ValueError, match="corrupt record") as info:
            ciclo.train_loop(None, Failing(6), tasks, history=history, prefetch=0)
        assert done == [0, 1, 2]
        notes.append(info.value.__notes__)
    assert notes[0] == notes[1]
    assert "fetching the batch of step 3" in notes[0][0]


class Checkpointable:
    """An iterator over `batches` with Grain's `get_state()` / `set_state()`,
    counting the batches read."""

    def __init__(self, batches):
        self.batches, self.index, self.read = batches, 0, 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.index >= len(self.batches):
            raise StopIteration
        self.index += 1
        self.read += 1
        return self.batches[self.index - 1]

    def get_state(self):
        return {"next_index": self.index}

    def set_state(self, state):
        self.index = state["next_index"]


@pytest.mark.parametrize(
    "prefetch, steps_per_call", [(0, 1), (1, 1), (0, 4), (1, 4), (2, 3)]
)
def test_loop_and_train_loop_read_train_and_count_the_same(prefetch, steps_per_call):
    """`ciclo.loop` and `train_loop` take their batches through one input stage:
    for each fused / read-ahead configuration, the same batches reach the step
    at the same steps, the source has been read as far at each call, `elapsed`
    is the same, and the iterator is put back after the last batch trained."""
    batches = [
        (np.full((4, 3), i, np.float32), np.full((4,), i % 4, np.int32))
        for i in range(13)
    ]
    step = managed.train_step(seen, steps_per_call=steps_per_call)
    runs = {}
    for loop in ("loop", "train_loop"):
        source = Checkpointable(batches)
        reads = []

        def spy(state, batch, elapsed, loop_state):
            position = loop_state.data_state()["next_index"]  # after this call
            reads.append((elapsed.steps, source.read, position))  # noqa: B023

        kwargs = dict(stop=10, prefetch=prefetch, steps_per_call=steps_per_call)
        if loop == "loop":
            tasks = {ciclo.every(1): [step, spy]}
            _, history, elapsed = ciclo.loop(create(), source, tasks, **kwargs)
        else:
            tasks = {ciclo.on_train_step: [step, spy]}
            _, history, elapsed = ciclo.train_loop(create(), source, tasks, **kwargs)
        runs[loop] = (
            history.collect("steps", "x_seen"),
            (elapsed.steps, elapsed.samples),
            reads,
            source.get_state(),
        )
    assert runs["loop"] == runs["train_loop"]
    (steps, x_seen), counted, reads, position = runs["loop"]
    assert steps == list(range(10)) and x_seen == [float(i) for i in range(10)]
    assert counted == (10, 40)
    assert position == {"next_index": 10}  # the read-ahead is put back
    calls = [s for s, _, _ in reads]
    assert calls == list(range(0, 10, steps_per_call))
    # read as far as the call and `prefetch` calls ahead, never past the stop
    ahead = (1 + prefetch) * steps_per_call
    assert [r for _, r, _ in reads] == [min(s + ahead, 10) for s in calls]
    # the position a checkpoint saves is after the call's batches
    assert [p for _, _, p in reads] == [min(s + steps_per_call, 10) for s in calls]


@pytest.mark.parametrize("prefetch", [0, 1])
def test_a_fused_run_resumes_exactly_from_its_data_position(tmp_path, prefetch):
    """Fused calls carry the data position after their last batch: a run
    checkpointed at an epoch end resumes a checkpointable iterator from its
    saved position (nothing read back, repeated or skipped) and trains as the
    uninterrupted run."""
    batches = [
        (np.full((4, 3), i, np.float32), np.full((4,), i % 4, np.int32))
        for i in range(12)
    ]
    step = managed.train_step(seen, steps_per_call=4)
    tasks = {ciclo.on_train_step: step}
    kwargs = dict(epoch_duration=4, prefetch=prefetch, resume=tmp_path)
    _, straight, _ = ciclo.train_loop(create(), batches, tasks, prefetch=prefetch)
    ciclo.train_loop(create(), Checkpointable(batches), tasks, stop=8, **kwargs)
    fresh = Checkpointable(batches)
    _, history, elapsed = ciclo.train_loop(create(), fresh, tasks, **kwargs)
    assert elapsed.steps == 12
    assert fresh.read == 4  # set to batch 8: no warning about reading back
    assert history.collect("steps", "x_seen") == straight.collect("steps", "x_seen")
    assert history.collect("x_seen") == [float(i) for i in range(12)]


# --- the copy made before reading on to learn a pass end (API.md §9) -----------


class Opaque:
    """A callback object that does not say whether it reads the batch."""

    def __init__(self):
        self.seen: list[float] = []

    def __loop_callback__(self, loop_state):
        self.seen.append(float(np.asarray(loop_state.batch[0])[0, 0]))


def _copies(monkeypatch):
    from ciclo._input import batch as batch_module

    made = []
    original = batch_module.host_copy

    def counting(batch):
        made.append(1)
        return original(batch)

    monkeypatch.setattr(batch_module, "host_copy", counting)
    return made


def test_no_batch_is_copied_when_nothing_after_the_epoch_end_check_reads_it(
    monkeypatch, capsys, tmp_path
):
    """A bar, a checkpoint, a CSV writer and an epoch-end callback of the state
    alone: nothing reads the batch after the pass-end check, so no batch is
    copied, training still sees every batch of a refilling loader, and the
    checkpoint and the writer hold every step."""
    made = _copies(monkeypatch)
    step = managed.train_step(seen)
    ends: list[int] = []
    tasks = {
        ciclo.on_train_step: step,
        ciclo.on_epoch_end: lambda state: ends.append(1),
    }
    callbacks = [
        ciclo.keras_bar(total=2 * N),
        ciclo.checkpoint(tmp_path / "ckpt"),
        ciclo.csv_logger(tmp_path / "log.csv"),
    ]
    _, history, elapsed = ciclo.train_loop(
        create(), RefillingLoader(), tasks, epochs=2, prefetch=0, callbacks=callbacks
    )
    assert elapsed.steps == 2 * N and ends == [1, 1]
    assert history.collect("x_seen") == [float(i % N) for i in range(2 * N)]
    assert made == []
    _, at = ciclo.restore(tmp_path / "ckpt", create())
    assert at.steps == 2 * N  # saved at both epoch ends
    assert (tmp_path / "log.csv").read_text().count("\n") == 2 * N + 1


class ReadingBar(type(ciclo.keras_bar())):
    """A user's subclass of a bar that reads the batch in its own hook."""

    def __init__(self):
        super().__init__()
        self.seen: list[float] = []

    def __loop_callback__(self, loop_state):
        self.seen.append(float(np.asarray(loop_state.batch[0])[0, 0]))
        super().__loop_callback__(loop_state)


@pytest.mark.parametrize("reader", ["function", "object", "subclass"])
def test_a_batch_is_copied_when_a_callback_after_the_check_may_read_it(
    monkeypatch, capsys, reader
):
    """A function declaring `batch`, an object that does not say it never
    reads it, or a subclass of a bar with a hook of its own runs after the
    pass-end check: each batch is copied before the next is read, and that
    callback gets its own batch's values."""
    made = _copies(monkeypatch)
    step = managed.train_step(seen)
    after: list[float] = []
    opaque = ReadingBar() if reader == "subclass" else Opaque()
    callback = (
        (lambda state, batch: after.append(float(batch[0][0, 0])))
        if reader == "function"
        else opaque
    )
    tasks = {ciclo.on_train_step: step, ciclo.on_train_batch_end: callback}
    tasks[ciclo.on_epoch_end] = lambda state: None  # the check runs every batch
    _, history, _ = ciclo.train_loop(create(), RefillingLoader(), tasks, prefetch=0)
    got = after if reader == "function" else opaque.seen
    assert got == [float(i) for i in range(N)]  # not [1, 2, ..., 7, 7]
    assert history.collect("x_seen") == [float(i) for i in range(N)]
    assert len(made) == N
