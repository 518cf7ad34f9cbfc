"""The Celery app factory shared by the API (to enqueue) and the workers (to consume)."""

from __future__ import annotations

from collections.abc import Callable

from celery import Celery

from celery_config import SYNTHESIZE_TASK, celery_settings, task_priority
from core.settings import Settings

#: Put segment tasks on a queue: (job id, segment indexes, queue name).
Enqueue = Callable[[str, list[int], str], None]


def create_celery(settings: Settings) -> Celery:
    """Build a Celery app configured from the settings object."""
    app = Celery("tts")
    app.config_from_object(celery_settings(settings))
    return app


def celery_enqueue(celery: Celery) -> Enqueue:
    """Return an Enqueue that sends one small task per segment, carrying ids only."""

    def enqueue(job_id: str, indexes: list[int], queue: str) -> None:
        with celery.producer_or_acquire() as producer:
            for index in indexes:
                celery.send_task(
                    SYNTHESIZE_TASK,
                    args=[job_id, index],
                    queue=queue,
                    priority=task_priority(queue, index),
                    producer=producer,
                )

    return enqueue
