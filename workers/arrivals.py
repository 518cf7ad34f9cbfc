"""Learn at once when another worker writes a job's first segment, for the job's later segments waiting here.

A later segment read before its job's first segment was written has no listener start to count from: its
deadline follows the clock (``core.schedule.Timeline``), and it is not early. When this worker makes segment 0
too, it records the arrival on the shared timeline itself. When another worker does, this one would learn of it
only when another segment of the job starts here, or never (the deadline stops following the clock after
``UNSTARTED_LIMIT_S``). Meanwhile, under load, the segment waits behind everything due before now, and its
listener, already playing, stalls, which one worker alone never does (``make bench-workers`` compares them).

One thread per worker follows the event streams of those jobs, with one blocked ``XREAD`` for all of them (as
``cache/events.py`` does for the API's waiters), and records segment 0's arrival on the timeline as soon as its
``segment`` event is written. A follow ends with that event, with the job, or after ``limit_s``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from cache import keys
from cache.job_reads import as_str
from cache.records import TERMINAL
from core.loops import OnDemandLoop
from core.schedule import UNSTARTED_LIMIT_S, Timeline, heard_at

log = logging.getLogger(__name__)

#: How long the loop rests after Redis failed, before it tries again.
RETRY_S = 0.5

#: Reads one written segment's metadata (``JobReads.segment_meta_one``): its ``finished_at`` and ``duration_s``.
ReadMeta = Callable[[str, int], dict[str, Any]]


@dataclass
class _Follow:
    timeline: Timeline
    stretch: float  # the job's lane stretches playback (core.schedule.DeadlinePolicy.stretch)
    since: float  # time.monotonic() when it began
    after: str = "0-0"  # the newest event read


class FirstArrivals:
    """Follow the jobs whose later segments wait here until their first segment is written, by any worker."""

    def __init__(
        self,
        client: redis.Redis,
        read_meta: ReadMeta,
        *,
        block_ms: int = 250,
        limit_s: float = UNSTARTED_LIMIT_S,
        idle_s: float = 5.0,
    ) -> None:
        self.redis = client
        self.read_meta = read_meta
        self.block_ms = block_ms  # a follow begun while the loop is blocked joins the next round: this much later
        self.limit_s = limit_s
        self.idle_s = idle_s
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._follows: dict[str, _Follow] = {}
        self._loop = OnDemandLoop("first-arrivals", self._lock, self._round, lambda: bool(self._follows))

    def follow(self, job_id: str, timeline: Timeline, *, stretch: float) -> None:
        """Record segment 0's arrival on ``timeline`` once it is written, unless the timeline knows it already."""
        if timeline.started():
            return
        with self._lock:
            if job_id in self._follows:
                return
            self._follows[job_id] = _Follow(timeline, stretch, time.monotonic())
            self._loop.start()
            self._changed.notify()

    def forget(self, job_id: str) -> None:
        """Stop following a job (it finished here)."""
        with self._lock:
            self._follows.pop(job_id, None)

    def following(self) -> int:
        """Return how many jobs are followed."""
        with self._lock:
            return len(self._follows)

    def _round(self) -> bool:
        with self._lock:
            self._prune()
            if not self._follows:
                self._changed.wait(self.idle_s)
                self._prune()
            if not self._follows:
                return False
            jobs = {keys.events(job_id): job_id for job_id in self._follows}
            streams = {key: self._follows[job_id].after for key, job_id in jobs.items()}
        try:
            reply = self.redis.xread(streams, count=64, block=self.block_ms)  # type: ignore[arg-type]
            self._read(reply, jobs)
        except Exception as e:  # the deadlines only follow the clock a while longer; the loop goes on
            log.warning("first arrivals: reading %d event streams failed: %s", len(streams), e)
            time.sleep(RETRY_S)
        return True

    def _prune(self) -> None:
        """Drop the follows that are over: segment 0 recorded (by this worker's own write, or by this follower), or
        followed too long."""
        now = time.monotonic()
        for job_id, f in list(self._follows.items()):
            if f.timeline.started() or now - f.since > self.limit_s:
                del self._follows[job_id]

    def _read(self, reply: Any, jobs: dict[str, str]) -> None:
        """Take a round's events (``jobs``: each stream's job): segment 0 written, or the job ended."""
        for raw_key, entries in reply.items() if isinstance(reply, dict) else reply or []:
            job_id = jobs[as_str(raw_key)]
            with self._lock:
                found = self._follows.get(job_id)
            if found is None:
                continue
            for raw_id, fields in entries:
                event = {as_str(k): as_str(v) for k, v in fields.items()}
                if event.get("type") == "fragment" and event.get("index") == "0" and event.get("fragment") == "0":
                    # Its listener starts with segment 0's first fragment; the duration comes with a later start.
                    found.timeline.arrived(0, float(event.get("at") or time.time()))
                    self.forget(job_id)
                    break
                if event.get("type") == "segment" and event.get("index") == "0":
                    self._arrived(job_id, found)  # a Redis fault here: the event is read again next round
                    break
                if event.get("type") == "status" and event.get("status") in TERMINAL:
                    self.forget(job_id)
                    break
                found.after = as_str(raw_id)

    def _arrived(self, job_id: str, found: _Follow) -> None:
        """Record segment 0's arrival, with its real duration, as the worker that wrote it recorded them."""
        meta = self.read_meta(job_id, 0)
        at = heard_at(meta, time.time())
        duration = meta.get("duration_s")
        found.timeline.arrived(0, at, None if duration is None else float(duration) * found.stretch)
        self.forget(job_id)
