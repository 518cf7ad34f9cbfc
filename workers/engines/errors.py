"""Errors raised by speech engines."""

from __future__ import annotations


class EngineLoadError(Exception):
    """Raised when an engine cannot load its model; the message says where the weights must go."""


class SynthesisError(Exception):
    """Raised when an engine cannot turn a batch into exactly one waveform per request."""
