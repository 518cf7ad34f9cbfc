"""A worker's playback timelines: one per job, shared by every segment of it the worker holds, even as it grows."""

from __future__ import annotations

from typing import cast

from cache.jobstore import JobStore
from cache.records import JobRecord, JobRequest, JobStatus, SegmentStart, StartState
from core.schedule import DeadlinePolicy
from workers.timelines import Timelines

REQUEST = JobRequest(model="chattts-tiny", voice="default", speed=1.0, mode="balanced", format="wav",
                     priority="realtime", seed=None, cache=False)  # fmt: skip
ACCEPTED = 1_000.0
PACE = 0.1  # seconds of audio per character


def _start(segment_chars: tuple[int, ...], text: str) -> SegmentStart:
    """A start of a stream's segment as a worker that does not know the job yet reads it: the whole record."""
    record = JobRecord(id="s1", status=JobStatus.RUNNING, request=REQUEST, segments_total=len(segment_chars),
                       segment_chars=segment_chars, created_at=ACCEPTED, seconds_per_char=PACE,
                       text_open=True)  # fmt: skip
    return SegmentStart(StartState.GO, record=record, text=text)


def _timelines() -> Timelines:
    # Every start here carries the lengths, so the store is never read.
    return Timelines(store=cast(JobStore, None), policy=DeadlinePolicy(first_audio_s=1.0), default_pace=PACE)


def test_a_stream_segment_waiting_on_its_timeline_follows_the_first_audio_written_after_the_stream_grew() -> None:
    timelines = _timelines()
    first = timelines.of("s1", _start((10,), "x" * 10))  # the stream has one segment when its first starts
    second = timelines.of("s1", _start((10, 20), "y" * 20))  # it has grown by the time its second starts
    first.arrived(0, ACCEPTED + 0.5, 1.0)  # segment 0 written: its listener starts now and plays it for 1 s

    assert second.deadline(1, now=ACCEPTED + 50) == ACCEPTED + 1.5, (
        "segment 1 is due when its listener ends segment 0, not at an estimate that moves on with the clock"
    )
    assert first.deadline(2, now=ACCEPTED + 50) == ACCEPTED + 3.5, "the first segment's view has the second's length"


def test_a_timeline_grown_by_a_longer_view_keeps_what_it_knew_and_takes_the_new_lengths() -> None:
    timelines = _timelines()
    known = timelines.of("s1", _start((10,), "x" * 10))
    known.arrived(0, ACCEPTED + 0.5, 1.2)  # its real duration, not the estimated 1.0
    grown = timelines.of("s1", _start((10, 20, 30), "y" * 20))

    assert grown is known
    assert grown.durations == [1.2, 2.0, 3.0]
    assert grown.deadlines(now=ACCEPTED + 50) == [ACCEPTED, ACCEPTED + 1.7, ACCEPTED + 3.7]


def _job_start(job_id: str, segments: int) -> SegmentStart:
    record = JobRecord(id=job_id, status=JobStatus.RUNNING, request=REQUEST, segments_total=segments,
                       segment_chars=(10,) * segments, created_at=ACCEPTED, seconds_per_char=PACE)  # fmt: skip
    return SegmentStart(StartState.GO, record=record, text="x" * 10)


def test_the_timelines_kept_are_bounded_by_their_segments_together_oldest_forgotten_first() -> None:
    timelines = Timelines(store=cast(JobStore, None), policy=DeadlinePolicy(first_audio_s=1.0), default_pace=PACE,
                          segment_limit=5_000)  # fmt: skip
    for n in range(10):  # ten books of 2,000 segments: 20,000 segments, four times the limit
        timelines.of(f"book-{n}", _job_start(f"book-{n}", 2_000))

    jobs, segments = timelines.kept()
    assert (jobs, segments) == (2, 4_000)
    assert timelines.known("book-9") and timelines.known("book-8") and not timelines.known("book-7")
    timelines.forget("book-9")
    assert timelines.kept() == (1, 2_000)
