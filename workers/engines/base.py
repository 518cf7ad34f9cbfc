"""The one small interface every speech engine implements."""

from __future__ import annotations

import abc
from collections.abc import Callable, Sized
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from core.errors import SynthesisError
from core.fragments import NO_FRAGMENTS, FragmentSchedule

Waveform = npt.NDArray[np.float32]
#: Told each item's waveform the moment it is made: (its index in the batch, its waveform).
Ready = Callable[[int, Waveform], None]
#: The same, past the model host, with the waveform's sample rate: (index, waveform, rate).
RateReady = Callable[[int, Waveform, int], None]
#: Asked while a call runs for segments that join it (an empty list: none now); theirs are numbered after the call's.
Arrivals = Callable[[], "list[SynthesisRequest]"]


@dataclass(frozen=True)
class Piece:
    """One fragment of a segment's audio as its engine made it; a segment's pieces, joined, are its waveform."""

    number: int  # its place in the segment, from 0
    samples: Waveform
    last: bool  # the segment's waveform follows at once


#: Told each item's fragments in order, as they are made: (its index in the batch, the fragment).
Fragment = Callable[[int, Piece], None]
#: The same, past the model host, with the sample rate: (index, fragment, rate).
RateFragment = Callable[[int, Piece, int], None]
#: Told one segment's fragments and their rate, in order, as they are made.
SegmentFragment = Callable[[Piece, int], None]


@dataclass(frozen=True)
class SynthesisRequest:
    """One segment to synthesise: everything that determines its audio."""

    text: str
    voice: str | None = None
    speed: float = 1.0
    seed: int | None = None
    mode: str = "balanced"
    #: How long before its listener needs its first audio, in seconds: meanwhile an engine that cuts fragments may
    #: decode several in one call, which costs less. It changes when fragments come, never the audio.
    slack_s: float = 0.0
    #: Its listener is already playing the job's earlier audio: its first fragment need not be the short one.
    playing: bool = False


def expect_one_per_input(outputs: Sized, inputs: Sized, *, what: str, unit: str = "waveforms") -> None:
    """Raise SynthesisError unless ``what`` gave exactly one output (a waveform, unless ``unit`` says) per input."""
    if len(outputs) != len(inputs):
        raise SynthesisError(f"{what} returned {len(outputs)} {unit} for {len(inputs)} inputs")


def every_one_made(waves: list[Waveform | None], *, what: str) -> list[Waveform]:
    """Return ``waves`` (one slot per input, filled as each item was made); raise SynthesisError if any is empty."""
    missing = [index for index, wave in enumerate(waves) if wave is None]
    if missing:
        raise SynthesisError(f"{what} made no waveform for input(s) {missing} of {len(waves)}")
    return [wave for wave in waves if wave is not None]


class Engine(abc.ABC):
    """Load a model, synthesise batches of segments, unload it.

    Engines are not thread-safe: the caller serialises calls to one instance.
    """

    #: Output sample rate in Hz; valid once ``load`` has returned.
    sample_rate: int

    #: How segments are cut into fragments (``set_fragments``); engines that cannot stream ignore it.
    fragment_schedule: FragmentSchedule = NO_FRAGMENTS

    def set_fragments(self, schedule: FragmentSchedule) -> None:
        """Cut each segment's audio into fragments on ``schedule``, where the engine can (each is one otherwise)."""
        self.fragment_schedule = schedule

    def set_graphs(self, mode: str) -> None:  # noqa: B027 (a hook most engines need not override)
        """Capture the decode step as CUDA graphs: ``auto``, ``on`` or ``off`` (engines without one ignore it)."""

    @property
    def decode_path(self) -> str:
        """Say how a decode step runs once loaded (for the startup log and ``/readyz``)."""
        return "eager"

    @property
    def takes_arrivals(self) -> bool:
        """Say whether segments can join a call while it runs (``synthesize_each``'s ``arrivals``)."""
        return False

    @abc.abstractmethod
    def load(self) -> None:
        """Load the model into memory on the engine's device."""

    @abc.abstractmethod
    def synthesize(self, batch: list[SynthesisRequest]) -> list[Waveform]:
        """Return exactly one mono float32 waveform per request, in order."""

    def synthesize_each(
        self,
        batch: list[SynthesisRequest],
        ready: Ready,
        arrivals: Arrivals | None = None,
        fragment: Fragment | None = None,
    ) -> list[Waveform]:
        """Do what ``synthesize`` does, and tell ``ready`` each item's waveform as soon as it is made.

        An engine whose items finish at different times (ChatTTS: each at its own length) overrides this, so
        that a short segment's listener is not kept waiting for the longest segment of its batch. Here every
        item is told when the whole batch is done. An engine that ``takes_arrivals`` asks ``arrivals`` for
        more segments while it runs, and makes them in the same call (numbered after the batch, in order).
        ``fragment`` is told each item's fragments before its waveform, which they make when joined: here one,
        the whole waveform; an engine that streams cuts them on its ``fragment_schedule`` as it makes them.
        """
        waves = self.synthesize(batch)
        expect_one_per_input(waves, batch, what=type(self).__name__)
        for index, wave in enumerate(waves):
            if fragment is not None:
                fragment(index, Piece(0, wave, last=True))
            ready(index, wave)
        return waves

    def unload(self) -> None:  # noqa: B027  (optional hook: most engines free memory when dropped)
        """Release the model's memory."""

    def memory_estimate_mb(self) -> int:
        """Return the estimated resident size of the loaded model in MiB."""
        return 0

    def warmup(self) -> None:
        """Run one throwaway synthesis so the first real call is not slow."""
        self.synthesize([SynthesisRequest(text="warm up")])
