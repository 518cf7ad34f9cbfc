"""Synthesise one segment of one job and write it to the job store (plain, testable)."""

from __future__ import annotations

import enum
import logging
import time

from cache.jobstore import TERMINAL, JobStore
from cache.sentences import CachedSegment, SentenceCache, segment_keys
from cache.stats import Stats
from core.audio import to_pcm16
from core.metrics import (
    AUDIO_SECONDS,
    CACHE_BYTES_STORED,
    QUEUE_WAIT,
    REAL_TIME_FACTOR,
    SEGMENTS,
    TIME_TO_FIRST_SEGMENT,
)
from core.registry import Registry
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
    ) -> None:
        self.store = store
        self.cache = cache
        self.stats = stats
        self.enqueue = enqueue
        self.registry = registry
        self.backend = backend
        self.max_attempts = max_attempts
        self.worker = worker

    def run(self, job_id: str, index: int) -> Outcome:
        """Make segment ``index`` of ``job_id`` unless it exists or its job is over."""
        record = self.store.get(job_id)
        if record is None or record["status"] in TERMINAL:
            return Outcome.SKIPPED
        if self.store.has_segment(job_id, index):
            return Outcome.DUPLICATE
        attempt = self.store.count_attempt(job_id, index)
        if attempt > self.max_attempts:
            # A redelivery after crashes (the worker died each time): stop the loop.
            self.store.fail(job_id, f"segment {index} was attempted {self.max_attempts} times without finishing")
            return Outcome.GAVE_UP
        request = self.store.request(job_id)
        text = self.store.segment_text(job_id, index)
        if request is None or text is None:
            return Outcome.SKIPPED
        self.store.mark_running(job_id)
        QUEUE_WAIT.observe(max(0.0, time.time() - float(record["created_at"])))
        spec = self.registry.get(request.model)
        started = time.perf_counter()
        wave, rate = self.backend.synthesize(
            spec,
            SynthesisRequest(text=text, voice=request.voice, speed=request.speed, seed=request.seed, mode=request.mode),
            urgent=index == 0,
        )
        synth_s = time.perf_counter() - started
        pcm = to_pcm16(wave)
        duration = len(wave) / rate
        meta = {"duration_s": round(duration, 4), "synth_s": round(synth_s, 4), "worker": self.worker}
        result = self.store.write_segment(job_id, index, pcm, sample_rate=rate, meta={**meta, "attempt": attempt})
        outcome = _OUTCOMES[result]
        SEGMENTS.labels(outcome.value).inc()
        self.stats.record(ok=1)
        AUDIO_SECONDS.labels(spec.name).inc(duration)
        if duration > 0:
            REAL_TIME_FACTOR.labels(spec.name).observe(synth_s / duration)
        if index == 0 and outcome is Outcome.WRITTEN:
            TIME_TO_FIRST_SEGMENT.observe(max(0.0, time.time() - float(record["created_at"])))
        if request.cache:
            key = segment_keys(spec, request, [text])[0]
            CACHE_BYTES_STORED.inc(self.cache.put(key, CachedSegment(pcm, rate, meta)))
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
        if result == 2:
            self._log_job_done(job_id)
        elif outcome is Outcome.WRITTEN:
            self._feed_next(job_id, request.priority)
        return outcome

    def _feed_next(self, job_id: str, lane: str) -> None:
        """Enqueue the job's next waiting segment: each one finished lets one more in."""
        index = self.store.next_pending(job_id)
        if index is not None:
            self.enqueue(job_id, [index], lane)

    def _log_job_done(self, job_id: str) -> None:
        """Write the one summary line per finished job, with its timings."""
        record = self.store.get(job_id) or {}
        meta = self.store.segment_meta(job_id)
        created = float(record.get("created_at", 0))
        timings = {
            "job_id": job_id,
            "segments": int(record.get("segments_total", 0)),
            "cached_segments": int(record.get("cached_segments", 0)),
            "chars": int(record.get("chars_total", 0)),
            "audio_s": round(sum(m.get("duration_s", 0.0) for m in meta.values()), 3),
            "queued_s": round(float(record.get("started_at", created)) - created, 3),
            "total_s": round(float(record.get("finished_at", created)) - created, 3),
        }
        log.info("job %s done: %s", job_id, timings, extra=timings)


# WRITE_SEGMENT's answers: written, already there, job gone, job already over.
_OUTCOMES = {2: Outcome.WRITTEN, 1: Outcome.WRITTEN, 0: Outcome.DUPLICATE, -1: Outcome.SKIPPED, -2: Outcome.SKIPPED}
