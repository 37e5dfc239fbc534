"""The test loop that `train_loop` runs at each epoch end (through `inner_loop`)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from ciclo.callbacks.inner_loop import inner_loop
from ciclo.history import History
from ciclo.loops import builder
from ciclo.loops.named import TEST, on_test_step
from ciclo.time import Elapsed

__all__ = ["evaluation_callback"]


def evaluation_callback(
    registered: builder.Registered,
    test_dataset: Any,
    test_duration: Any,
    test_name: str,
    metadata: Any,
    batch_size_fn: Any,
    inner_loop_kwargs: Mapping[str, Any] | None,
) -> Any:
    """The epoch-end callback of `train_loop` running its test loop via `inner_loop`.

    Raises:
        TypeError: for a `test_dataset` that is not a zero-argument callable, or
            `inner_loop_kwargs` that is not a dict.
        ValueError: if nothing runs on `on_test_step`.
    """
    _check_zero_argument(test_dataset)
    if not registered.has(on_test_step):
        raise ValueError(
            "train_loop: `test_dataset` was given but nothing runs on "
            "`on_test_step`: give the state a `test_step` method or pass "
            "tasks={ciclo.on_test_step: [test_step]}."
        )
    if inner_loop_kwargs is not None and not isinstance(inner_loop_kwargs, Mapping):
        raise TypeError(
            f"train_loop: `inner_loop_kwargs` must be a dict such as "
            f"{{'aggregation': 'mean'}}, got {type(inner_loop_kwargs).__name__}."
        )
    test_registered = registered.nested(TEST)

    def run_test(state: Any) -> tuple[Any, History, Elapsed]:
        batches = test_dataset()
        try:
            iterator = iter(batches)
        except TypeError:
            raise TypeError(
                f"train_loop: `test_dataset()` returned {batches!r:.100} "
                f"({type(batches).__name__}), which is not iterable; it must return "
                f"a fresh iterable of test batches each epoch, e.g. "
                f"test_dataset=lambda: iter(test_batches)."
            ) from None
        return builder.run(
            TEST,
            test_registered,
            state,
            iterator,
            stop=test_duration,
            catch_keyboard_interrupt=False,  # Ctrl-C must end the training loop
            metadata=metadata,
            batch_size_fn=batch_size_fn,
        )

    return inner_loop(test_name, run_test, **(inner_loop_kwargs or {}))


def _check_zero_argument(test_dataset: Any) -> None:
    problem = None
    if not callable(test_dataset):
        problem = f"got {test_dataset!r:.100} ({type(test_dataset).__name__})"
    else:
        try:
            inspect.signature(test_dataset).bind()
        except TypeError as error:
            problem = (
                f"{test_dataset!r:.100} cannot be called without arguments ({error})"
            )
        except ValueError:  # no signature (some builtins): trust it
            pass
    if problem is not None:
        raise TypeError(
            f"train_loop: `test_dataset` must be a zero-argument callable returning "
            f"a fresh iterable each epoch, e.g. test_dataset=lambda: "
            f"make_test_batches(); {problem}."
        )
