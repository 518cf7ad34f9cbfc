"""Fuzz the API from its own OpenAPI document (generated from the contract's models): no 5xx, and every response
matches the document."""

from __future__ import annotations

from collections.abc import Iterator

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

# No 5xx, and every answer is one the document declares, with the declared shape and media type.
# (A schema-valid body can still be refused: text with nothing speakable, say; that is a 4xx, not a failure.)
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


#: With keys on, the fuzzer sends this one; the document then also declares the 401s and another key's 404s.
FUZZ_KEY = "fuzz-key-0123456789abcdef"


@pytest.fixture(scope="module", params=["keys off", "keys on"])
def fuzzed_app(request: pytest.FixtureRequest, settings_env: dict[str, str], worker: object) -> Iterator[Flask]:
    """Return an API wired to the test Redis with a live worker (so admission accepts jobs)."""
    keys = FUZZ_KEY if request.param == "keys on" else ""
    app = create_app({"redis_url": settings_env["REDIS_URL"], "models_file": settings_env["TTS_MODELS_FILE"],
                       "tiny_model_dir": settings_env["TTS_TINY_MODEL_DIR"], "default_model": "espeak-en",
                       "max_wait_s": 1.0, "api_keys": keys})  # fmt: skip
    yield app
    app.extensions["tts"].close()


@pytest.fixture(scope="module")
def fuzzed_schema(fuzzed_app: Flask) -> schemathesis.schemas.BaseSchema:
    """Load the OpenAPI document the app serves."""
    loaded = schemathesis.openapi.from_wsgi("/openapi.json", fuzzed_app)
    assert loaded.raw_schema == fuzzed_app.extensions["tts_openapi"]  # generated from api/contract.py's models
    return loaded


@pytest.mark.slow
def test_no_request_from_the_document_breaks_the_api(
    fuzzed_app: Flask, fuzzed_schema: schemathesis.schemas.BaseSchema
) -> None:
    headers = {"Authorization": f"Bearer {FUZZ_KEY}"} if fuzzed_app.extensions["tts"].keys else None
    operations = [result.ok() for result in fuzzed_schema.get_all_operations()]
    assert len(operations) >= 10
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def call(case: schemathesis.Case) -> None:
            case.call_and_validate(checks=CHECKS, headers=headers)

        call()
