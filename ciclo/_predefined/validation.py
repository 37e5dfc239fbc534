"""`train_loop`'s test loops: one `inner_loop` per test dataset, run at the epoch
ends (behind `test_every`), each a loop of the `VALIDATION` table (the validation
hooks around the test ones) over a fresh `test_dataset()`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ciclo._history.history import History
from ciclo._input.passes import iterate
from ciclo._loop.callback import arity
from ciclo._period import as_period
from ciclo._predefined.register import Gated
from ciclo._predefined.tables import NESTED, VALIDATION
from ciclo._schedules.named import When, on_test_step, on_validation_step
from ciclo._short import short
from ciclo._time import Elapsed
from ciclo._warn import warn
from ciclo.callbacks._inner_loop import TEST_AGGREGATION, inner_loop


def test_loops(
    run, named, test_dataset, test_duration, test_name, test_every, kwargs, loop_kwargs
):
    """The test loops' `inner_loop`s of the epoch end, behind `test_every`; `run`
    runs a table (`run(VALIDATION, state, data, named, [], **loop_kwargs)`)."""
    if isinstance(test_dataset, Mapping):
        datasets = dict(test_dataset)
        if not isinstance(test_duration, Mapping | None):
            test_duration = {name: test_duration for name in datasets}
        unknown = set(test_duration or {}) - set(datasets)
        if unknown:
            raise ValueError(
                f"train_loop: `test_duration` names {sorted(unknown)}, which are not "
                f"in `test_dataset` ({sorted(datasets)}); use the same names."
            )
        durations = test_duration or {}
    else:
        if isinstance(test_duration, Mapping):
            raise TypeError(
                f"train_loop: `test_duration` is a dict ({sorted(test_duration)}) but "
                f"`test_dataset` is not; pass test_dataset={{name: factory}} too, or "
                f"one int / Period as `test_duration`."
            )
        datasets, durations = {test_name: test_dataset}, {test_name: test_duration}
    if not isinstance(kwargs, Mapping | None):
        raise TypeError(
            f"train_loop: `inner_loop_kwargs` must be a dict such as "
            f"{{'aggregation': 'mean'}}, got {type(kwargs).__name__}."
        )
    kwargs = dict(kwargs or {})
    aggregation = kwargs.get("aggregation", {})
    if isinstance(aggregation, Mapping):  # covers what the user's dict does not
        kwargs["aggregation"] = {**TEST_AGGREGATION, **aggregation}
    loops = []
    for name, factory in datasets.items():
        duration = durations.get(name)
        if duration is not None:
            as_period(duration, f"test_duration[{name!r}]")
        run_test = _evaluation(run, named, factory, duration, loop_kwargs)
        loops.append(inner_loop(name, run_test, **kwargs))
    if test_every is None:
        return loops
    if isinstance(test_every, int) and not isinstance(test_every, bool):
        if test_every < 1:
            raise ValueError(
                f"train_loop: `test_every` must be >= 1 epochs, got {test_every}."
            )
        return [Gated(When(NESTED).every(test_every), loops)]
    if callable(test_every):
        return [Gated(When(NESTED) & test_every, loops)]  # sees elapsed_after
    raise TypeError(
        f"train_loop: `test_every` must be an int (every n epochs) or a schedule "
        f"evaluated at the epoch ends (e.g. ciclo.after(1000)), got {short(test_every)} "
        f"({type(test_every).__name__})."
    )


def _evaluation(run, named, test_dataset, test_duration, loop_kwargs):
    """`state -> (state, history, elapsed)`: the `VALIDATION` table over a fresh
    `test_dataset()`, without the reset steps (the epoch end has just run them);
    its step is `on_validation_step`, else `on_test_step`."""
    if not callable(test_dataset):
        raise TypeError(
            f"train_loop: `test_dataset` must be a zero-argument callable returning a "
            f"fresh iterable each epoch, e.g. lambda: make_test_batches(); got "
            f"{short(test_dataset)} ({type(test_dataset).__name__})."
        )
    arity(test_dataset, "train_loop: `test_dataset`", most=0)
    step = named[on_validation_step] or named[on_test_step]
    if not step:
        raise ValueError(
            "train_loop: `test_dataset` was given but nothing runs on `on_test_step` "
            "(nor on `on_validation_step`): give the state a `test_step` method or "
            "pass tasks={ciclo.on_test_step: [test_step]}."
        )
    test_named = {name: named[name] for name in VALIDATION.own}
    test_named[on_validation_step] = step

    def run_test(state: Any) -> tuple[Any, History, Elapsed]:
        data = iterate(test_dataset(), "`test_dataset()` returned")
        output = run(
            VALIDATION, state, data, test_named, [],
            stop=test_duration, catch_keyboard_interrupt=False, **loop_kwargs,
        )  # fmt: skip
        if output[2].steps == 0:
            warn(
                f"train_loop: `test_dataset()` yielded no batch, so this epoch has "
                f"no test metrics (monitors of them fail at this step). "
                f"`test_dataset` must return a FRESH iterable each epoch: "
                f"`lambda: make_batches()`, not `lambda: g` with one generator `g` "
                f"(exhausted after the first epoch). Got {short(test_dataset, 80)}."
            )
        return output

    return run_test
