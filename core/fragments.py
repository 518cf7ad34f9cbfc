"""Fragments of a segment's audio: how long each is, engine-neutral (milliseconds) and in an engine's tokens."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class FragmentSizes:
    """A schedule in tokens: the first fragment, the steady ones, and the shortest a segment's last may be."""

    first: int
    steady: int
    least: int

    @property
    def streams(self) -> bool:
        """Say whether segments are cut at all (off: each segment is one fragment)."""
        return self.steady > 0


#: Each segment is one fragment.
WHOLE = FragmentSizes(0, 0, 0)


@dataclass(frozen=True)
class FragmentSchedule:
    """Fragment sizes in milliseconds of audio, engine-neutral; ``steady_ms`` 0 turns fragments off."""

    first_ms: float = 150.0
    steady_ms: float = 400.0
    least_ms: float = 200.0

    @classmethod
    def parse(cls, text: str) -> FragmentSchedule:
        """Read ``"first,steady"`` or ``"first,steady,least"`` (milliseconds), or ``"off"``/``"0"``."""
        if text.strip().lower() in ("off", "0", ""):
            return cls(0.0, 0.0, 0.0)  # NO_FRAGMENTS
        wrong = f"a fragment schedule is 'first,steady[,least]' in ms, each above 0, or 'off': not {text!r}"
        try:
            parts = [float(p) for p in text.split(",")]
        except ValueError as e:
            raise ValueError(wrong) from e
        if not 2 <= len(parts) <= 3 or min(parts) <= 0:
            raise ValueError(wrong)
        least = parts[2] if len(parts) == 3 else min(parts[1], cls.least_ms)  # the first may be shorter
        if least > parts[1]:
            raise ValueError(f"the shortest fragment ({least:g} ms) cannot be longer than the steady one")
        return cls(parts[0], parts[1], least)

    @property
    def streams(self) -> bool:
        """Say whether segments are cut into fragments."""
        return self.steady_ms > 0

    def in_tokens(self, token_ms: float) -> FragmentSizes:
        """Return the schedule for an engine whose tokens last ``token_ms`` each."""
        if not self.streams:
            return WHOLE
        return FragmentSizes(
            first=max(1, round(self.first_ms / token_ms)),
            steady=max(1, round(self.steady_ms / token_ms)),
            least=max(1, math.ceil(self.least_ms / token_ms)),
        )


#: Each segment is one fragment: its whole audio, when it is made.
NO_FRAGMENTS = FragmentSchedule(0.0, 0.0, 0.0)


def model_schedule(default: FragmentSchedule, own: str | None) -> FragmentSchedule:
    """Return a model's schedule: its own (models.json's ``fragment_ms``) over ``default``, unless ``default`` is
    off (TTS_FRAGMENT_MS=off turns fragments off for every model)."""
    if own is None or not default.streams:
        return default
    return FragmentSchedule.parse(own)
