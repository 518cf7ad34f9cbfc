"""Open-loop callers: jobs arrive as a Poisson process whatever the service's state, each followed as a listener.

A closed loop waits for a job before sending the next, so its load can never exceed capacity for long. Real
traffic does not wait: here arrivals are planned up front, at exponential intervals, and each one is a thread that
submits its job at its time and follows it to its end (or is refused at the door and, once, retries after the
Retry-After it was given, as a well-behaved client does).
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field

from bench.loadgen import Client, JobResult

#: A gap in playback longer than this is an underrun a listener hears (vLLM-Omni's continuity threshold).
UNDERRUN_S = 0.1
#: A window's arrivals start this long after the call, once every listener's thread is set up.
LEAD_S = 0.5
#: A refused job retries once after its Retry-After, unless that is longer than this.
RETRY_AFTER_MAX_S = 10.0


@dataclass
class Arrival:
    """One planned job: when it arrives, its lane, its length, and what its listener saw (and its retry's)."""

    at: float
    lane: str
    chars: int = 0
    first: JobResult | None = None
    retry: JobResult | None = None

    @property
    def admitted(self) -> JobResult | None:
        """Return the attempt that was let in, if one was."""
        for attempt in (self.first, self.retry):
            if attempt is not None and attempt.refused is None:
                return attempt
        return None


@dataclass
class OpenRun:
    """Every arrival of one rate's window, and the window (monotonic seconds)."""

    rate: float
    window_start: float
    window_end: float
    arrivals: list[Arrival] = field(default_factory=list)
    unfinished: int = 0


def arrival_times(rate: float, window_s: float, rng: random.Random) -> list[float]:
    """Return the offsets (seconds from the window's start) of a Poisson process of ``rate`` per second, given that
    it brings ``rate`` × ``window_s`` arrivals (rounded).

    Such a process puts its arrivals uniformly at random in the window, so the gaps are as bursty as ever
    (exponential), but every window offers the rate asked. Unconditioned, one 20 s window at 5 arrivals/s brought
    57 to 114 arrivals by seed, and in one run the rates 0.75×, 0.85× and 1× the capacity brought 78 each.
    """
    return sorted(rng.uniform(0.0, window_s) for _ in range(round(rate * window_s)))


def lanes(count: int, batch_share: float, rng: random.Random) -> list[str]:
    """Return the lane of each of ``count`` arrivals: every (1 / ``batch_share``)-th is "batch", from a seeded start.

    Spread evenly, not drawn one by one, so that each window carries its share: one long text is many arrivals'
    work, and drawing each arrival's lane at random made the characters offered in a 20 s window differ from the
    rate asked by up to 36%.
    """
    every = max(1, round(1 / batch_share)) if batch_share > 0 else 0
    first = rng.randrange(every) if every else -1
    return ["batch" if every and n % every == first else "realtime" for n in range(count)]


def waits(result: JobResult) -> list[float]:
    """Return, per segment, how long a listener who plays from the first audio on waits for it (0 when it is
    there in time; the first is never waited for); empty before any audio."""
    if result.first_audio is None or not result.segments:
        return []
    clock = result.first_audio + result.segments[0][1]
    found = [0.0]
    for ready, duration in result.segments[1:]:
        found.append(max(0.0, ready - clock))
        clock = max(clock, ready) + duration
    return found


def gaps(result: JobResult) -> list[float]:
    """Return every wait for a segment not there yet, for a listener who plays from the first audio on."""
    return [w for w in waits(result) if w > 0]


def run_open_loop(
    clients: dict[str, Client],
    texts: dict[str, list[tuple[str, int]]],
    *,
    rate: float,
    window_s: float,
    drain_s: float,
    seed: int,
    batch_share: float,
) -> OpenRun:
    """Send Poisson arrivals at ``rate`` for ``window_s``; a ``batch_share`` of them, spread evenly (``lanes``), are
    long texts on the batch lane.

    ``clients`` and ``texts`` are keyed by lane ("realtime", "batch"). Returns once every job ended, or
    ``drain_s`` after the window (the rest are abandoned and counted unfinished).
    """
    rng = random.Random(seed)
    offsets = arrival_times(rate, window_s, rng)
    start = time.monotonic() + LEAD_S
    run = OpenRun(rate, start, start + window_s)

    over = threading.Event()  # the drain is over: no more retries

    def listen(arrival: Arrival, text: str, chars: int, job_seed: int) -> None:
        client = clients[arrival.lane]
        first = client.run_job(text, chars, job_seed)
        wait = first.retry_after
        if over.is_set():
            return  # came back after the drain: counted unfinished, and kept out of the figures
        arrival.first = first
        if first.refused is not None and wait is not None and wait <= RETRY_AFTER_MAX_S and not over.wait(wait):
            retry = client.run_job(text, chars, job_seed)  # the same request again: the service knows it
            if not over.is_set():
                arrival.retry = retry

    threads = []
    for n, (offset, lane) in enumerate(zip(offsets, lanes(len(offsets), batch_share, rng), strict=True)):
        text, chars = rng.choice(texts[lane])
        arrival = Arrival(start + offset, lane, chars)
        job_seed = seed * 1_000_000 + 2 * n + 1
        run.arrivals.append(arrival)
        delay = arrival.at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        thread = threading.Thread(target=listen, args=(arrival, text, chars, job_seed), daemon=True)
        thread.start()
        threads.append(thread)
    deadline = run.window_end + drain_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    over.set()
    run.unfinished = sum(1 for t in threads if t.is_alive())
    if run.unfinished:
        for client in clients.values():
            client.abandon_all()
        for thread in threads:  # let the abandoned ones end before the next rate starts
            thread.join(max(0.0, deadline + 30 - time.monotonic()))
    return run
