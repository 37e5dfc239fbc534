"""Callbacks shipped with ciclo, one per module."""

from ciclo.callbacks.base import LoopElement
