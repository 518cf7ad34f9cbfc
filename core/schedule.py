"""Playback deadlines: when each segment of a job is needed by its listener (plain functions, no I/O).

A listener needs segment 0 at once and segment k when segments 0..k-1 have finished playing:
the job's first-audio time plus their durations. Durations are estimated from characters and
the model's measured seconds of audio per character until the real ones are known.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: Broker priority steps by slack (seconds until due): due now, soon, later, much later.
SLACK_STEPS: tuple[tuple[float, int], ...] = ((1.0, 0), (10.0, 3), (60.0, 6))
LAST_STEP = 9


@dataclass(frozen=True)
class DeadlinePolicy:
    """How deadlines are set for each lane (see the README's "Scheduling" section)."""

    #: Realtime: expected time from acceptance to the first audio, the listener's start until it is known.
    first_audio_s: float = 1.0
    #: Batch lane: segment 0 is due this long after acceptance instead of at once.
    batch_delay_s: float = 60.0
    #: Batch lane: the listener is assumed this many times slower than real time.
    batch_stretch: float = 2.0

    def delay(self, lane: str) -> float:
        """Return how long after acceptance a job's segment 0 is due."""
        return self.batch_delay_s if lane == "batch" else 0.0

    def stretch(self, lane: str) -> float:
        """Return the factor applied to audio durations between deadlines."""
        return self.batch_stretch if lane == "batch" else 1.0


@dataclass(frozen=True)
class Timeline:
    """A job's deadlines: segment 0 at ``due0``, segment k at the listener's start plus ``offsets[k]``."""

    due0: float
    #: When the listener starts: segment 0's real arrival once known, else the policy's estimate.
    start: float
    #: Seconds of (stretched) playback before each segment: 0 for segment 0.
    offsets: tuple[float, ...]
    #: Whether ``start`` is segment 0's real arrival rather than an estimate.
    start_known: bool = False

    def deadline(self, index: int, start: float | None = None) -> float:
        """Return segment ``index``'s deadline, with ``start`` (a newer first-audio time) if given."""
        if index == 0:
            return self.due0
        return (self.start if start is None else start) + self.offsets[index]

    def deadlines(self) -> list[float]:
        """Return every segment's deadline."""
        return [self.deadline(i) for i in range(len(self.offsets))]


def timeline(
    *,
    lane: str,
    accepted_at: float,
    chars: Sequence[int],
    seconds_per_char: float,
    policy: DeadlinePolicy,
    durations: Mapping[int, float] | None = None,
    first_audio_at: float | None = None,
) -> Timeline:
    """Return a job's timeline.

    ``durations`` holds the real durations of finished segments and ``first_audio_at``
    when segment 0 was written; both replace estimates when given.
    """
    durations = durations or {}
    due0 = accepted_at + policy.delay(lane)
    stretch = policy.stretch(lane)
    start = first_audio_at if first_audio_at is not None else due0 + policy.first_audio_s
    offsets: list[float] = []
    played = 0.0
    for index, n in enumerate(chars):
        offsets.append(stretch * played)
        played += durations.get(index, n * seconds_per_char)
    return Timeline(due0=due0, start=start, offsets=tuple(offsets), start_known=first_audio_at is not None)


def priority_step(deadline: float, now: float) -> int:
    """Map a deadline to a broker priority step (lower is popped first); the worker orders exactly."""
    slack = deadline - now
    for limit, step in SLACK_STEPS:
        if slack <= limit:
            return step
    return LAST_STEP


def playback_stalls(finished: Sequence[float], durations: Sequence[float]) -> tuple[int, float]:
    """Simulate a listener who starts at segment 0's arrival; return (stalls, total stalled seconds).

    Segment k plays as soon as it has arrived and segment k-1 has finished playing; a stall is
    every time it had not arrived yet.
    """
    if not finished:
        return 0, 0.0
    stalls, stalled = 0, 0.0
    clock = finished[0] + durations[0]  # when the listener has played everything so far
    for arrived, duration in zip(finished[1:], durations[1:], strict=True):
        if arrived > clock:
            stalls += 1
            stalled += arrived - clock
            clock = arrived
        clock += duration
    return stalls, stalled
