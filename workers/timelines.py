"""The playback timelines of the jobs a worker holds segments of: built once per job, then kept up to date."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from cache.jobstore import JobStore
from cache.records import JobRecord, SegmentStart
from core.schedule import DeadlinePolicy, Timeline, heard_at, timeline
from workers.arrivals import FirstArrivals

#: A worker keeps the timelines of at most this many jobs ...
MOST_JOBS = 10_000
#: ... holding at most this many segments together (a segment costs about 100 bytes: 20 MB in all), oldest forgotten
#: first. A job's timeline is forgotten when its last segment is written here, or a start finds it over; these
#: bound the rest (jobs finished by other workers, or failed), whose number grows with traffic.
MOST_SEGMENTS = 200_000


class Timelines:
    """The timelines of jobs this worker holds segments of, shared by those segments; oldest forgotten first."""

    def __init__(
        self,
        *,
        store: JobStore,
        policy: DeadlinePolicy,
        default_pace: float,
        limit: int = MOST_JOBS,
        segment_limit: int = MOST_SEGMENTS,
        arrivals: FirstArrivals | None = None,
    ) -> None:
        self.store = store
        self.policy = policy
        self.default_pace = default_pace  # seconds of audio per character, for a job written without its pace
        self.arrivals = arrivals  # tells a timeline when another worker writes its job's first segment
        self._timelines: OrderedDict[str, Timeline] = OrderedDict()
        self._lock = threading.Lock()
        self._limit = limit
        self._segment_limit = segment_limit
        self._segments = 0  # the segments of every timeline kept

    def known(self, job_id: str) -> bool:
        """Say whether this worker has the job's timeline (its next start reads less)."""
        with self._lock:
            return job_id in self._timelines

    def of(self, job_id: str, start: SegmentStart) -> Timeline:
        """Return the job's shared timeline, updated with what ``start`` (read from the store now) knows."""
        if start.record is None:
            raise ValueError("a start that found no job has no timeline")
        lane = start.record.request.priority
        stretch = self.policy.stretch(lane)
        durations = {i: float(m["duration_s"]) * stretch for i, m in start.meta.items() if "duration_s" in m}
        arrivals = {i: heard_at(m, 0.0) for i, m in start.meta.items() if "finished_at" in m}
        with self._lock:
            found = self._timelines.get(job_id)
        if found is not None and len(found.durations) >= start.record.segments_total:
            found.learn(arrivals, durations)
            return found
        # Only a start that said it knew the job lacks the lengths: the job was forgotten here meanwhile, or it is
        # a text stream that grew since (its timeline grown with every segment's length, in place: the segments
        # already waiting in the batcher read their deadlines from it, and must see the arrivals written later).
        record = start.record if start.record.segment_chars is not None else self.store.get(job_id) or start.record
        fresh = self._build(record, len(start.text or ""), start.meta)
        with self._lock:
            found = self._timelines.get(job_id)
            before = 0 if found is None else len(found.durations)
            if found is None:
                found = self._timelines[job_id] = fresh
            else:
                found.grow(fresh)
            self._segments += len(found.durations) - before
            while len(self._timelines) > 1 and (
                len(self._timelines) > self._limit or self._segments > self._segment_limit
            ):
                _, oldest = self._timelines.popitem(last=False)
                self._segments -= len(oldest.durations)
            return found

    def kept(self) -> tuple[int, int]:
        """Return how many jobs' timelines are kept, and how many segments they hold together."""
        with self._lock:
            return len(self._timelines), self._segments

    def _build(self, record: JobRecord, own_chars: int, meta: dict[int, dict[str, Any]]) -> Timeline:
        """Return a job's deadlines from its record, with the real durations and first-audio time known so far."""
        chars = list(record.segment_chars or ())
        if len(chars) != record.segments_total:  # written without the lengths: estimate each like this one
            chars = [own_chars] * record.segments_total
        return timeline(
            lane=record.request.priority,
            accepted_at=record.created_at,
            chars=chars,
            seconds_per_char=record.seconds_per_char or self.default_pace,
            policy=self.policy,
            durations={i: float(m["duration_s"]) for i, m in meta.items() if "duration_s" in m},
            arrivals={i: heard_at(m, 0.0) for i, m in meta.items() if "finished_at" in m},
        )

    def await_first(self, job_id: str, plan: Timeline, lane: str) -> None:
        """Have ``plan`` learn segment 0's arrival the moment any worker writes it (a later segment of the job waits
        here, and its listener starts then); without ``arrivals``, only segments started here later tell it."""
        if self.arrivals is not None:
            self.arrivals.follow(job_id, plan, stretch=self.policy.stretch(lane))

    def forget(self, job_id: str) -> None:
        """Drop a finished (or failed, or canceled) job's timeline."""
        with self._lock:
            gone = self._timelines.pop(job_id, None)
            self._segments -= len(gone.durations) if gone is not None else 0
        if self.arrivals is not None:
            self.arrivals.forget(job_id)
