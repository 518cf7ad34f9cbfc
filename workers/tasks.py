"""Celery tasks: thin wrappers that carry ids and call plain functions."""

from __future__ import annotations

import logging

import redis
from celery import Task, shared_task

from celery_config import SYNTHESIZE_TASK
from core.errors import EngineLoadError, ServiceError, StoreFull
from core.metrics import SEGMENT_FAILURES, SEGMENT_RETRIES
from workers.runtime import WorkerRuntime, runtime_of

log = logging.getLogger(__name__)


@shared_task(  # type: ignore[untyped-decorator]
    name=SYNTHESIZE_TASK,
    bind=True,
    autoretry_for=(redis.ConnectionError, redis.TimeoutError),
    retry_backoff=True,
    max_retries=5,
)
def synthesize_segment(self: Task, job_id: str, index: int, room_waits: int = 0) -> str:
    """Synthesise one segment of a job; retry engine failures, then fail the job with the reason.

    ``room_waits`` counts the retries spent waiting for room in a full store: they are not new attempts.
    """
    runtime = runtime_of(self.app)
    # The same message delivered again (kombu's restore, a duplicate publish) carries the same id and retry
    # count: one attempt. A retry is a new message with the count raised: a new attempt, unless it only waited
    # for room in the store.
    token = f"{self.request.id}:{self.request.retries - room_waits}"
    runtime.synthesizer.started(job_id, index)
    try:
        return _synthesize(self, runtime, job_id, index, token=token, room_waits=room_waits)
    finally:
        runtime.synthesizer.let_go(job_id, index)  # held since its delivery (workers/__main__.py)


def _synthesize(task: Task, runtime: WorkerRuntime, job_id: str, index: int, *, token: str, room_waits: int) -> str:
    """Run one segment; fail its job for requests no retry can serve; raise what a retry should try again."""
    try:
        return runtime.synthesizer.run(job_id, index, token=token).value
    except (redis.ConnectionError, redis.TimeoutError):
        runtime.janitor.alarm()  # a delivery or a reply may be lost with the connection: account soon
        raise  # Redis is away: autoretry with backoff; the segment is not at fault.
    except (StoreFull, redis.OutOfMemoryError) as e:
        # The store is at its memory limit: not the segment's fault, and no engine failure (the breaker stays
        # shut), nor a new attempt (the same token). Retried until there is room (the retry limit is for
        # engine failures; the job's deadline still bounds the wait).
        log.warning("job %s segment %d waits for room in the store: %s", job_id, index, e)
        runtime.janitor.alarm()
        raise task.retry(
            exc=e, countdown=10, kwargs={"room_waits": room_waits + 1}, max_retries=task.request.retries + 1
        ) from e
    except ServiceError as e:
        # The request itself cannot be served (say, its model left the registry): no retry helps.
        runtime.store.fail(job_id, f"segment {index}: {e.message}")
        return "failed"
    except Exception as e:
        reason = f"segment {index}: {type(e).__name__}: {e}"
        if not isinstance(e, EngineLoadError):
            # The breaker's outcomes judge the engines that serve. A model that cannot load is that model's fault
            # (its jobs fail with the reason, its load failures are counted), not every tenant's and model's.
            runtime.synthesizer.stats.record(failed=1)
        if runtime.store.count_failure(job_id, index) >= runtime.settings.segment_max_attempts:
            log.error("giving up on job %s: %s", job_id, reason)
            SEGMENT_FAILURES.inc()
            runtime.store.fail(job_id, reason)
            return "failed"
        log.warning("retrying job %s: %s", job_id, reason)
        SEGMENT_RETRIES.inc()
        raise task.retry(exc=e, countdown=1) from e
