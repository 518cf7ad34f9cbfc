"""Segment observers: empty hooks by default, called in turn; one that fails stops neither the rest nor the task."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from cache.records import JobRecord, JobRequest, JobStatus, SegmentStart, StartState
from core.audio import PackedAudio
from core.registry import ModelSpec
from workers.observers import MadeSegment, Observers, SegmentMetrics, SegmentObserver

REQUEST = JobRequest(model="espeak-en", voice="default", speed=1.0, mode="balanced", format="wav",
                     priority="realtime", seed=None, cache=False)  # fmt: skip


def _made() -> MadeSegment:
    return MadeSegment(
        job_id="j1",
        index=0,
        text="Hello.",
        spec=ModelSpec(name="espeak-en", engine="espeak"),
        request=REQUEST,
        audio=PackedAudio.pack(b"\0\0" * 240, 24000, "pcm"),
        sample_rate=24000,
        duration_s=0.01,
        synth_s=0.002,
        finished_at=101.0,
        deadline=100.5,
        accepted_at=100.0,
        worker="w1",
    )


class _Recorder(SegmentObserver):
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def written(self, made: MadeSegment, outcome: str) -> None:
        self.calls.append(f"written {made.job_id}/{made.index} {outcome}")

    def job_finished(self, job_id: str, lane: str) -> None:
        self.calls.append(f"finished {job_id} {lane}")


class _Broken(SegmentObserver):
    def written(self, made: MadeSegment, outcome: str) -> None:
        raise RuntimeError("observer bug")


def test_the_base_observer_hooks_do_nothing() -> None:
    start = SegmentStart(StartState.GO, record=JobRecord(id="j1", status=JobStatus.RUNNING, request=REQUEST))
    observer = SegmentObserver()
    assert observer.started(start, 0) is None
    assert observer.made(_made()) is None
    assert observer.written(_made(), "written") is None
    assert observer.job_finished("j1", "realtime") is None


def test_a_failing_observer_is_logged_and_the_ones_after_it_still_run(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[str] = []
    observers = Observers([_Broken(), _Recorder(calls)])
    with caplog.at_level(logging.ERROR, logger="workers.observers"):
        observers.written(_made(), "written")  # must not raise: the segment is already written
        observers.job_finished("j1", "realtime")
    assert calls == ["written j1/0 written", "finished j1 realtime"]
    assert any("_Broken failed" in r.getMessage() for r in caplog.records)


def test_a_made_segment_keeps_its_lateness_against_the_deadline_in_its_metadata() -> None:
    meta = _made().meta()
    assert meta == {"duration_s": 0.01, "synth_s": 0.002, "worker": "w1", "finished_at": 101.0, "first_at": 101.0,
                    "lateness_s": 0.5, "model": "espeak-en"}  # fmt: skip


def test_a_segment_in_fragments_is_late_by_its_first_fragment_and_keeps_their_lengths() -> None:
    made = replace(_made(), synth_s=1.0, heard_at=100.7, fragments=(120, 60))
    meta = made.meta()
    assert meta["first_at"] == 100.7 and meta["lateness_s"] == 0.2 and meta["fragments"] == [120, 60]
    assert abs(made.first_fragment_s - 0.7) < 1e-9  # its engine started at 100.0, its segment ended at 101.0


class _Tally:
    """Stands in for the stats' one method a metrics observer calls, keeping what it was given."""

    def __init__(self) -> None:
        self.recorded: list[dict[str, float | str]] = []

    def record(self, **amounts: float | str) -> None:
        self.recorded.append(amounts)


def test_only_a_realtime_jobs_first_segment_is_counted_for_the_first_audio_check() -> None:
    tally = _Tally()
    metrics = SegmentMetrics(tally)  # type: ignore[arg-type]
    first = _made()
    metrics.written(first, "written")
    metrics.written(replace(first, index=1), "written")
    metrics.written(replace(first, request=replace(REQUEST, priority="batch")), "written")
    metrics.written(first, "duplicate")
    assert tally.recorded[0] == {"ok": 1, "first_chars": len("Hello."), "first_s": 0.002, "model": first.spec.name}
    assert [r["first_chars"] for r in tally.recorded[1:]] == [0, 0, 0], "a later, batch or repeated segment"
