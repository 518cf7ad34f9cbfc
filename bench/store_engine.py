"""A stand-in engine for `make bench-store`: ChatTTS's output, at its real size and cut as it cuts it, made at once.

It stands where the worker's batcher and model pool stand (a ``SynthesisBackend``), so everything around it is the
worker's own code: the fragment writer, the segment's write and its job's advance, the observers. Its audio is real
speech (eSpeak NG, resampled to ChatTTS's 24 kHz), so that the store's codec packs it as it packs speech; a segment
lasts its characters at the service's assumed pace (TTS_SECONDS_PER_CHAR), and its fragments are cut on the
fragment schedule (TTS_FRAGMENT_MS) as ChatTTS cuts them (workers/engines/fragments.py ``TokenFragments``).
"""

from __future__ import annotations

import math
import time

import numpy as np
import numpy.typing as npt

from core.fragments import FragmentSchedule, FragmentSizes
from core.registry import ModelSpec
from workers.batcher import BatchObserver
from workers.engines.base import Piece, SegmentFragment, SynthesisRequest, Waveform
from workers.planner import Due, Early

#: ChatTTS's output: 24 kHz mono, 512 samples a token, and a decode half a token short at its end; a fragment waits
#: for 8 tokens past it, a waited-for first one for 4 (workers/engines/fragments.py; ChatTTSEngine's
#: ``fragment_lookahead`` and ``fragment_first_lookahead``). Copied, not imported: those modules import torch, which
#: the bench's processes have no other use for (tests/test_bench_store.py holds the copies to the originals).
SAMPLE_RATE = 24_000
SAMPLES_PER_TOKEN = 512
DECODE_SHORTFALL = 256
LOOKAHEAD = 8
FIRST_LOOKAHEAD = 4


def fragment_tokens(
    tokens: int,
    sizes: FragmentSizes,
    *,
    opening: bool,
    lookahead: int = LOOKAHEAD,
    first_lookahead: int = FIRST_LOOKAHEAD,
) -> list[int]:
    """Return the tokens of each fragment ChatTTS cuts a segment of ``tokens`` into: those its growing tokens
    complete (each with its lookahead past it, and room for a last one after the first), then the rest as it ends.
    Only an ``opening`` fragment (a listener waiting for the job's first words) has the short first size and
    lookahead."""
    if not sizes.streams:
        return [tokens]
    first = sizes.first if opening else sizes.steady
    pieces: list[int] = []
    emitted = 0
    while True:  # TokenFragments._complete, as the tokens grow
        size = first if not pieces else sizes.steady
        hold = (first_lookahead if opening else lookahead) if not pieces else max(lookahead, sizes.least)
        if tokens - emitted < size + hold:
            break
        pieces.append(size)
        emitted += size
    left = tokens - emitted  # TokenFragments.ended
    size = first if not pieces else sizes.steady
    while left > size + sizes.least:
        pieces.append(size)
        left -= size
        size = sizes.steady
    if left > sizes.steady:
        pieces.append(left // 2)
        left -= left // 2
    if left > 0 or not pieces:
        pieces.append(left)
    return pieces


def speech_bank(waves: list[Waveform], rate: int) -> npt.NDArray[np.float32]:
    """Return real speech, joined and resampled from ``rate`` to ChatTTS's 24 kHz, for the stand-in to cut from."""
    joined = np.concatenate(waves).astype(np.float32)
    at = np.arange(int(len(joined) * SAMPLE_RATE / rate)) * (rate / SAMPLE_RATE)
    resampled: npt.NDArray[np.float32] = np.interp(at, np.arange(len(joined)), joined).astype(np.float32)
    return resampled


class StandInEngine:
    """Return each segment's audio at once, in fragments, through the worker's own fragment writer."""

    def __init__(
        self,
        bank: npt.NDArray[np.float32],
        *,
        seconds_per_char: float,
        schedule: FragmentSchedule,
        observe: BatchObserver,
        seed: int = 0,
    ) -> None:
        self.bank = bank
        self.seconds_per_char = seconds_per_char
        self.sizes = schedule.in_tokens(1000 * SAMPLES_PER_TOKEN / SAMPLE_RATE)
        self.observe = observe  # the worker's record of each engine call (workers.wiring.batch_observer)
        self._rng = np.random.default_rng(seed)

    def synthesize(
        self,
        spec: ModelSpec,
        request: SynthesisRequest,
        *,
        deadline: Due | None = None,
        early: Early = False,
        fragment: SegmentFragment | None = None,
    ) -> tuple[Waveform, int]:
        """Make the segment's audio now and tell ``fragment`` its fragments, as ChatTTS would have cut them."""
        started = time.perf_counter()
        seconds = len(request.text) * self.seconds_per_char / request.speed
        tokens = max(1, math.ceil(seconds * SAMPLE_RATE / SAMPLES_PER_TOKEN))
        due = deadline() if callable(deadline) else deadline
        playing = early() if callable(early) else early
        # What the batcher tells the engine (slack_s, playing), and how TokenFragments reads it.
        waited_for = not playing and (due is None or due <= time.time())
        pieces = fragment_tokens(tokens, self.sizes, opening=waited_for)
        wave = self._speech(tokens * SAMPLES_PER_TOKEN - DECODE_SHORTFALL)
        start = 0
        for number, size in enumerate(pieces):
            last = number == len(pieces) - 1
            stop = len(wave) if last else start + size * SAMPLES_PER_TOKEN
            if fragment is not None:
                fragment(Piece(number, wave[start:stop], last=last), SAMPLE_RATE)
            start = stop
        took = time.perf_counter() - started
        self.observe(spec.name, 1, len(request.text), took, took)
        return wave, SAMPLE_RATE

    def _speech(self, samples: int) -> Waveform:
        """Return ``samples`` of speech from a random place in the bank (wrapping round)."""
        at = int(self._rng.integers(len(self.bank)))
        return np.take(self.bank, np.arange(at, at + samples), mode="wrap")

    def loaded_models(self) -> list[str]:
        """Return no models: the stand-in holds none."""
        return []

    def close(self) -> None:
        """Do nothing: the stand-in holds nothing."""
