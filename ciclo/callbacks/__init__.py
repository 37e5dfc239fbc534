"""Callbacks shipped with ciclo, one per module; `LoopElement` is their protocol."""

from ciclo.callbacks.base import LoopElement

__all__ = ["LoopElement"]
