"""Which checkpoints `ciclo.checkpoint` keeps, and which one is the best.

Retention (`retention`): without a monitor, the `keep` latest checkpoints. With
one, the `keep` best by that metric AND the latest one (orbax's `best_fn` with
`max_to_keep` alone would delete the newest when it is not among the best, and a
resume would go back silently), combined as
`AnyPreservationPolicy([LatestN(1), BestRanked(keep)])`.

Checkpoints saved with a monitor carry orbax metrics
`{"score", "value", "monitor", "mode"}`, `score` oriented so that higher is better;
an unranked one (the monitored entry was not logged at that save) carries
`{"monitor", "mode"}` without a score, so orbax gets metrics for every save (no "did
not provide metrics" warning) and ranks it nowhere. Among equal scores the earliest
checkpoint is the better one (`best_key`), as in Keras and Lightning (only a strict
improvement replaces the best).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from orbax.checkpoint import checkpoint_managers as policies

__all__ = ["BestRanked", "best_key", "retention", "score"]


def score(metrics: Any) -> float:
    """Higher is better; checkpoints saved with a monitor store it as `score`."""
    if isinstance(metrics, Mapping) and "score" in metrics:
        return float(metrics["score"])
    return -math.inf


def best_key(step: int, metrics: Any) -> tuple[float, int]:
    """The ranking key of a checkpoint, larger is better: its score, then the
    EARLIER step among equal scores (as Keras' and Lightning's checkpoints, where
    only a strict improvement replaces the best)."""
    return score(metrics), -int(step)


@dataclasses.dataclass
class BestRanked:
    """Orbax preservation policy: the `n` best checkpoints that carry a score.

    Orbax's `BestN(keep_checkpoints_without_metrics=False)` but for two points: a
    checkpoint whose metrics have no score (an unranked save, or none at all) is
    never among the best, and among equal scores the earliest step wins
    (`best_key`). As `BestN`, it keeps everything while there are at most `n`
    checkpoints (orbax calls it with them in step order).
    """

    n: int

    def should_preserve(self, checkpoints: Any, *, context: Any) -> list[bool]:
        if len(checkpoints) <= self.n:
            return [True] * len(checkpoints)
        ranked = [
            (best_key(info.step, info.metrics), i)
            for i, info in enumerate(checkpoints)
            if isinstance(info.metrics, Mapping) and "score" in info.metrics
        ]
        best = {i for _, i in sorted(ranked)[-self.n :]}
        return [i in best for i in range(len(checkpoints))]


def retention(keep: int, monitored: bool) -> Any:
    """The orbax preservation policy of a checkpoint directory: the `keep` latest
    checkpoints, or with a monitor the `keep` best and the latest."""
    if not monitored:
        return policies.LatestN(n=keep)
    return policies.AnyPreservationPolicy([policies.LatestN(n=1), BestRanked(n=keep)])
