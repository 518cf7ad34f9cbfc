"""Settings of a job's life: how long a text may be, how it is cut up, how long its parts and audio are kept."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings


class JobSettings(BaseSettings):
    """The limits and lifetimes of jobs, shared by the API that plans them and the workers that make them."""

    max_text_chars: int = Field(
        20_000,
        ge=1,
        description="Longest text accepted by POST /v1/jobs and /v1/audio/speech, in characters both as sent and "
        "after normalisation (numbers and symbols spelled out, compatibility characters expanded).",
    )
    max_segments: int = Field(
        2_000,
        ge=1,
        description="Most segments one job may plan into (a 20,000-character book plans into about 500); over it "
        "a job is refused with 413 before any work is queued.",
    )
    max_body_bytes: int = Field(256 * 1024, ge=1024, description="Largest request body accepted.")
    segment_max_chars: int = Field(
        60,
        ge=10,
        description="Segments pack sentences up to this many characters; shorter segments bound how long one "
        "engine call holds a model host, and so everyone's wait.",
    )
    first_segment_max_chars: int = Field(
        24,
        ge=5,
        description="The first segment is kept this short, so that the first audio comes early; each next one is "
        "at most this long or as long as all before it together.",
    )
    batch_lane_chars: int = Field(2000, ge=1, description="Jobs longer than this default to the batch lane.")
    enqueue_window_batch: int = Field(
        4, ge=1, description="Segments of one batch-lane job in the queue at once; the rest follow as they finish."
    )
    enqueue_window_realtime: int = Field(64, ge=1, description="The same window for realtime-lane jobs.")
    reconcile_interval_s: float = Field(
        15.0,
        gt=0,
        description="How often a worker looks for stalled and late jobs, and accounts for every live job's "
        "segments (also right after a worker dies or Redis errs).",
    )
    reconcile_stall_s: float = Field(
        900.0,
        gt=0,
        description="Re-enqueue a live job's missing segments after this long without progress; too low only "
        "costs duplicate work.",
    )
    job_deadline_s: float = Field(6 * 3600.0, gt=0, description="A job not done this long after submission fails.")
    text_stream_flush_s: float = Field(
        1.5,
        gt=0,
        description="A text stream's unfinished sentence is spoken anyway once no piece arrived for this long "
        "(the idle cut-off).",
    )
    text_stream_idle_s: float = Field(
        30.0, gt=0, description="A text stream with no piece for this long ends with what it has; its record says why."
    )

    job_ttl_s: int = Field(
        24 * 3600, ge=60, description="How long a finished job's record (status, progress, error) stays in Redis."
    )
    audio_ttl_s: int = Field(
        3600,
        ge=60,
        description="How long a finished job's audio stays in Redis (at most job_ttl_s); after it, the audio "
        "routes answer 410 Gone. The memory budget may remove the oldest finished audio sooner.",
    )
    audio_store_codec: str = Field(
        "flac",
        pattern="^(flac|vorbis|pcm)$",
        description="How segment audio is kept in Redis: flac (lossless, about half of raw PCM for speech), "
        "vorbis (lossy, about a quarter), pcm (raw).",
    )
    store_budget_mb: int = Field(
        0,
        ge=0,
        description="The job store's memory budget; 0 takes Redis's own maxmemory (and no budget if it has none).",
    )
    store_trim_at: float = Field(
        0.8,
        gt=0,
        lt=1,
        description="Past this share of the budget, the oldest finished audio and cache entries are removed.",
    )
    store_full_at: float = Field(
        0.9,
        gt=0,
        lt=1,
        description="A new job whose expected audio, beside the memory used and what live jobs have reserved, would "
        "pass this share of the budget gets 503 with Retry-After.",
    )
    store_batch_share: float = Field(
        0.8,
        gt=0,
        le=1,
        description="Batch-lane jobs may reserve audio only up to this share of the full mark, so that realtime jobs "
        "always find room in the store however many books wait; 1 lets them fill it.",
    )
    segment_max_attempts: int = Field(
        3,
        ge=1,
        description="Failed attempts per segment (its engine raised, or its worker died making it) before its job "
        "fails; redeliveries, duplicates and Redis faults never count.",
    )
    task_time_limit_s: int = Field(300, ge=10, description="Hard limit for one segment's synthesis.")
    visibility_timeout_s: int = Field(
        3600,
        ge=30,
        description="A delivered task not acked this long is delivered again; a value under 3x the task time limit "
        "is raised to that.",
    )
