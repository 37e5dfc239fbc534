"""The model-adapter interface of a `FlaxState`: what an adapter's `apply` returns
(`Forward`), what it provides (`ModelAdapter`, implemented by
`ciclo._flax.linen.LinenModel` and `ciclo._flax.nnx.NNXModel`), and the names of
the losses and metrics a model sows (`sown_names`, traced abstractly).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import jax

from ciclo._warn import warn

__all__ = ["Forward", "ModelAdapter", "sown_names"]


class Forward(NamedTuple):
    """What a model adapter's `apply` returns for one batch."""

    preds: Any
    batch_stats: Any
    collections: Any
    sown_losses: dict[str, Any]
    sown_metrics: dict[str, Any]


class ModelAdapter(Protocol):
    def apply(
        self, state: Any, inputs: Any, *, training: bool, key: Any
    ) -> Forward: ...

    def bind(self, state: Any) -> Any: ...


class _Variables(NamedTuple):
    """What a model adapter's `apply` reads of a `FlaxState` (for `sown_names`)."""

    params: Any
    batch_stats: Any
    collections: Any


def sown_names(
    model: ModelAdapter,
    inputs: Any,
    key: Any,
    *,
    params: Any,
    batch_stats: Any,
    collections: Any,
    modes: tuple[bool, ...] = (True,),
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The names of the losses and metrics `model` sows when a step runs on
    `inputs`, in training (`modes=(True,)`) and/or evaluation mode.

    The forward is traced abstractly (`jax.eval_shape`: shapes only, no FLOPs)
    with the arguments `train_step` / `test_step` give `model.apply`. If it cannot
    be traced, a `UserWarning` says so and `((), ())` is returned.

    Returns:
        `(loss names, metric names)`, each in the order first sown.
    """

    def forward(variables, inputs, key):
        outs = [model.apply(variables, inputs, training=t, key=key) for t in modes]
        return [(dict(o.sown_losses), dict(o.sown_metrics)) for o in outs]

    variables = _Variables(params, batch_stats, collections)
    try:
        outs = jax.eval_shape(forward, variables, inputs, key)
    except Exception as error:  # the train step reports it, if it recurs there
        message = str(error).strip().splitlines()
        warn(
            f"create_flax_state: could not trace a step of the module on `inputs` "
            f"({type(error).__name__}: {message[0] if message else ''}), so the "
            f"losses it sows in that step get no `avg_<name>` running mean. Pass "
            f"sample `inputs` that the model accepts."
        )
        return (), ()
    losses = tuple(dict.fromkeys(n for out in outs for n in out[0]))
    metrics = tuple(dict.fromkeys(n for out in outs for n in out[1]))
    return losses, metrics
