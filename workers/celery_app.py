"""The Celery app factory shared by the API (to enqueue) and the workers (to consume)."""

from __future__ import annotations

from celery import Celery

from celery_config import celery_settings
from core.settings import Settings


def create_celery(settings: Settings) -> Celery:
    """Build a Celery app configured from the settings object."""
    app = Celery("tts")
    app.config_from_object(celery_settings(settings))
    return app
