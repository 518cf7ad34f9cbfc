"""Errors raised by speech engines."""


class EngineLoadError(Exception):
    """Raised when an engine cannot load its model or library."""


class SynthesisError(Exception):
    """Raised when an engine fails to synthesise a request."""
