"""Engines that exist only for tests, registered by importing this module (TTS_ENGINE_PLUGINS=tests.support.engines).

The ``faulty`` engine speaks like espeak but hangs or dies on marked input, for the fault tests (tests/chaos);
models.json never names it: only the registries those tests write do.
"""

from __future__ import annotations

import os
import threading

from core.registry import ModelSpec, register_engine
from workers.engines.base import Engine, SynthesisRequest, Waveform
from workers.engines.espeak import EspeakEngine

#: The exit status of a process the kernel's OOM killer (or a CUDA OOM abort) ended.
OOM_EXIT_CODE = 137


class FaultyEngine(Engine):
    """Speak like espeak, but hang forever on a batch holding ``hang_marker`` and die on ``crash_marker``.

    A hang stands for a GPU kernel that never returns; a crash for the model
    process being killed for running out of memory. Both affect the whole batch,
    as they would on a GPU.
    """

    def __init__(
        self,
        *,
        language: str,
        voices: dict[str, str],
        base_rate_wpm: int = 175,
        hang_marker: str = "HANG-ME",
        crash_marker: str = "CRASH-ME",
    ) -> None:
        self._inner = EspeakEngine(language=language, voices=voices, base_rate_wpm=base_rate_wpm)
        self.hang_marker = hang_marker
        self.crash_marker = crash_marker

    def load(self) -> None:
        """Load the wrapped espeak engine."""
        self._inner.load()
        self.sample_rate = self._inner.sample_rate

    def synthesize(self, batch: list[SynthesisRequest]) -> list[Waveform]:
        """Die or hang if the batch holds a marker; otherwise speak it with espeak."""
        if any(self.crash_marker in request.text for request in batch):
            os._exit(OOM_EXIT_CODE)  # no clean-up, no reply: what a killed process leaves behind
        if any(self.hang_marker in request.text for request in batch):
            threading.Event().wait()  # never set: the call never returns
        return self._inner.synthesize(batch)

    def unload(self) -> None:
        """Unload the wrapped engine."""
        self._inner.unload()

    def memory_estimate_mb(self) -> int:
        """Return the wrapped engine's estimate."""
        return self._inner.memory_estimate_mb()


def build_faulty(spec: ModelSpec, *, device: str) -> Engine:
    """Return a faulty engine for ``spec`` (on the CPU, as espeak runs, whatever ``device`` says)."""
    return FaultyEngine(voices=dict(spec.voices), **spec.options)


# Its audio is espeak's: the same package versions it.
register_engine("faulty", builder="tests.support.engines:build_faulty", package="espeakng-loader")
