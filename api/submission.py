"""Turn a checked request into a durable, enqueued job (no Flask in here)."""

from __future__ import annotations

import logging

from api.services import Enqueue
from api.validation import JobInput
from cache.jobstore import JobRequest, JobStore
from core.errors import ServiceUnavailable, ValidationFailed
from core.registry import Registry
from core.settings import Settings
from core.text import plan_segments

log = logging.getLogger(__name__)


def submit_job(job: JobInput, *, settings: Settings, registry: Registry, store: JobStore, enqueue: Enqueue) -> str:
    """Plan the text into segments, write the job and enqueue its segments; return the id."""
    spec = registry.get(job.model)
    voice = spec.resolve_voice(job.voice)
    segments = plan_segments(
        job.text,
        max_chars=settings.segment_max_chars,
        first_max_chars=settings.first_segment_max_chars,
        language=spec.language,
    )
    if not segments:
        raise ValidationFailed("text", "has nothing a voice can speak (only symbols or emoji?)")
    priority = job.priority or ("batch" if len(job.text) > settings.batch_lane_chars else "realtime")
    request = JobRequest(
        model=spec.name,
        voice=voice,
        speed=job.speed,
        mode=job.mode,
        format=job.format,
        priority=priority,
        seed=job.seed,
    )
    job_id = store.create(request, segments)
    try:
        enqueue(job_id, list(range(len(segments))), priority)
    except Exception as e:
        store.fail(job_id, "could not enqueue the job's segments")
        raise ServiceUnavailable("the task queue is unavailable; retry shortly") from e
    log.info(
        "job accepted",
        extra={"job_id": job_id, "model": spec.name, "segments": len(segments), "lane": priority},
    )
    return job_id
