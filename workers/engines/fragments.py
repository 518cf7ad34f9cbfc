"""One segment's audio in fragments, cut as its tokens are made, each decoded over a window of context.

ChatTTS's decoder and vocoder are convolutions that see both ways: a fragment decoded on its own differs from
the same stretch of the whole segment's decode at its edges. So each fragment is decoded over a window, some
tokens of left context, its own tokens and some of lookahead, and only its own tokens' samples are kept: the
work stays linear in the segment's length (no prefix is decoded again), and with context at least the decoder's
receptive field the fragments equal the whole decode. ``make bench-fragments`` measures the joins' error for each
choice of context and lookahead; the defaults come from there. An optional crossfade blends a fragment's first
samples with the previous window's decode of them (its lookahead), which the previous fragment did not emit.

Fragment sizes follow a schedule in milliseconds of audio: a short first one, so that a listener hears audio
after a few tokens, then steady ones. Each is decoded the step it is complete unless its listener already has more
than ``lead_s`` of the item's audio in hand (an engine far faster than real time, or a segment needed only later):
then they wait, to be decoded together in one call, which costs little more than one of them alone. The last of a
segment is never shorter than ``least`` (the remainder is held back that long) unless the segment is, and never
longer than the steady size (a longer remainder is cut in two).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

from core.fragments import WHOLE, FragmentSchedule, FragmentSizes

__all__ = ["WHOLE", "FragmentSchedule", "FragmentSizes", "TokenFragments", "Window"]

Samples = npt.NDArray[np.float32]
#: Decodes hidden states (tokens, hidden size) into the samples they make: ``SAMPLES_PER_TOKEN`` a token, less the
#: vocoder's last half hop (ChatTTS's ``istft(center=True)`` returns one hop fewer than it has frames).
Decode = Callable[[torch.Tensor], Samples]

#: ChatTTS: 2 mel frames a token, 256 samples a frame at 24 kHz: 21.3 ms of audio a token.
SAMPLES_PER_TOKEN = 512
#: A decode of n tokens has this many samples fewer than n tokens' worth (half a token: the last frame's hop).
DECODE_SHORTFALL = 256


@dataclass(frozen=True)
class Window:
    """What a fragment is decoded with: left context and lookahead in tokens, and a crossfade in samples.

    ``first_lookahead`` (default: ``lookahead``) is the first fragment's: every token of it is a decode step
    before a listener hears anything, so a smaller one trades a little of one join's accuracy for first audio.
    """

    context: int = 8
    lookahead: int = 8
    crossfade: int = 0
    first_lookahead: int | None = None

    def __post_init__(self) -> None:
        if self.context < 0 or min(self.lookahead, self.opening_lookahead) < 1:
            raise ValueError("a fragment window needs context >= 0 and lookahead >= 1 token")
        # The crossfade blends in what the previous window decoded past its fragment: its lookahead, less the
        # vocoder's shortfall at the window's end.
        room = min(self.lookahead, self.opening_lookahead) * SAMPLES_PER_TOKEN - DECODE_SHORTFALL
        if not 0 <= self.crossfade <= room:
            raise ValueError("a crossfade must fit in the lookahead")

    @property
    def opening_lookahead(self) -> int:
        """Return the first fragment's lookahead."""
        return self.lookahead if self.first_lookahead is None else self.first_lookahead


