"""How a job record looks to its caller: the contract's JobView, and why a finished job's audio is gone."""

from __future__ import annotations

import time

from flask import url_for

from api.contract import JobUrls, JobView, TextStreamView
from cache.records import JobRecord
from core.errors import NotFound


def job_urls(job_id: str) -> JobUrls:
    """Return the routes of one job."""
    return JobUrls(
        self=url_for("jobs.get_job", job_id=job_id),
        audio=url_for("jobs.get_audio", job_id=job_id),
        events=url_for("jobs.get_events", job_id=job_id),
        segment=url_for("jobs.get_segment", job_id=job_id, index=0).rsplit("/", 1)[0] + "/{index}",
    )


def job_view(record: JobRecord) -> JobView:
    """Render a job record as the contract's JobView."""
    req, total, done = record.request, record.segments_total, record.segments_done
    return JobView(
        id=record.id,
        status=record.status,
        segments_total=total,
        segments_done=done,
        cached_segments=record.cached_segments,
        progress=round(done / total, 4) if total else (0.0 if record.text_open else 1.0),
        model=req.model,
        voice=req.voice,
        format=req.format,  # type: ignore[arg-type]  # checked against the contract at submission
        priority=req.priority,
        speed=req.speed,
        mode=req.mode,  # type: ignore[arg-type]
        seed=req.seed,
        chars_total=record.chars_total,
        created_at=record.created_at,
        started_at=record.started_at,
        finished_at=record.finished_at,
        sample_rate=record.sample_rate,
        first_due_at=record.first_due_at,
        start_estimate_s=record.start_estimate_s,
        audio_expires_at=record.audio_expires_at,
        audio_removed_at=record.audio_removed_at,
        error=record.error,
        text_stream=text_stream_view(record),
        urls=job_urls(record.id),
    )


def text_stream_view(record: JobRecord) -> TextStreamView | None:
    """Render a text stream's state (None for a job that took its whole text at once)."""
    if record.text_open is None:
        return None
    is_open = record.text_open and not record.status.terminal
    return TextStreamView(open=is_open, next_seq=record.text_next_seq, end_reason=record.text_end_reason)


def job_not_found(job_id: str) -> NotFound:
    """Return the 404 of every job route: for an unknown job, and for another caller's when keys are on."""
    return NotFound(f"no job {job_id!r} (unknown, another API key's, or expired after its TTL)")


def gone_message(record: JobRecord, *, job_ttl_s: int) -> str:
    """Say why a finished job's audio is gone, when, and what the caller can do."""
    finished = record.finished_at or record.updated_at
    removed = record.audio_removed_at or record.audio_expires_at or finished
    after = f"{max(0.0, removed - finished) / 60:.0f} min"
    until = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(finished + job_ttl_s))
    if record.audio_removed_for == "memory":
        why = (
            f"was removed {after} after the job finished, to keep the job store inside its memory budget "
            "(the oldest finished audio goes first)"
        )
    else:
        why = f"was kept for {after} after the job finished (TTS_AUDIO_TTL_S) and has expired"
    return (
        f"job {record.id}'s audio {why}; its record stays until {until}. Download audio soon after a job "
        "finishes, or submit the text again (segments still in the sentence cache come back at once)"
    )
