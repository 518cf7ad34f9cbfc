"""The Celery app factory shared by the API (to enqueue) and the workers (to consume)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

from celery import Celery

from celery_config import SYNTHESIZE_TASK, celery_settings
from core.schedule import priority_step
from core.settings import Settings
from workers import broker


class Enqueue(Protocol):
    """Put segment tasks on a lane's queue, each at the broker step its deadline earns (none: step 0)."""

    def __call__(
        self, job_id: str, indexes: list[int], lane: str, deadlines: Sequence[float] | None = None
    ) -> None: ...


def create_celery(settings: Settings) -> Celery:
    """Build a Celery app configured from the settings object."""
    broker.install()  # a lost broker connection must not stop a worker (see workers/broker.py)
    app = Celery("tts")
    app.config_from_object(celery_settings(settings))
    return app


def celery_enqueue(celery: Celery) -> Enqueue:
    """Return an Enqueue that sends one small task per segment, carrying ids only.

    A job's tasks go in one Redis round trip: kombu's publish batch (5.7) buffers their LPUSHes in one pipeline and
    sends them as the batch closes, or none of them when building one fails. A pipeline is not retried, so a broker
    that fails mid-send fails the enqueue; every caller already treats that as "not enqueued" (the API fails the
    job with a 503, the janitor keeps its outbox entry, the reconciler tries again).
    """

    def enqueue(job_id: str, indexes: list[int], lane: str, deadlines: Sequence[float] | None = None) -> None:
        now = time.time()
        steps = [0] * len(indexes) if deadlines is None else [priority_step(d, now) for d in deadlines]
        with celery.producer_or_acquire() as producer, producer.batch():
            for index, step in zip(indexes, steps, strict=True):
                celery.send_task(
                    SYNTHESIZE_TASK,
                    args=[job_id, index],
                    queue=lane,
                    priority=step,
                    producer=producer,
                )

    return enqueue
