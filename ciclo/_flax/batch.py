"""Reading a batch as `inputs`, `target`, `sample_weight` and extra named values."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

__all__ = ["Batch", "unpack_batch"]

_TARGET_KEYS = ("target", "labels")


@dataclasses.dataclass(frozen=True)
class Batch:
    """A batch taken apart.

    Attributes:
        inputs: what the model is called with (its first positional argument).
        target: the labels, or None.
        sample_weight: per-sample weights, or None.
        extras: the other keys of a dict batch (passed to losses/metrics by name).
    """

    inputs: Any
    target: Any = None
    sample_weight: Any = None
    extras: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def unpack_batch(batch: Any) -> Batch:
    """Takes a batch apart.

    Accepted forms:

    - `(inputs,)`, `(inputs, target)` or `(inputs, target, sample_weight)`
      (tuples or lists);
    - a dict with `"inputs"`, optionally `"target"` (or `"labels"`) and
      `"sample_weight"`; any other key is kept in `extras`;
    - anything else is the inputs alone (e.g. an array, for prediction).

    Args:
        batch: the batch.

    Returns:
        A `Batch`.

    Raises:
        TypeError: for a tuple of another length, or a dict without `"inputs"` or
            with both `"target"` and `"labels"`.

    Example:
        >>> from ciclo._flax.batch import unpack_batch
        >>> b = unpack_batch({"inputs": 1, "labels": 2, "mask": 3})
        >>> b.inputs, b.target, dict(b.extras)
        (1, 2, {'mask': 3})
    """
    if isinstance(batch, tuple | list):
        if not 1 <= len(batch) <= 3:
            raise TypeError(
                f"A tuple batch must be (inputs,), (inputs, target) or (inputs, "
                f"target, sample_weight); got a {type(batch).__name__} of length "
                f"{len(batch)}. For more fields use a dict batch: {{'inputs': ..., "
                f"'target': ..., 'sample_weight': ..., 'other': ...}}."
            )
        return Batch(*batch)
    if isinstance(batch, Mapping):
        if "inputs" not in batch:
            raise TypeError(
                f"A dict batch needs an 'inputs' key (and optionally 'target' or "
                f"'labels', 'sample_weight'); got keys {sorted(batch)}. Rename the "
                f"input key, e.g. with a map over the dataset."
            )
        present = [k for k in _TARGET_KEYS if k in batch]
        if len(present) > 1:
            raise TypeError(
                f"A dict batch has both 'target' and 'labels'; keep one of them "
                f"(they mean the same). Keys: {sorted(batch)}."
            )
        known = {"inputs", "sample_weight", *_TARGET_KEYS}
        return Batch(
            inputs=batch["inputs"],
            target=batch[present[0]] if present else None,
            sample_weight=batch.get("sample_weight"),
            extras={k: v for k, v in batch.items() if k not in known},
        )
    return Batch(inputs=batch)
