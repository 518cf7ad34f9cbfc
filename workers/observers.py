"""What observes a segment's making and write: metrics, the sentence-cache fill, the pace book, the job's summary.

The main path (read → synthesize → one atomic write that advances the job) stays in workers/segment.py; work that
only observes it lives here, behind hooks that do nothing unless overridden, as dramatiq's middleware does.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cache.jobstore import JobStore
from cache.records import JobRequest, SegmentStart
from cache.schedule import ScheduleBook
from cache.sentences import CachedSegment, SentenceCache, segment_keys
from cache.stats import Stats
from core.audio import PackedAudio
from core.metrics import (
    AUDIO_SECONDS,
    CACHE_BYTES_STORED,
    JOB_STALL_SECONDS,
    JOB_STALLS,
    QUEUE_WAIT,
    REAL_TIME_FACTOR,
    SEGMENT_LATENESS,
    SEGMENTS,
    TIME_TO_FIRST_SEGMENT,
)
from core.registry import ModelSpec
from core.schedule import heard_at, playback_stalls

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MadeSegment:
    """One segment as a worker made it, before and after its write."""

    job_id: str
    index: int
    text: str
    spec: ModelSpec
    request: JobRequest
    audio: PackedAudio
    sample_rate: int
    duration_s: float
    synth_s: float
    finished_at: float
    deadline: float
    accepted_at: float
    worker: str
    #: When its listener could start it: its first fragment's write (its own, when it is one fragment).
    heard_at: float = 0.0
    #: Each fragment's samples, in order (empty: one fragment, the whole segment).
    fragments: tuple[int, ...] = ()

    @property
    def first_heard_at(self) -> float:
        """Return when its listener could start playing it."""
        return self.heard_at or self.finished_at

    @property
    def first_fragment_s(self) -> float:
        """Return how long its first fragment took to make: what its listener waited once the engine started it."""
        if not self.heard_at:
            return self.synth_s  # one fragment: the whole segment
        return max(0.0, self.heard_at - (self.finished_at - self.synth_s))

    @property
    def lateness_s(self) -> float:
        """Return how long after its deadline its listener could start it (negative: before)."""
        return self.first_heard_at - self.deadline

    def meta(self) -> dict[str, Any]:
        """Return the metadata stored beside the audio (the job's own times included)."""
        found: dict[str, Any] = {
            "duration_s": round(self.duration_s, 4),
            "synth_s": round(self.synth_s, 4),
            "worker": self.worker,
            "finished_at": round(self.finished_at, 4),
            "first_at": round(self.first_heard_at, 4),
            "lateness_s": round(self.lateness_s, 4),
            "model": self.spec.name,  # the variant that made it (model@mode for a mode of its own)
        }
        if len(self.fragments) > 1:
            found["fragments"] = list(self.fragments)
        return found


class SegmentObserver:
    """Hooks around one segment's life; each does nothing unless a subclass overrides it."""

    def started(self, start: SegmentStart, index: int) -> None:
        """Called when a worker holds a segment and is about to make it."""

    def made(self, made: MadeSegment) -> None:
        """Called when the engine has made a segment, just before its write (a job done is then a job cached)."""

    def written(self, made: MadeSegment, outcome: str) -> None:
        """Called after the write: ``outcome`` is "written", "duplicate" or "skipped" (the job ended meanwhile)."""

    def job_finished(self, job_id: str, lane: str) -> None:
        """Called once, by the worker whose write finished the job."""


class Observers(SegmentObserver):
    """Call several observers in turn; one that fails is logged and does not stop the others or the task."""

    def __init__(self, observers: Sequence[SegmentObserver]) -> None:
        self.observers = list(observers)

    def started(self, start: SegmentStart, index: int) -> None:
        """Tell every observer a segment started."""
        for observer in self.observers:
            self._guard(observer, observer.started, start, index)

    def made(self, made: MadeSegment) -> None:
        """Tell every observer a segment was made."""
        for observer in self.observers:
            self._guard(observer, observer.made, made)

    def written(self, made: MadeSegment, outcome: str) -> None:
        """Tell every observer a segment was written (or found written)."""
        for observer in self.observers:
            self._guard(observer, observer.written, made, outcome)

    def job_finished(self, job_id: str, lane: str) -> None:
        """Tell every observer a job finished."""
        for observer in self.observers:
            self._guard(observer, observer.job_finished, job_id, lane)

    @staticmethod
    def _guard(observer: SegmentObserver, hook: Callable[..., None], *args: object) -> None:
        try:
            hook(*args)
        except Exception:  # the segment is written: an observer's failure must not make it again
            log.exception("segment observer %s failed", type(observer).__name__)


class SegmentMetrics(SegmentObserver):
    """Count segments and their timings in Prometheus and the throughput statistics admission reads."""

    def __init__(self, stats: Stats) -> None:
        self.stats = stats

    def started(self, start: SegmentStart, index: int) -> None:
        """Observe how long the segment waited since its job was accepted."""
        if start.record is not None:
            QUEUE_WAIT.observe(max(0.0, time.time() - start.record.created_at))

    def written(self, made: MadeSegment, outcome: str) -> None:
        """Count the outcome, the audio made, its real-time factor, lateness and first-segment time."""
        SEGMENTS.labels(outcome).inc()
        # A realtime first segment's making time: what admission's first-audio check reads.
        first = made.index == 0 and outcome == "written" and made.request.priority == "realtime"
        first_s = made.first_fragment_s if first else 0.0
        self.stats.record(ok=1, first_chars=len(made.text) if first else 0, first_s=first_s, model=made.spec.name)
        AUDIO_SECONDS.labels(made.spec.name).inc(made.duration_s)
        if made.duration_s > 0:
            REAL_TIME_FACTOR.labels(made.spec.name).observe(made.synth_s / made.duration_s)
        if outcome == "written":
            SEGMENT_LATENESS.labels(made.request.priority).observe(made.lateness_s)
            if made.index == 0:
                TIME_TO_FIRST_SEGMENT.observe(max(0.0, made.first_heard_at - made.accepted_at))
        log.info(
            "segment %s/%d %s: %d chars, %.2fs audio in %.2fs, finished %+.2fs from its deadline",
            made.job_id,
            made.index,
            outcome,
            len(made.text),
            made.duration_s,
            made.synth_s,
            made.lateness_s,
            extra={
                "job_id": made.job_id,
                "segment": made.index,
                "chars": len(made.text),
                "audio_s": round(made.duration_s, 3),
                "synth_s": round(made.synth_s, 3),
                "lateness_s": round(made.lateness_s, 3),
                "outcome": outcome,
            },
        )


class PaceKeeper(SegmentObserver):
    """Teach the schedule book each model's pace (seconds of audio per character) from written segments."""

    def __init__(self, book: ScheduleBook) -> None:
        self.book = book

    def written(self, made: MadeSegment, outcome: str) -> None:
        """Add a newly written segment to its model's pace."""
        if outcome == "written":
            self.book.observe(made.spec.name, chars=len(made.text), audio_s=made.duration_s)


class CacheFill(SegmentObserver):
    """Keep every made segment in the sentence cache, so the same sentence is never made twice.

    It fills before the write, so that once a job is done, a repeat of its text finds every segment cached.
    """

    def __init__(self, cache: SentenceCache) -> None:
        self.cache = cache

    def made(self, made: MadeSegment) -> None:
        """Store the segment's audio under its sentence key (without this job's own times)."""
        if not made.request.cache:
            return
        key = segment_keys(made.spec, made.request, [made.text])[0]
        meta = made.meta()
        kept = {k: meta[k] for k in ("duration_s", "synth_s", "worker")}
        CACHE_BYTES_STORED.inc(self.cache.put(key, CachedSegment(made.audio, made.sample_rate, kept)))


class JobSummary(SegmentObserver):
    """Write one summary line per finished job, with its timings and its listener's stalls."""

    def __init__(self, store: JobStore) -> None:
        self.store = store

    def job_finished(self, job_id: str, lane: str) -> None:
        """Read the finished job once, observe its stalls and log its timings."""
        record, meta = self.store.get_with_meta(job_id)
        if record is None:
            return
        created = record.created_at
        ordered = [meta.get(i, {}) for i in range(record.segments_total)]
        # A cached segment was there at acceptance; one without a time (older meta) counts as on time.
        arrived = [heard_at(m, created) for m in ordered]
        stalls, stalled_s = playback_stalls(arrived, [float(m.get("duration_s", 0.0)) for m in ordered])
        JOB_STALLS.labels(lane).observe(stalls)
        JOB_STALL_SECONDS.labels(lane).observe(stalled_s)
        timings = {
            "job_id": job_id,
            "segments": record.segments_total,
            "cached_segments": record.cached_segments,
            "chars": record.chars_total,
            "audio_s": round(sum(m.get("duration_s", 0.0) for m in meta.values()), 3),
            "queued_s": round((record.started_at or created) - created, 3),
            "total_s": round((record.finished_at or created) - created, 3),
            "first_audio_s": round(arrived[0] - created, 3) if arrived else None,
            "stalls": stalls,
            "stalled_s": round(stalled_s, 3),
        }
        log.info("job %s done: %s", job_id, timings, extra=timings)


def default_observers(*, stats: Stats, cache: SentenceCache, book: ScheduleBook, store: JobStore) -> Observers:
    """Return what every worker observes of its segments."""
    return Observers([SegmentMetrics(stats), PaceKeeper(book), CacheFill(cache), JobSummary(store)])
