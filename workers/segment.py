"""Synthesise one segment of one job and write it to the job store (plain, testable)."""

from __future__ import annotations

import contextlib
import enum
import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import Any

import redis

from cache import keys
from cache.jobstore import JobStore, SegmentStart, SegmentWrite, WriteResult
from cache.schedule import ScheduleBook
from cache.sentences import CachedSegment, SentenceCache, segment_keys
from cache.stats import Stats
from core.audio import PackedAudio, to_pcm16
from core.errors import StoreFull
from core.metrics import (
    AUDIO_SECONDS,
    CACHE_BYTES_STORED,
    JOB_STALL_SECONDS,
    JOB_STALLS,
    QUEUE_WAIT,
    REAL_TIME_FACTOR,
    SEGMENT_LATENESS,
    SEGMENT_REDELIVERIES,
    SEGMENTS,
    STORE_FULL_WAITS,
    TIME_TO_FIRST_SEGMENT,
)
from core.registry import Registry
from core.schedule import DeadlinePolicy, Timeline, playback_stalls, timeline
from workers.backend import SynthesisBackend
from workers.celery_app import Enqueue
from workers.engines.base import SynthesisRequest

log = logging.getLogger(__name__)


class Outcome(enum.Enum):
    """What became of one segment task."""

    WRITTEN = "written"
    DUPLICATE = "duplicate"
    SKIPPED = "skipped"
    GAVE_UP = "gave_up"


class Timelines:
    """The timelines of jobs this worker holds segments of, shared by those segments; oldest forgotten first."""

    def __init__(self, limit: int = 10_000) -> None:
        self._timelines: OrderedDict[str, Timeline] = OrderedDict()
        self._lock = threading.Lock()
        self._limit = limit

    def known(self, job_id: str) -> Timeline | None:
        """Return the job's shared timeline if this worker has one."""
        with self._lock:
            return self._timelines.get(job_id)

    def get(self, job_id: str, fresh: Timeline) -> Timeline:
        """Return the job's shared timeline, updated with what ``fresh`` (read from the store now) knows."""
        with self._lock:
            found = self._timelines.get(job_id)
            if found is None:
                found = self._timelines[job_id] = fresh
                while len(self._timelines) > self._limit:
                    self._timelines.popitem(last=False)
            else:
                found.merge(fresh)
            return found

    def forget(self, job_id: str) -> None:
        """Drop a finished job's timeline."""
        with self._lock:
            self._timelines.pop(job_id, None)


