"""Closed-loop callers that follow each job as a listener would, and the listener's playback model."""

from __future__ import annotations

import http.client
import itertools
import json
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import urlsplit

#: Answers that refuse work on purpose (admission control), to be retried after Retry-After.
ADMISSION_STATUSES = frozenset({429, 503})
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


class Http:
    """One keep-alive HTTP connection per thread, reopened once if the server closed an idle one."""

    def __init__(self, base_url: str, *, timeout_s: float) -> None:
        parts = urlsplit(base_url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.timeout_s = timeout_s
        self._local = threading.local()

    def connect(self) -> http.client.HTTPConnection:
        """Return a new connection (for a stream that keeps it busy)."""
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)

    def exchange(
        self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, http.client.HTTPMessage, bytes, float]:
        """Return status, headers, body and the monotonic time of the body's first byte."""
        for attempt in (0, 1):
            conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
            reused = conn is not None
            if conn is None:
                conn = self._local.conn = self.connect()
            try:
                conn.request(method, path, body=body, headers=headers or {})
                response = conn.getresponse()
                head = response.read(1)
                first = time.monotonic()
                data = head + response.read()
                if response.will_close:
                    conn.close()
                    self._local.conn = None
                return response.status, response.headers, data, first
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                conn.close()
                self._local.conn = None
                if not reused or attempt:
                    raise
        raise AssertionError("unreachable")


def sse_events(response: http.client.HTTPResponse) -> Iterator[tuple[str, str]]:
    """Yield (event, data) pairs from a server-sent-events response."""
    event, data = "message", []
    while True:
        raw = response.readline()
        if not raw:
            return
        line = raw.decode("utf-8").rstrip("\r\n")
        if not line:
            if data:
                yield event, "\n".join(data)
            event, data = "message", []
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())


class ServedClient:
    """Submit to the service, follow the job's SSE stream and fetch each segment as it is announced."""

    def __init__(
        self, base_url: str, *, model: str, cache: bool = False, fixed_seed: int | None = None, timeout_s: float = 300
    ) -> None:
        self.http = Http(base_url, timeout_s=timeout_s)
        self.model = model
        self.cache = cache
        self.fixed_seed = fixed_seed
        self.timeout_s = timeout_s
        self._following: dict[int, str] = {}
        self._lock = threading.Lock()

    def run_job(self, text: str, chars: int, seed: int) -> JobResult:
        """Submit ``text``, then play it as its segments arrive."""
        result = JobResult(chars=chars, submitted=time.monotonic())
        me = threading.get_ident()
        try:
            job = self._submit(text, seed, result)
            if job is not None:
                with self._lock:
                    self._following[me] = str(job["id"])
                result.cached_segments = int(str(job.get("cached_segments", 0)))
                self._follow(str(job["id"]), result)
        except (OSError, http.client.HTTPException, ValueError) as e:
            result.error = type(e).__name__
        finally:
            with self._lock:
                self._following.pop(me, None)
        return result

    def _submit(self, text: str, seed: int, result: JobResult) -> dict[str, object] | None:
        if self.fixed_seed is not None:
            seed = self.fixed_seed  # the same seed for every job, so repeated texts can hit the cache
        body = {"text": text, "model": self.model, "seed": seed, "cache": self.cache, "format": "wav"}
        payload = json.dumps(body, ensure_ascii=False).encode()
        deadline = result.submitted + self.timeout_s
        while True:
            status, headers, data, _ = self.http.exchange(
                "POST", "/v1/jobs", payload, {"Content-Type": "application/json"}
            )
            if status == 202:
                job: dict[str, object] = json.loads(data)
                return job
            retry_after = headers.get("Retry-After")
            if status in ADMISSION_STATUSES and retry_after is not None and time.monotonic() < deadline:
                result.admissions += 1
                time.sleep(min(5.0, max(0.05, float(retry_after))))
                continue
            result.error = f"POST {status}"
            return None

    def _follow(self, job_id: str, result: JobResult) -> None:
        conn = self.http.connect()
        try:
            conn.request("GET", f"/v1/jobs/{job_id}/events", headers={"Accept": "text/event-stream"})
            response = conn.getresponse()
            if response.status != 200:
                result.error = f"events {response.status}"
                return
            for event, data in sse_events(response):
                if event == "segment":
                    self._fetch(json.loads(data), result)
                    if result.error:
                        return
                elif event == "done":
                    result.done = time.monotonic()
                    return
                elif event in ("failed", "canceled", "expired"):
                    result.error = f"job {event}"
                    return
            result.error = "events ended early"
        finally:
            conn.close()

    def _fetch(self, segment: dict[str, object], result: JobResult) -> None:
        status, headers, _, first = self.http.exchange("GET", str(segment["url"]))
        if status != 200:
            result.error = f"segment {status}"
            return
        if segment["index"] == 0:
            result.first_audio = first
        result.segments.append((time.monotonic(), float(headers.get("X-Segment-Duration", 0.0))))

    def abandon_all(self) -> None:
        """Cancel every job still followed, so none takes the engine's time from the next level."""
        with self._lock:
            jobs = list(self._following.values())
        for job_id in jobs:
            conn = self.http.connect()
            try:
                conn.request("DELETE", f"/v1/jobs/{job_id}")
                conn.getresponse().read()
            except (OSError, http.client.HTTPException):
                pass
            finally:
                conn.close()


class BaselineClient:
    """Post the whole text to the synchronous server and read the whole WAV back."""

    def __init__(self, base_url: str, *, timeout_s: float = 600) -> None:
        self.http = Http(base_url, timeout_s=timeout_s)

    def run_job(self, text: str, chars: int, seed: int) -> JobResult:
        """Post ``text``; the answer is the audio, so the first byte comes when synthesis is over."""
        result = JobResult(chars=chars, submitted=time.monotonic())
        payload = json.dumps({"text": text, "seed": seed}, ensure_ascii=False).encode()
        try:
            status, headers, _, first = self.http.exchange(
                "POST", "/synthesize", payload, {"Content-Type": "application/json"}
            )
        except (OSError, http.client.HTTPException) as e:
            result.error = type(e).__name__
            return result
        if status != 200:
            result.error = f"POST {status}"
            return result
        result.done = time.monotonic()
        result.first_audio = first
        result.segments.append((result.done, float(headers.get("X-Audio-Duration", 0.0))))
        return result

    def abandon_all(self) -> None:
        """Do nothing: a synchronous request cannot be taken back."""


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
