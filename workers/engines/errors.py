"""Errors raised by speech engines: the worker branch of the one tree in core/errors.py, re-exported here."""

from __future__ import annotations

from core.errors import EngineLoadError, SynthesisError, WorkerError

__all__ = ["EngineLoadError", "SynthesisError", "WorkerError"]
