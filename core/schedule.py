"""Playback deadlines: when each segment of a job is needed by its listener (plain functions, no I/O).

A listener needs segment 0 at once and segment k when it has finished playing segment k-1.
Durations are estimated from characters and the model's measured seconds of audio per
character until the real ones are known.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: Broker priority steps by slack (seconds until due): due now, soon, later, much later.
SLACK_STEPS: tuple[tuple[float, int], ...] = ((1.0, 0), (10.0, 3), (60.0, 6))
LAST_STEP = 9
#: How long a job's later deadlines keep moving with the clock while its first audio is unknown.
UNSTARTED_LIMIT_S = 30.0


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


class Timeline:
    """When a job's listener needs each segment, updated as segments arrive.

    The listener starts at segment 0's arrival and plays each segment for its duration; a
    segment that arrives late pauses it (a stall) and it resumes on arrival. Segment 0 is
    due at ``due0``; segment k is due when the listener finishes segment k-1. Unknown arrivals
    are assumed on time and unknown durations are estimated, so a stalled job's later
    deadlines move back with its listener, and late work does not pile up ahead of new work.
    """

    def __init__(
        self, *, due0: float, start_estimate: float, durations: Sequence[float], arrivals: Mapping[int, float]
    ) -> None:
        self.due0 = due0
        self.start_estimate = start_estimate
        self.durations = list(durations)  # seconds of (stretched) playback per segment
        self.arrivals = dict(arrivals)  # index → when the segment was written

    def arrived(self, index: int, at: float, duration: float | None = None) -> None:
        """Record that segment ``index`` was written at ``at`` (with its real, stretched duration)."""
        self.arrivals[index] = at
        if duration is not None and index < len(self.durations):
            self.durations[index] = duration

    def started(self) -> bool:
        """Say whether the listener is playing: segment 0 has arrived."""
        return 0 in self.arrivals

    def grow(self, newer: Timeline) -> None:
        """Take what another view of the job knows: the arrivals and durations of segments written (by other
        workers too) and, for a text stream that grew, the lengths of the segments this one lacks. Grown in place,
        so that every segment already waiting on this timeline sees the arrivals recorded on it from now on."""
        self.learn(newer.arrivals, {i: newer.durations[i] for i in newer.arrivals if i < len(newer.durations)})
        self.durations.extend(newer.durations[len(self.durations) :])

    def learn(self, arrivals: Mapping[int, float], durations: Mapping[int, float]) -> None:
        """Take what the store says of written segments: when they arrived, and their (stretched) durations."""
        for index, at in arrivals.items():
            self.arrivals.setdefault(index, at)
        for index, duration in durations.items():
            if index < len(self.durations):
                self.durations[index] = duration

    def deadline(self, index: int, now: float | None = None) -> float:
        """Return when the listener needs segment ``index``, as far as is known at ``now``."""
        if index == 0:
            return self.due0
        start = self.arrivals.get(0)
        if start is None:
            # Not started: no earlier than the estimate nor than now, but fixed after a while, in case
            # segment 0 was written by a worker that did not tell us (deadlines must not float forever).
            now = time.time() if now is None else now
            start = min(max(self.start_estimate, now), self.start_estimate + UNSTARTED_LIMIT_S)
        playing = start  # when the listener starts segment j
        durations = self.durations
        if index > len(durations):  # a text stream's segment this view has no length of yet: like the others
            typical = sum(durations) / len(durations) if durations else 0.0
            durations = [*durations, *[typical] * (index - len(durations))]
        for j in range(1, index + 1):
            need = playing + durations[j - 1]
            if j == index:
                return need
            arrived = self.arrivals.get(j)
            playing = need if arrived is None else max(need, arrived)
        raise AssertionError("unreachable")

    def deadlines(self, now: float | None = None) -> list[float]:
        """Return every segment's deadline."""
        return [self.deadline(i, now) for i in range(len(self.durations))]


def timeline(
    *,
    lane: str,
    accepted_at: float,
    chars: Sequence[int],
    seconds_per_char: float,
    policy: DeadlinePolicy,
    durations: Mapping[int, float] | None = None,
    arrivals: Mapping[int, float] | None = None,
) -> Timeline:
    """Return a job's timeline: real ``durations`` and ``arrivals`` of written segments replace estimates."""
    durations = durations or {}
    stretch = policy.stretch(lane)
    due0 = accepted_at + policy.delay(lane)
    return Timeline(
        due0=due0,
        start_estimate=due0 + policy.first_audio_s,
        durations=[stretch * durations.get(i, n * seconds_per_char) for i, n in enumerate(chars)],
        arrivals=arrivals or {},
    )


def heard_at(meta: Mapping[str, Any], default: float) -> float:
    """Return when a written segment's listener could start it (its first fragment), from its stored metadata."""
    return float(meta.get("first_at", meta.get("finished_at", default)))


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


def admission_excess(
    now: float,
    ahead: Sequence[float],
    new: Sequence[float],
    *,
    segment_s: float,
    allowance_s: float,
    by_deadline: bool,
    before: int = 0,
    call_s: float = 0.0,
    margin_s: float = 0.0,
) -> float:
    """Return by how many seconds admitting ``new`` would delay some listener past ``allowance_s``; 0 if it would not.

    ``ahead`` are the deadlines of segments already admitted and ``new`` those of a job asking to be; ``before``
    more admitted segments run ahead of all of them (overdue ones, or under FIFO those beyond the horizon). The
    engines make one segment every ``segment_s`` seconds (their measured capacity), each heard ``call_s`` after its turn
    comes (as long as an engine call, which makes a whole batch at once, takes to its first fragments: a listener
    plays a segment from its first fragment), earliest deadline first, or under
    FIFO the admitted ones first and the new job last: the scheduler's own order and deadlines.

    Admitting the job may delay none of the admitted segments past its deadline (or, if it is late anyway,
    past when it would be made without the new job): a stream that is playing is never made to wait for a
    newcomer, and one that is already late closes the door only to jobs that would run before it. The new
    job's own segments may be made up to ``allowance_s`` later than on an idle service. The excess is the
    longest overrun: the seconds of work the engines must clear before the job fits, an honest Retry-After.

    With ``margin_s``, every segment the job would delay, and the job's own, must be left that much to spare:
    the excess then counts from ``margin_s`` before each limit (segments it does not delay are not weighed).
    """
    tagged = sorted([(d, False) for d in ahead], key=lambda x: x[0])
    mine = [(d, True) for d in new]
    order = sorted(tagged + mine, key=lambda x: x[0]) if by_deadline else tagged + mine
    worst = 0.0
    ranks = {False: before, True: 0}  # each kind's own position: where it would run without the other kind
    for position, (due, is_new) in enumerate(order, start=before + 1):
        ranks[is_new] += 1
        late = now + position * segment_s + call_s - due
        anyway = now + ranks[is_new] * segment_s + call_s - due
        spare = margin_s if is_new or late > anyway else 0.0
        worst = max(worst, late - max(0.0, anyway) - (allowance_s if is_new else 0.0) + spare)
    return worst
