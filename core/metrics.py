"""Prometheus metrics, named once here so the API, the workers and the dashboards agree."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

CACHE_LOOKUPS = Counter("tts_cache_lookups_total", "Sentence-cache lookups by result.", ["result"])
CACHE_BYTES_STORED = Counter("tts_cache_bytes_stored_total", "Bytes of PCM written to the sentence cache.")
JOBS_SUBMITTED = Counter("tts_jobs_submitted_total", "Jobs accepted, by lane.", ["lane"])
BATCH_SIZE = Histogram(
    "tts_batch_size", "Segments per engine call.", ["model"], buckets=(1, 2, 4, 6, 8, 12, 16, 24, 32, 64)
)
SYNTHESIS_SECONDS = Histogram(
    "tts_synthesis_seconds",
    "Wall time of one batched engine call.",
    ["model"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
)
AUDIO_SECONDS = Counter("tts_audio_seconds_total", "Seconds of audio produced.", ["model"])
SEGMENTS = Counter("tts_segments_total", "Segment tasks by outcome.", ["outcome"])
