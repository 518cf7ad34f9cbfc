"""Turn a checked request into a durable, enqueued job (no Flask in here)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable

import redis

from api.contract import JobBody
from cache.jobstore import JobRequest, JobStore
from cache.schedule import ScheduleBook
from cache.sentences import SentenceCache, segment_keys
from core.errors import ServiceUnavailable, ValidationFailed
from core.metrics import CACHE_LOOKUPS, JOBS_SUBMITTED
from core.registry import Registry
from core.schedule import timeline
from core.settings import Settings, deadline_policy
from core.text import plan_segments
from workers.celery_app import Enqueue

log = logging.getLogger(__name__)


def submit_job(
    job: JobBody,
    *,
    owner: str = "",
    cache_scope: str = "",
    settings: Settings,
    registry: Registry,
    store: JobStore,
    cache: SentenceCache,
    enqueue: Enqueue,
    book: ScheduleBook,
    admit: Callable[[str, float], float] | None = None,
    check_room: Callable[[], None] | None = None,
) -> str:
    """Plan the text, fill what the cache has, write the job and enqueue only the misses; return the id.

    ``admit(lane, first deadline)`` raises ServiceUnavailable when the job cannot start in time,
    and otherwise returns the estimated seconds until its first segment starts. ``check_room()`` raises
    StoreFull when the job store has no room for another job's audio. ``owner`` (a caller id, or "" with keys
    off) is the only caller the job's routes answer; ``cache_scope`` is whose sentence-cache entries it may reuse.
    """
    spec = registry.get(job.model)
    voice = spec.resolve_voice(job.voice)
    # Raises TextOverLimit (413) as soon as the normalised text is over either limit: nothing is written.
    texts = plan_segments(
        job.text,
        max_chars=settings.segment_max_chars,
        first_max_chars=settings.first_segment_max_chars,
        language=spec.language,
        max_total_chars=settings.max_text_chars,
        max_segments=settings.max_segments,
    )
    if not texts:
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
        cache=job.cache,
        cache_scope=cache_scope,
    )
    keys = segment_keys(spec, request, texts)
    cached = cache.get_many(keys) if request.cache else [None] * len(texts)
    accepted_at = time.time()
    hits = {
        i: (c.audio, c.sample_rate, {**c.meta, "cached": True, "finished_at": round(accepted_at, 4)})
        for i, c in enumerate(cached)
        if c is not None
    }
    misses = [i for i, c in enumerate(cached) if c is None]
    if request.cache:
        CACHE_LOOKUPS.labels("hit").inc(len(hits))
        CACHE_LOOKUPS.labels("miss").inc(len(misses))

    pace = book.seconds_per_char(spec.name)
    deadlines = timeline(
        lane=priority,
        accepted_at=accepted_at,
        chars=[len(t) for t in texts],
        seconds_per_char=pace,
        policy=deadline_policy(settings),
        arrivals=dict.fromkeys(hits, accepted_at),
    ).deadlines(accepted_at)
    start_estimate = 0.0
    if check_room is not None:
        check_room()
    if misses and admit is not None:
        # Raises 503 before anything is written: never 202 for work we cannot do.
        start_estimate = admit(priority, deadlines[misses[0]])
    # Feed long jobs through a window: a book's segments enter the queue as its earlier ones finish,
    # so a second book (or a short request on the same lane) is not stuck behind the whole first one.
    window = settings.enqueue_window_batch if priority == "batch" else settings.enqueue_window_realtime
    first, later = misses[:window], misses[window:]
    fields = {
        "created_at": f"{accepted_at:.6f}",
        "seconds_per_char": f"{pace:.5f}",
        "first_due_at": f"{deadlines[0]:.3f}",
        "start_estimate_s": f"{start_estimate:.1f}",
        "owner": owner,
    }
    # The first window waits in the outbox until it is enqueued: an API killed in between leaves it to a worker.
    job_id = store.create(request, texts, cached=len(hits), pending=later, publish=first, fields=fields)
    if hits:
        try:
            store.write_segments(job_id, hits)
        except redis.RedisError:
            with contextlib.suppress(redis.RedisError):  # never a half-written job that looks fine
                store.fail(job_id, "could not write its cached segments (the job store is full or unavailable)")
            raise
    if misses:  # else every segment was cached: the job is done before the answer leaves
        try:
            book.add(job_id, {i: deadlines[i] for i in first})
            by_deadline = [deadlines[i] for i in first] if settings.scheduler == "deadline" else None
            enqueue(job_id, first, priority, by_deadline)
        except Exception as e:
            store.fail(job_id, "could not enqueue the job's segments")
            book.remove(job_id, first)
            raise ServiceUnavailable("the task queue is unavailable; retry shortly") from e
        with contextlib.suppress(redis.RedisError):  # enqueued: an entry left behind is only published twice
            store.published(job_id, first)
    JOBS_SUBMITTED.labels(priority).inc()
    log.info(
        "job %s accepted: model %s, %d segments (%d cached), lane %s",
        job_id,
        spec.name,
        len(texts),
        len(hits),
        priority,
    )
    return job_id