class TokenFragments:
    """One item's fragments: told its hidden states as they grow, it hands out each fragment's samples once.

    The fragments, joined, are the item's audio: ``SAMPLES_PER_TOKEN`` per token, less ``DECODE_SHORTFALL``.
    """

    def __init__(
        self,
        sizes: FragmentSizes,
        window: Window,
        decode: Decode,
        *,
        lead_s: float = 0.0,
        slack_s: float = 0.0,
        opening: bool = True,
        sample_rate: int = 24000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sizes = sizes
        self.window = window
        self.decode = decode
        # A listener with more than ``lead_s`` of this item's audio in hand, or as long before it needs the item at
        # all (``slack_s`` from now), does not need the next fragment yet: fragments then wait, to be decoded
        # together, in one call that costs far less than one each. 0: each is decoded the step it is complete.
        self.lead_s = lead_s
        # Only a listener waiting for a job's first words gets the short first fragment, and its short lookahead.
        waited_for = opening and slack_s <= 0
        if not waited_for:
            self.sizes = dataclasses.replace(sizes, first=sizes.steady)
        self._first_lookahead = window.opening_lookahead if waited_for else window.lookahead
        self.sample_rate = sample_rate
        self.clock = clock
        self.emitted = 0  # tokens whose samples are out
        self.count = 0  # fragments out
        self._samples_out = 0
        self._needed = clock() + slack_s  # when its listener needs its first audio
        self._tail: Samples | None = None  # the last window's decode of the samples just past its fragment

    def _size(self, count: int) -> int:
        return self.sizes.first if count == 0 else self.sizes.steady

    def _lookahead(self, count: int) -> int:
        return self._first_lookahead if count == 0 else self.window.lookahead

    def _hold(self, count: int) -> int:
        """Return the tokens a fragment waits for beyond its own: its lookahead, and after the first, room for a
        last fragment of at least ``least``."""
        return self._lookahead(0) if count == 0 else max(self.window.lookahead, self.sizes.least)

    def _complete(self, tokens: int) -> list[int]:
        """Return the sizes of the fragments ``tokens`` hidden states complete, beyond those out."""
        pieces: list[int] = []
        emitted, count = self.emitted, self.count
        while tokens - emitted >= self._size(count) + self._hold(count):
            pieces.append(self._size(count))
            emitted += pieces[-1]
            count += 1
        return pieces

    def _ahead_s(self) -> float:
        """Return how far its listener is from running out: the audio out, less what it played since it needed it."""
        return self._samples_out / self.sample_rate + self._needed - self.clock()

    def grown(self, hidden: torch.Tensor) -> list[Samples]:
        """Return the fragments the item's hidden states so far (tokens, hidden size) complete (often none)."""
        if not self.sizes.streams:
            return []
        pieces = self._complete(len(hidden))
        if not pieces:
            return []
        if self.lead_s and self._ahead_s() > self.lead_s:
            return []  # its listener has enough: decode them together later
        return self._cut(hidden, pieces, final=False)

    def ended(self, hidden: torch.Tensor) -> list[Samples]:
        """Return the item's remaining fragments, given all of its hidden states."""
        pieces: list[int] = []
        left = len(hidden) - self.emitted
        if self.sizes.streams:
            size = self._size(self.count)
            while left > size + self.sizes.least:
                pieces.append(size)
                left -= size
                size = self.sizes.steady
            if left > self.sizes.steady:  # cut in two rather than one fragment longer than the steady size
                pieces.append(left // 2)
                left -= left // 2
        if left > 0 or (not pieces and self.count == 0):
            pieces.append(left)
        return self._cut(hidden, pieces, final=True) if pieces else []

    def _cut(self, hidden: torch.Tensor, pieces: list[int], *, final: bool) -> list[Samples]:
        """Decode one window around the next ``pieces`` (token counts); return each one's samples, the first
        crossfaded in."""
        first = self.emitted
        last = first + sum(pieces)
        low = max(0, first - self.window.context)
        high = len(hidden) if final else last + self._lookahead(self.count + len(pieces) - 1)
        samples = self.decode(hidden.narrow(0, low, high - low))
        bounds = [(first - low) * SAMPLES_PER_TOKEN]
        for size in pieces:
            bounds.append(bounds[-1] + size * SAMPLES_PER_TOKEN)
        if final:
            bounds[-1] = len(samples)  # the decode's shortfall comes off the item's very end
        bounds = [min(b, len(samples)) for b in bounds]
        out = [np.array(samples[bounds[i] : bounds[i + 1]], dtype=np.float32) for i in range(len(pieces))]
        fade = self.window.crossfade
        if fade and self._tail is not None:
            head = out[0]
            n = min(fade, len(head), len(self._tail))
            ramp = np.linspace(0.0, 1.0, n + 2, dtype=np.float32)[1:-1]
            head[:n] = self._tail[:n] * (1 - ramp) + head[:n] * ramp
        stop = bounds[-1]
        self._tail = None if final else np.array(samples[stop : stop + fade], dtype=np.float32)
        self.emitted = last
        self.count += len(pieces)
        self._samples_out += sum(len(o) for o in out)
        return out
