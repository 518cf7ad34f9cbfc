"""Fuzz the API from its own OpenAPI document: no 5xx, and every response matches the document."""

from __future__ import annotations

import pytest
import schemathesis
from flask import Flask
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from api import create_app
from api.openapi import DOCUMENT

# No 5xx, and every answer is one the document declares, with the declared shape and media type.
# (A schema-valid body can still be refused: text with nothing speakable, say; that is a 4xx, not a failure.)
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def fuzzed_app(settings_env: dict[str, str], worker: object) -> Flask:
    """Return an API wired to the test Redis with a live worker (so admission accepts jobs)."""
    return create_app({"redis_url": settings_env["REDIS_URL"], "models_file": settings_env["TTS_MODELS_FILE"],
                       "tiny_model_dir": settings_env["TTS_TINY_MODEL_DIR"], "default_model": "espeak-en",
                       "max_wait_s": 1.0})  # fmt: skip


@pytest.fixture(scope="module")
def fuzzed_schema(fuzzed_app: Flask) -> schemathesis.schemas.BaseSchema:
    """Load the OpenAPI document the app serves."""
    loaded = schemathesis.openapi.from_wsgi("/openapi.json", fuzzed_app)
    assert loaded.raw_schema == DOCUMENT
    return loaded


@pytest.mark.slow
def test_no_request_from_the_document_breaks_the_api(fuzzed_schema: schemathesis.schemas.BaseSchema) -> None:
    operations = [result.ok() for result in fuzzed_schema.get_all_operations()]
    assert len(operations) >= 10
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def call(case: schemathesis.Case) -> None:
            case.call_and_validate(checks=CHECKS)

        call()
