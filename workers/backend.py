"""Run synthesis for the worker: engines loaded on first use, one call at a time per model."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from core.registry import ModelSpec
from workers.engines.base import Engine, SynthesisRequest, Waveform
from workers.engines.errors import SynthesisError

log = logging.getLogger(__name__)

EngineBuilder = Callable[[ModelSpec], Engine]


class SynthesisBackend(Protocol):
    """Anything that turns a segment request into a waveform for a model."""

    def synthesize(self, spec: ModelSpec, request: SynthesisRequest) -> tuple[Waveform, int]:
        """Return the waveform and its sample rate."""
        ...

    def loaded_models(self) -> list[str]:
        """Return the names of the models held in memory."""
        ...

    def close(self) -> None:
        """Unload every model."""
        ...


class InProcessBackend:
    """Hold one engine per model in this process; calls to one engine are serialised."""

    def __init__(self, builder: EngineBuilder) -> None:
        self._builder = builder
        self._engines: dict[str, Engine] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def _engine(self, spec: ModelSpec) -> tuple[Engine, threading.Lock]:
        with self._guard:
            lock = self._locks.setdefault(spec.name, threading.Lock())
        with lock:
            engine = self._engines.get(spec.name)
            if engine is None:
                started = time.perf_counter()
                engine = self._builder(spec)
                engine.load()
                engine.warmup()
                self._engines[spec.name] = engine
                log.info("loaded model %s (%s) in %.2fs", spec.name, spec.engine, time.perf_counter() - started)
        return engine, lock

    def synthesize(self, spec: ModelSpec, request: SynthesisRequest) -> tuple[Waveform, int]:
        """Synthesise one segment with the model's engine."""
        engine, lock = self._engine(spec)
        with lock:
            waves = engine.synthesize([request])
        if len(waves) != 1:
            raise SynthesisError(f"engine {spec.name} returned {len(waves)} waveforms for 1 input")
        return waves[0], engine.sample_rate

    def loaded_models(self) -> list[str]:
        """Return the names of the models held in memory."""
        return sorted(self._engines)

    def close(self) -> None:
        """Unload every model."""
        with self._guard:
            for engine in self._engines.values():
                engine.unload()
            self._engines.clear()