class SegmentSynthesizer:
    """Read a segment from the job store, synthesise it, write its audio once."""

    def __init__(
        self,
        *,
        store: JobStore,
        cache: SentenceCache,
        stats: Stats,
        enqueue: Enqueue,
        registry: Registry,
        backend: SynthesisBackend,
        max_attempts: int,
        worker: str,
        book: ScheduleBook,
        policy: DeadlinePolicy,
        use_deadlines: bool = True,
        wait_for_room: Callable[[float], bool] | None = None,
        room_wait_s: float = 60.0,
    ) -> None:
        self.store = store
        self.cache = cache
        self.stats = stats
        self.enqueue = enqueue
        self.registry = registry
        self.backend = backend
        self.max_attempts = max_attempts
        self.worker = worker
        self.book = book
        self.policy = policy
        self.use_deadlines = use_deadlines
        self.wait_for_room = wait_for_room  # blocks until the store has room (cache/budget.py), or says it timed out
        self.room_wait_s = room_wait_s
        self._timelines = Timelines()
        self._working_on: Counter[str] = Counter()
        self._working_lock = threading.Lock()

    def working_on(self) -> set[str]:
        """Return the segments (``keys.segment_member``) delivered to this worker and not yet let go."""
        with self._working_lock:
            return set(self._working_on)

    def received(self, job_id: str, index: int) -> bool:
        """Hold a delivered segment before a thread starts on it (a worker killed meanwhile hands it on too);
        say whether Redis has the hold (START_SEGMENT records it again)."""
        with self._working_lock:  # before Redis holds it: the janitor never finds it held and unowned
            self._working_on[keys.segment_member(job_id, index)] += 1
        try:
            self.store.hold(self.worker, job_id, index)
        except redis.RedisError:
            return False
        return True

    def _deliveries_here(self, member: str) -> int:
        with self._working_lock:
            return self._working_on[member]

    def let_go(self, job_id: str, index: int) -> None:
        """Forget a delivered segment whose task has ended (written, skipped, failed or retried)."""
        member = keys.segment_member(job_id, index)
        with self._working_lock:
            self._working_on[member] -= 1
            if self._working_on[member] <= 0:
                del self._working_on[member]

    def run(self, job_id: str, index: int, *, token: str | None = None) -> Outcome:
        """Make segment ``index`` of ``job_id`` unless it exists or its job is over.

        ``token`` names this delivery (see ``JobStore.start_segment``): a redelivery of the same attempt is
        not counted against the segment's attempts.
        """
        # One atomic read: the job, whether the segment exists, the attempt, its text, what is done (all of it
        # only when this worker does not know the job yet: a segment's start never reads the whole job).
        known = self._timelines.known(job_id) is not None
        start = self.store.start_segment(job_id, index, worker=self.worker, token=token, known=known)
        if start.state in ("gone", "over"):
            return Outcome.SKIPPED
        if start.state == "written":
            return Outcome.DUPLICATE
        if start.redelivered:
            SEGMENT_REDELIVERIES.inc()
            if self._deliveries_here(keys.segment_member(job_id, index)) > 1:
                # kombu put this message back (a lost connection) while its first delivery runs here: that one
                # writes the segment; making it twice would only double the work of a worker catching up.
                SEGMENTS.labels(Outcome.DUPLICATE.value).inc()
                return Outcome.DUPLICATE
        try:
            return self._make(job_id, index, start)
        except Exception:
            with contextlib.suppress(redis.RedisError):  # else the janitor finds the hold stale
                self.store.release(self.worker, job_id, index)
            raise

    def _make(self, job_id: str, index: int, start: SegmentStart) -> Outcome:
        """Synthesise a started segment, write it, and advance its job."""
        attempt, record = start.attempt, start.record
        if attempt > self.max_attempts:
            # A redelivery after crashes (the worker died each time): stop the loop.
            self.store.release(self.worker, job_id, index)
            self.store.fail(job_id, f"segment {index} was attempted {self.max_attempts} times without finishing")
            return Outcome.GAVE_UP
        request = start.request
        if request is None or start.text is None:
            self.store.release(self.worker, job_id, index)
            return Outcome.SKIPPED
        text = start.text
        QUEUE_WAIT.observe(max(0.0, time.time() - float(record["created_at"])))
        spec = self.registry.get(request.model)
        lane = request.priority
        plan = self._plan(job_id, start, lane)

        def due() -> float:  # moves with the job's listener as its earlier segments arrive
            return plan.deadline(index)

        started = time.perf_counter()
        wave, rate = self.backend.synthesize(
            spec,
            SynthesisRequest(text=text, voice=request.voice, speed=request.speed, seed=request.seed, mode=request.mode),
            deadline=(plan.due0 if index == 0 else due) if self.use_deadlines else None,
            early=index > 0,
        )
        synth_s = time.perf_counter() - started
        audio = self.store.pack(to_pcm16(wave), rate)  # encoded once: the store and the cache keep these bytes
        duration = len(wave) / rate
        finished = time.time()
        deadline = due()
        meta = {
            "duration_s": round(duration, 4),
            "synth_s": round(synth_s, 4),
            "worker": self.worker,
            "finished_at": round(finished, 4),
            "lateness_s": round(finished - deadline, 4),
        }
        write = self._write(job_id, index, audio, rate, {**meta, "attempt": attempt})
        outcome = _OUTCOMES[write.result]
        SEGMENTS.labels(outcome.value).inc()
        self.stats.record(ok=1)
        AUDIO_SECONDS.labels(spec.name).inc(duration)
        if outcome is Outcome.WRITTEN:
            plan.arrived(index, finished, duration * self.policy.stretch(lane))  # later segments here follow it
            SEGMENT_LATENESS.labels(lane).observe(finished - deadline)
            self.book.observe(spec.name, chars=len(text), audio_s=duration)
        if duration > 0:
            REAL_TIME_FACTOR.labels(spec.name).observe(synth_s / duration)
        if index == 0 and outcome is Outcome.WRITTEN:
            TIME_TO_FIRST_SEGMENT.observe(max(0.0, time.time() - float(record["created_at"])))
        if request.cache:
            key = segment_keys(spec, request, [text])[0]
            kept = {k: meta[k] for k in ("duration_s", "synth_s", "worker")}  # not this job's times
            CACHE_BYTES_STORED.inc(self.cache.put(key, CachedSegment(audio, rate, kept)))
        log.info(
            "segment %s/%d %s: %d chars, %.2fs audio in %.2fs",
            job_id,
            index,
            outcome.value,
            len(text),
            duration,
            synth_s,
            extra={
                "job_id": job_id,
                "segment": index,
                "chars": len(text),
                "audio_s": round(duration, 3),
                "synth_s": round(synth_s, 3),
                "outcome": outcome.value,
            },
        )
        if write.result is WriteResult.FINISHED:
            self._timelines.forget(job_id)
            self._log_job_done(job_id, lane)
        elif write.next_index is not None:
            self._feed_next(job_id, write.next_index, plan, lane)
        return outcome

    def _write(self, job_id: str, index: int, audio: PackedAudio, rate: int, meta: dict[str, Any]) -> SegmentWrite:
        """Write a made segment; while the store is at its memory limit, wait for room rather than lose the work.

        A full store is not the engine's fault: nothing is counted against the segment or the breaker. After
        ``room_wait_s`` the StoreFull error lets the task retry later, as the same attempt (workers/tasks.py).
        """
        waited_from = time.monotonic()
        while True:
            try:
                return self.store.write_segment(
                    job_id, index, audio, sample_rate=rate, meta=meta, worker=self.worker, advance=True
                )
            except redis.OutOfMemoryError as e:
                STORE_FULL_WAITS.inc()
                left = self.room_wait_s - (time.monotonic() - waited_from)
                if left <= 0 or self.wait_for_room is None or not self.wait_for_room(left):
                    raise StoreFull(f"the job store stayed at its memory limit for {self.room_wait_s:g} s") from e
                log.warning("job %s: the store is full; segment %d waits for room to be written", job_id, index)

    def _plan(self, job_id: str, start: SegmentStart, lane: str) -> Timeline:
        """Return the job's shared timeline: built from the whole record the first time, then kept up to date."""
        durations = {i: float(m["duration_s"]) for i, m in start.meta.items() if "duration_s" in m}
        arrivals = {i: float(m["finished_at"]) for i, m in start.meta.items() if "finished_at" in m}
        plan = self._timelines.known(job_id)
        if plan is not None:
            stretch = self.policy.stretch(lane)
            plan.learn(arrivals, {i: d * stretch for i, d in durations.items()})
            return plan
        # Only a start that said it knew the job lacks the lengths: the job was forgotten here meanwhile.
        record = start.record if start.chars is not None else {**start.record, **(self.store.get(job_id) or {})}
        chars = SegmentStart(start.state, record=record).chars or []
        total = int(record.get("segments_total", 0))
        if len(chars) != total:  # a job written without the lengths: estimate every segment like this one
            chars = [len(start.text or "")] * total
        return self._timelines.get(job_id, self.timeline(record, lane, chars, durations, arrivals))

    def timeline(
        self,
        record: dict[str, str],
        lane: str,
        chars: list[int],
        durations: dict[int, float],
        arrivals: dict[int, float],
    ) -> Timeline:
        """Return the job's deadlines, with the real durations and first-audio time known so far."""
        return timeline(
            lane=lane,
            accepted_at=float(record["created_at"]),
            chars=chars,
            seconds_per_char=float(record.get("seconds_per_char") or self.book.default_seconds_per_char),
            policy=self.policy,
            durations=durations,
            arrivals=arrivals,
        )

    def _feed_next(self, job_id: str, index: int, plan: Timeline, lane: str) -> None:
        """Publish the pending segment the write moved to the outbox: each one finished lets one more in."""
        deadline = plan.deadline(index)
        try:
            self.book.add(job_id, {index: deadline})
            self.enqueue(job_id, [index], lane, [deadline] if self.use_deadlines else None)
            self.store.published(job_id, [index])
        except Exception as e:  # the segment is written: failing its task now would only repeat it
            log.warning("job %s: could not publish segment %d (%s); the outbox will", job_id, index, e)

    def _log_job_done(self, job_id: str, lane: str) -> None:
        """Write the one summary line per finished job, with its timings and its listener's stalls."""
        record = self.store.get(job_id) or {}
        meta = self.store.segment_meta(job_id)
        created = float(record.get("created_at", 0))
        ordered = [meta.get(i, {}) for i in range(int(record.get("segments_total", 0)))]
        # A cached segment was there at acceptance; one without a time (older meta) counts as on time.
        arrived = [float(m.get("finished_at", created)) for m in ordered]
        stalls, stalled_s = playback_stalls(arrived, [float(m.get("duration_s", 0.0)) for m in ordered])
        JOB_STALLS.labels(lane).observe(stalls)
        JOB_STALL_SECONDS.labels(lane).observe(stalled_s)
        timings = {
            "job_id": job_id,
            "segments": int(record.get("segments_total", 0)),
            "cached_segments": int(record.get("cached_segments", 0)),
            "chars": int(record.get("chars_total", 0)),
            "audio_s": round(sum(m.get("duration_s", 0.0) for m in meta.values()), 3),
            "queued_s": round(float(record.get("started_at", created)) - created, 3),
            "total_s": round(float(record.get("finished_at", created)) - created, 3),
            "first_audio_s": round(arrived[0] - created, 3) if arrived else None,
            "stalls": stalls,
            "stalled_s": round(stalled_s, 3),
        }
        log.info("job %s done: %s", job_id, timings, extra=timings)


_OUTCOMES = {
    WriteResult.FINISHED: Outcome.WRITTEN,
    WriteResult.WRITTEN: Outcome.WRITTEN,
    WriteResult.DUPLICATE: Outcome.DUPLICATE,
    WriteResult.GONE: Outcome.SKIPPED,
    WriteResult.OVER: Outcome.SKIPPED,
}
