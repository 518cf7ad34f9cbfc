"""The Flask API: an app factory wiring blueprints, error mapping and shared services."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from flask import Flask

from api import access, errors, health, jobs, metrics, openapi, served, speech, voice_socket, web
from api.services import Services, build_services, init_app
from core.logs import setup_logging
from core.settings import load_settings


def create_app(test_config: Mapping[str, Any] | None = None, *, services: Services | None = None) -> Flask:
    """Build the API app; ``test_config`` overrides settings, ``services`` replaces the clients."""
    settings = load_settings(**(test_config or {}))
    if not logging.getLogger().handlers:
        setup_logging(settings.log_level, fmt=settings.log_format)
    app = Flask(__name__, static_folder=None)  # the web blueprint serves api/static
    # Werkzeug checks Content-Length against this before a view reads the body.
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    app.json.ensure_ascii = False  # type: ignore[attr-defined]
    init_app(app, services or build_services(settings))
    errors.init_app(app)
    metrics.init_app(app)
    access.init_app(app)
    served.init_app(app, app.extensions["tts"].replication)
    app.register_blueprint(jobs.bp)
    app.register_blueprint(health.bp)
    app.register_blueprint(speech.bp)
    voice_socket.init_app(app)
    openapi.init_app(app, app.extensions["tts"].settings)
    app.register_blueprint(web.bp)
    registry = app.extensions["tts"].registry
    logging.getLogger(__name__).info(
        "API ready: default model %r (engine %s)", registry.default, registry.get(None).engine
    )
    return app
