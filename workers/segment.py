"""Synthesise one segment of one job and write it to the job store (plain, testable)."""

from __future__ import annotations

import enum
import logging
import time

from cache.jobstore import TERMINAL, JobStore
from cache.sentences import CachedSegment, SentenceCache, segment_keys
from core.audio import to_pcm16
from core.metrics import AUDIO_SECONDS, CACHE_BYTES_STORED, SEGMENTS
from core.registry import Registry
from workers.backend import SynthesisBackend
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
        registry: Registry,
        backend: SynthesisBackend,
        max_attempts: int,
        worker: str,
    ) -> None:
        self.store = store
        self.cache = cache
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
        spec = self.registry.get(request.model)
        started = time.perf_counter()
        wave, rate = self.backend.synthesize(
            spec,
            SynthesisRequest(text=text, voice=request.voice, speed=request.speed, seed=request.seed, mode=request.mode),
        )
        synth_s = time.perf_counter() - started
        pcm = to_pcm16(wave)
        duration = len(wave) / rate
        meta = {"duration_s": round(duration, 4), "synth_s": round(synth_s, 4), "worker": self.worker}
        result = self.store.write_segment(job_id, index, pcm, sample_rate=rate, meta={**meta, "attempt": attempt})
        outcome = _OUTCOMES[result]
        SEGMENTS.labels(outcome.value).inc()
        AUDIO_SECONDS.labels(spec.name).inc(duration)
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
        )
        return outcome


# WRITE_SEGMENT's answers: written, already there, job gone, job already over.
_OUTCOMES = {1: Outcome.WRITTEN, 0: Outcome.DUPLICATE, -1: Outcome.SKIPPED, -2: Outcome.SKIPPED}
