"""`Run`: the per-batch timeline of one `loop` call, and what Ctrl-C must undo.

For each batch it counts the batch (`elapsed_after`'s fields; the `Elapsed`
itself is built at its first read, `LoopState.elapsed_after`), runs the firing
schedules' callbacks, commits the step's logs with `elapsed` (before the batch),
builds the next batch's `elapsed` in the same held block, and decides whether to
stop (`stop` against `elapsed_after`'s fields, as the epoch end reads them).

Fused execution has one hook here: a batch that is a `ciclo.Steps` (`n` batches
stacked, built by `ciclo.fuse` when `steps_per_call > 1`) counts as `n` steps and
its `samples`; when the step that ran it left per-step logs in `Steps.rows`, the
history gets `n` rows (`History.commit_steps`) instead of one. Everything else —
schedules, callbacks, stopping — sees the call as one batch, so schedules fire at
call boundaries.
"""

from __future__ import annotations

from typing import Any

from ciclo import _time
from ciclo._input.batch import Steps, batch_size
from ciclo._interrupts import DEFERRED, Scope, held
from ciclo._logs import Logs
from ciclo._loop.runners import ScheduleBlame, fired
from ciclo._loop.state import _ROW, committed, elapsed_at
from ciclo._shapes import signature as shapes_of
from ciclo._time import Elapsed

__all__ = ["Run"]


