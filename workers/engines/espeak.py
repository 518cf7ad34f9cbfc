"""The espeak-ng formant synthesiser as an engine: fast, offline, robotic."""

from __future__ import annotations

import math

import numpy as np

from workers.engines import espeak_lib
from workers.engines.base import Engine, SynthesisRequest, Waveform
from workers.engines.errors import EngineLoadError, SynthesisError

_INT16_SCALE = 32768.0


class EspeakEngine(Engine):
    """Speak one espeak-ng language in a few voice variants.

    Every instance in a process drives the library's single global synthesiser
    (see ``espeak_lib``), so engines for several languages may coexist but their
    calls run one at a time. The request's seed is ignored. Repeating a request
    gives audio of almost the same length but not bit-identical samples: espeak-ng
    keeps pitch-flutter state from one utterance to the next.
    """

    def __init__(self, *, language: str, voices: dict[str, str], base_rate_wpm: int = 175) -> None:
        self._language = language
        self._voices = dict(voices)
        self._base_rate_wpm = base_rate_wpm
        self._library: espeak_lib.EspeakLibrary | None = None

    def load(self) -> None:
        """Initialise the process's libespeak-ng and check that every voice exists."""
        library = espeak_lib.shared_library()
        for name, suffix in self._voices.items():
            if not library.has_voice(self._language + suffix):
                raise EngineLoadError(f"espeak-ng has no voice {self._language + suffix!r} for {name!r}")
        self.sample_rate = library.sample_rate
        self._library = library

    def synthesize(self, batch: list[SynthesisRequest]) -> list[Waveform]:
        """Return one float32 waveform per request, checking the whole batch first."""
        if self._library is None:
            raise SynthesisError("EspeakEngine.synthesize called before load")
        jobs = [(request.text, self._voice_name(request), self._rate_wpm(request)) for request in batch]
        return [self._speak(self._library, text, voice, rate) for text, voice, rate in jobs]

    def unload(self) -> None:
        """Drop this engine's handle; the library stays initialised for the process."""
        self._library = None

    def memory_estimate_mb(self) -> int:
        """Return the library's resident size, rounded up generously."""
        return 20

    def _speak(self, library: espeak_lib.EspeakLibrary, text: str, voice: str, rate: int) -> Waveform:
        """Synthesise one checked request and scale its samples to [-1, 1)."""
        samples = library.synthesize(text, voice=voice, rate_wpm=rate)
        return samples.astype(np.float32) / np.float32(_INT16_SCALE)

    def _voice_name(self, request: SynthesisRequest) -> str:
        """Return the espeak voice for a request, rejecting empty text and unknown voices."""
        if not request.text.strip():
            raise ValueError("text is empty")
        voice = "default" if request.voice is None else request.voice
        if voice not in self._voices:
            if request.voice is None:
                return self._language
            raise ValueError(f"unknown voice {voice!r}; expected one of {sorted(self._voices)}")
        return self._language + self._voices[voice]

    def _rate_wpm(self, request: SynthesisRequest) -> int:
        """Return the speaking rate for a speed factor, within what espeak-ng accepts."""
        if not (math.isfinite(request.speed) and request.speed > 0):
            raise ValueError(f"speed must be a positive number, not {request.speed}")
        rate = round(self._base_rate_wpm * request.speed)
        return min(max(rate, espeak_lib.MIN_RATE_WPM), espeak_lib.MAX_RATE_WPM)
