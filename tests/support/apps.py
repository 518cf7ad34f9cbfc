"""The API app as the tests build it: wired to the session's Redis, models file and tiny model."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flask import Flask

from api import create_app


def api_app(settings_env: Mapping[str, str], **overrides: Any) -> Flask:
    """Build the API on the test Redis with espeak-en as the default model; ``overrides`` set other settings."""
    return create_app(
        {
            "redis_url": settings_env["REDIS_URL"],
            "models_file": settings_env["TTS_MODELS_FILE"],
            "tiny_model_dir": settings_env["TTS_TINY_MODEL_DIR"],
            "default_model": "espeak-en",
            **overrides,
        }
    )
