"""Closed-loop callers that follow each job as a listener would, and the listener's playback model.

The clients that run one job each, over HTTP, are in bench/http_clients.py.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Protocol

#: A gap shorter than this is float noise, not a stall a listener could hear.
STALL_EPSILON_S = 0.005


@dataclass
class JobResult:
    """What one caller saw of one job; times are time.monotonic() seconds."""

    chars: int
    submitted: float
    done: float | None = None
    first_audio: float | None = None
    #: (time the segment's audio was in the listener's hands, its duration in seconds), in order.
    segments: list[tuple[float, float]] = field(default_factory=list)
    error: str | None = None
    admissions: int = 0
    cached_segments: int = 0
    #: A refusal at the door (admission control), when the client does not retry it itself: status, Retry-After.
    refused: int | None = None
    retry_after: float | None = None
    #: Which admission check refused it, from the estimate its error body gives (None: not said).
    refused_by: str | None = None
    #: The job's id once admitted, to find it in the service's logs.
    job_id: str | None = None
    #: The service's estimate, when it admitted the job, of the seconds until its first segment starts.
    start_estimate_s: float | None = None
    #: When the service admitted it (time.monotonic()): after any refusals the client waited out.
    admitted: float | None = None

    @property
    def ok(self) -> bool:
        """Say whether the job finished with all its audio."""
        return self.error is None and self.done is not None

    def stall_s(self) -> float:
        """Return the total time a listener who starts at the first byte waits for the next segment."""
        return playback_stall(self.first_audio, self.segments)


def playback_stall(first_audio: float | None, segments: list[tuple[float, float]]) -> float:
    """Play each segment for its duration from the first byte on; sum the waits for a segment not there yet."""
    if first_audio is None or not segments:
        return 0.0
    clock = first_audio + segments[0][1]
    stalled = 0.0
    for ready, duration in segments[1:]:
        if ready > clock + STALL_EPSILON_S:
            stalled += ready - clock
            clock = ready
        clock += duration
    return stalled


class Client(Protocol):
    """Anything that runs one job to its end and reports what a listener saw."""

    def run_job(self, text: str, chars: int, seed: int) -> JobResult:
        """Submit ``text`` and follow it to its end."""
        ...

    def abandon_all(self) -> None:
        """Give up on every job still being followed, if the server allows it."""
        ...


@dataclass
class LevelRun:
    """Every job one level's callers ran, and the measuring window (monotonic seconds)."""

    callers: int
    window_start: float
    window_end: float
    results: list[JobResult]
    unfinished: int


def run_closed_loop(
    client: Client,
    texts: list[tuple[str, int]],
    *,
    callers: int,
    warmup_s: float,
    window_s: float,
    drain_s: float,
    seed: int = 0,
) -> LevelRun:
    """Run ``callers`` threads that each submit a job as soon as the last one ended, until the window closes."""
    start = time.monotonic()
    window_start, window_end = start + warmup_s, start + warmup_s + window_s
    results: list[JobResult] = []
    lock = threading.Lock()
    seeds = itertools.count(seed * 1_000_000 + 1)
    in_flight: dict[int, float] = {}

    def caller(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        while time.monotonic() < window_end:
            text, chars = rng.choice(texts)
            with lock:
                job_seed = next(seeds)
                in_flight[index] = time.monotonic()
            result = client.run_job(text, chars, job_seed)
            with lock:
                results.append(result)
                in_flight.pop(index, None)

    threads = [threading.Thread(target=caller, args=(i,), daemon=True, name=f"caller-{i}") for i in range(callers)]
    # Spread the first submissions over a few milliseconds rather than one instant.
    for thread in threads:
        thread.start()
        time.sleep(0.002)
    deadline = window_end + drain_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    with lock:
        unfinished = sum(1 for t in in_flight.values() if window_start <= t <= window_end)
        stuck = bool(in_flight)
        finished = list(results)  # taken before cancelling, so a cancelled job is counted once, as unfinished
    if stuck:
        client.abandon_all()
    return LevelRun(callers, window_start, window_end, finished, unfinished)