class Run:
    """The per-batch hot path of one `loop` call, and what Ctrl-C must undo."""

    def __init__(self, ls, plan, start, stop, batch_size_fn):
        self.ls, self.plan, self.start = ls, plan, start
        self.stop, self.batch_size_fn = stop, batch_size_fn
        # `current`: counts every batch whose tasks completed; None while it is
        # not built (then `_row` and `_start` are its fields, as `LoopState`'s)
        self._current, self._row, self._start = ls.elapsed, None, 0.0
        self.started = False
        self.in_batch = False
        self.done = False  # the batch's tasks all ran
        self.rows = None  # len(history) just before the batch's commit began
        self.state = None  # the state when the batch started
        self.running = None  # the runner (or failed schedule) named in error notes
        self.finishing = None  # the after-commit action running (named likewise)
        # the committed steps' logs, merged when `ls.accumulated_logs` reads them
        self.unmerged = ls._unmerged
        # after each step, whether to stop for a preemption (SIGTERM; set by the
        # loop that owns the interrupt scope, `ciclo._interrupts`)
        self.watch = None
        self.preempted = False  # stopped for a preemption

    @property
    def current(self) -> Elapsed:
        """The `Elapsed` counting every batch whose tasks completed."""
        if self._current is None:
            self._current = elapsed_at(self._row, self._start)
        return self._current

    @current.setter
    def current(self, value: Elapsed) -> None:
        self._current = value

    def _on_start(self) -> None:
        self.started = True
        for callback in self.start:
            callback(self.ls)

    def batches(self, iterator: Any) -> None:
        """Runs the batches of `iterator`, an iterator of `ciclo._input.batch.Item`."""
        ls, plan, stop, history = self.ls, self.plan, self.stop, self.ls.history
        size_fn = self.batch_size_fn
        current = self.current
        new_logs = Logs.__new__  # an empty Logs, without a Python __init__ call
        now = _time._time.time  # ciclo's clock (`Elapsed.update`'s)
        watch = self.watch
        # SIGTERM's scope, read before asking it (a call) whether to stop
        asked = getattr(watch, "__self__", None)
        hold, release = held()  # Ctrl-C deferred around each commit
        # the scope's own counter, written out, when it is the scope's (`held`)
        scope = getattr(hold, "__self__", None)
        if not isinstance(scope, Scope):
            scope = None
        # a batch's size is read from its leaf shapes: computed again only when
        # they change (a user's `batch_size_fn` is called for every batch)
        shapes, size = None, 0
        # `current`'s counts and start, kept here: the loop's `Elapsed`s are
        # built from them, when read (`LoopState.elapsed`, `.elapsed_after`)
        steps, samples, start = current.steps, current.samples, current.date_start
        self._start = ls._start = start
        # the batch's `elapsed` (None: not built yet) and its History row
        built, row = current, _ROW(current)
        if stop is not None and stop.reached(current):
            iterator = iter(())
        elif watch is not None and watch(current.steps):  # SIGTERM while resuming
            self.preempted, iterator = True, iter(())
        for item in iterator:  # `Item`s of the input stage (`ciclo._input.stage`)
            batch = item.batch
            ls.placed = item  # its placed copy, its pass end: they ride along
            ls.batch, ls.logs = batch, new_logs(Logs)
            ls._elapsed, ls._row = built, row  # `ls.elapsed`, built when read
            if not self.started:  # with the first batch, before its tasks
                self._on_start()
                if ls.stop_iteration or ls.stopping:
                    return
            # `current.update(...)`, written out (the hot path)
            fused = type(batch) is Steps
            if fused:  # counts as batch.n steps
                batch.rows = None
                steps_after = steps + batch.n
                samples_after = samples + batch.samples
            else:
                if size_fn is None:
                    seen = shapes_of(batch)
                    if seen != shapes:
                        shapes, size = seen, batch_size(batch)
                    # the shape watch's too: the same object while they do not
                    # change (the watch's runners compare it by identity)
                    ls._shapes = (batch, shapes)
                else:
                    size = batch_size(batch, size_fn)
                steps_after, samples_after = steps + 1, samples + size
            # `elapsed_after`'s fields: it is built at its first read (most
            # batches nothing reads it)
            counts = (steps_after, samples_after, now(), start)
            ls._after, ls._after_counts = None, counts
            self.state, self.rows, self.done = ls.state, None, False
            self.in_batch = True
            for schedule, reads_loop_state, runners in plan:
                if schedule is not None:  # else due at every batch (`make_plan`)
                    try:
                        due = schedule(ls if reads_loop_state else ls.elapsed)
                        if due is not True and due is not False:
                            due = fired(due, schedule)
                    except Exception:
                        self.running = ScheduleBlame(schedule)  # named in the note
                        raise
                    if not due:
                        continue
                for run in runners:
                    self.running = run
                    run(ls)
                    if ls.stop_iteration:
                        break
                else:
                    continue
                break  # a callback set `stop_iteration`
            self.done = True
            logs = ls.logs
            # Ctrl-C meanwhile: raised once the batch has counted
            if scope is not None:  # `hold()`, written out
                scope.busy += 1
            else:
                hold()
            try:
                # the history's own commit, inside this block (`ls.logs` is a Logs)
                if fused and batch.rows is not None:
                    self.rows = history._rows  # len(history), without a call
                    if type(logs) is not Logs:  # a callback set `ls.logs` itself
                        history.commit_steps(ls.elapsed, batch, logs)
                    elif batch.n > 0:
                        history._append_steps(ls.elapsed, batch, logs)
                elif logs:
                    self.rows = history._rows  # len(history), without a call
                    if type(logs) is Logs:
                        history._append_row(row, logs)
                    else:  # a callback set `ls.logs` itself
                        history.commit(ls.elapsed, logs)
                if self.rows is not None:  # committed: `accumulated_logs` has it
                    unmerged = self.unmerged
                    unmerged.append(logs)
                    if len(unmerged) > 256:
                        committed(ls)
                # the next batch's `elapsed`, counting this batch, as its row
                # (published once whole: Ctrl-C is held here)
                steps, samples, date = steps_after, samples_after, now()
                built, row = None, (steps, samples, date - start, date)
                self._current, self._row = None, row
                self.in_batch = False
            finally:
                if scope is not None:  # `release()`, written out
                    scope.busy -= 1
                    if scope.pending and scope.busy == 0:
                        scope.pending = False
                        raise KeyboardInterrupt
                else:
                    release()
            if ls._after_commit:
                self.after_commit()
                # the next batch starts after the saves
                date = now()
                row = (steps, samples, date - start, date)
                self._current, self._row = None, row
            if (
                watch is not None
                and (asked is None or asked.preempted or asked.sync is not None)
                and watch(steps_after)
            ):  # SIGTERM: stop here
                self.preempted = True
                break
            if (
                ls.stop_iteration
                or ls.stopping
                or (stop is not None and stop._reached_at(counts))
            ):
                break
        if not self.started:  # no batch at all: on_start still runs once
            ls.batch = None
            self._on_start()

    def after_commit(self) -> None:
        """Runs the actions callbacks deferred until the step's row is committed
        (`ciclo._loop.state.after_commit`: a checkpoint's save)."""
        pending = self.ls._after_commit
        with DEFERRED:  # Ctrl-C meanwhile: raised once the step's saves started
            while pending:
                self.finishing = pending.pop(0)
                self.finishing()
        self.finishing = None

    def finish_observers(self) -> None:
        """After Ctrl-C or an error cut the batch: the observers (writers, bars,
        `lr_monitor`: `callback.observer`) its schedules would have called after
        the cut run on it, as in a whole batch, so that a writer holds the cut
        step's row exactly when its schedule fires there (`every(4)`: step 8,
        not step 6) and sees a failing step's logs (the NaN `nan_guard` stopped
        on). Only observers: nothing else runs after the cut. Their own errors
        (and a second Ctrl-C) end this, the cut's error stands."""
        ls, plan, running = self.ls, self.plan, self.running
        if self.done or ls.stop_iteration:
            return
        for i, (_, _, runners) in enumerate(plan):
            if running in runners:
                start, first = i, runners.index(running) + 1
                break
        else:  # the cut came in a schedule, or before the first runner
            return
        current = ls.elapsed
        try:
            for i in range(start, len(plan)):
                schedule, reads_loop_state, runners = plan[i]
                if i == start:
                    runners = runners[first:]  # the cut's group: it fired
                elif schedule is not None:
                    due = schedule(ls if reads_loop_state else current)
                    if due is not True and due is not False:
                        due = fired(due, schedule)
                    if not due:
                        continue
                for run in runners:
                    if getattr(run, "observes", False):
                        run(ls)
        except (Exception, KeyboardInterrupt):
            return

    def unfinished(self) -> None:
        """After an error in a batch: the actions deferred to its commit run as
        they would have at their call (a checkpoint saves the step's row as it
        is); after an error in one of them, the others are dropped."""
        pending, ls = self.ls._after_commit, self.ls
        if self.finishing is not None or not self.in_batch:
            pending.clear()
            return
        with DEFERRED:
            while pending:
                self.finishing = pending.pop(0)
                self.finishing(row=(ls.elapsed, ls.logs))
        self.finishing = None

    def interrupted(self) -> None:
        """After Ctrl-C inside a batch: the batch counts when its tasks all ran or
        it changed the state (its step reached the state); then its logs are in
        the history exactly once. A batch that does not count leaves no row (it
        is redone when the run resumes from the returned `elapsed`). The actions
        deferred to the commit of a batch that counts run then (its
        checkpoint); those of one that does not are dropped."""
        if not self.in_batch:
            if self.ls._after_commit:  # committed, its saves not started yet
                self.after_commit()
            return
        ls = self.ls
        counted = self.done or ls.state is not self.state
        if counted and self.rows is None:  # its observers' part (writers, lr_monitor)
            self.finish_observers()
        published = self.rows is not None and len(ls.history) > self.rows
        if counted and ls.logs and not published:
            ls.history.commit(self.current, ls.logs)
            committed(ls).merge(ls.logs)  # `accumulated_logs` in the end hooks
        if counted:
            self.current = ls.elapsed_after
            self.in_batch = False
            self.after_commit()  # e.g. the step's checkpoint, its row complete
        ls._after_commit.clear()
