"""The OpenAPI document, served at /openapi.json: every schema is generated from the contract's models
(api/contract.py), the ones that parse the requests. Only what no model says is written here: the paths,
their parameters (path, query, header) and which answers each may give."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Flask, current_app
from pydantic.json_schema import models_json_schema

from api.contract import SCHEMAS
from core.settings import Settings

bp = Blueprint("openapi", __name__)

_REF = "#/components/schemas/{model}"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF.format(model=name)}


def _json(name: str, description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref(name)}}}


def _errors(*statuses: int) -> dict[str, Any]:
    return {str(status): _json("ErrorBody", "error") for status in statuses}


def _audio(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"audio/*": {"schema": {"type": "string", "format": "binary"}}}}


def _body(name: str) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": _ref(name)}}}


def _components(settings: Settings) -> dict[str, Any]:
    _, top = models_json_schema(SCHEMAS, ref_template=_REF)
    schemas: dict[str, Any] = top["$defs"]
    # The text limit is a setting, checked with the model's validation context: state this app's value.
    schemas["JobBody"]["properties"]["text"]["maxLength"] = settings.max_text_chars
    schemas["SpeechBody"]["properties"]["input"]["maxLength"] = settings.max_text_chars
    schemas["TextPieceBody"]["properties"]["text"]["maxLength"] = settings.max_text_chars
    return schemas


def _job_paths(settings: Settings) -> dict[str, Any]:
    """Return the paths of jobs: submit, status, cancel, and their audio as segments, a file or events."""
    job_id = {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string", "maxLength": 64}}
    wait = {"name": "wait", "in": "query", "schema": {"type": "number", "minimum": 0, "maximum": settings.max_wait_s}}
    job = _json("JobView", "the job")
    auth = (401, 404) if settings.api_keys else (404,)
    return {
        "/v1/jobs": {
            "post": {
                "summary": "Submit text; answers at once with a job id.",
                "parameters": [
                    {"name": "Idempotency-Key", "in": "header", "schema": {"type": "string", "maxLength": 255}}
                ],
                "requestBody": _body("JobBody"),
                "responses": {"202": _json("JobView", "accepted"),
                              **_errors(400, 401, 404, 408, 413, 415, 422, 429, 503)},
            }
        },
        "/v1/jobs/{job_id}": {
            "get": {"summary": "Status and progress.", "parameters": [job_id],
                    "responses": {"200": job, **_errors(*auth, 503)}},
            "delete": {"summary": "Cancel (a job that already ended is answered as it is; its audio and record "
                                  "expire on their own).", "parameters": [job_id],
                       "responses": {"200": job, **_errors(*auth, 503)}},
        },
        "/v1/jobs/{job_id}/text": {
            "post": {
                "summary": "Append one piece to a text stream (a job opened with text_stream: true), in seq order.",
                "parameters": [job_id],
                "requestBody": _body("TextPieceBody"),
                "responses": {"200": _json("PieceView", "taken, or a retry answered again"),
                              **_errors(400, *auth, 408, 409, 413, 415, 422, 503)},
            }
        },
        "/v1/jobs/{job_id}/segments/{index}": {
            "get": {
                "summary": "One segment's audio; 409 not_ready until it exists.",
                "parameters": [job_id, {"name": "index", "in": "path", "required": True,
                                        "schema": {"type": "integer", "minimum": 0}}, wait],
                "responses": {"200": _audio("segment audio"), **_errors(*auth, 409, 410, 422, 429, 503)},
            }
        },
        "/v1/jobs/{job_id}/audio": {
            "get": {"summary": "The whole audio; grows while the job runs (wav, pcm, mp3, opus, ogg), a fragment at "
                               "a time as it is made.",
                    "parameters": [job_id, wait],
                    "responses": {"200": _audio("whole audio"), **_errors(*auth, 409, 410, 422, 429, 503)}},
        },
        "/v1/jobs/{job_id}/events": {
            "get": {"summary": "Server-sent events: one per finished segment (id = index), with ?fragments=1 one per "
                               "fragment of audio before it (id = index.n, the audio inline), then the end.",
                    "parameters": [job_id, *_event_parameters()],
                    "responses": {"200": {"description": "event stream: each segment event's data is a SegmentEvent, "
                                                         "each fragment event's a FragmentEvent",
                                          "content": {"text/event-stream": {}}},
                                  **_errors(*auth, 410, 422, 429, 503)}},
        },
    }  # fmt: skip


def _event_parameters() -> list[dict[str, Any]]:
    """Return the event stream's parameters: whether to send fragments, and the event to resume after."""
    event_id = {"type": "string", "pattern": r"^[0-9]{1,9}(\.[0-9]{1,9})?$", "maxLength": 19}
    resume = "Resume after this event: <index> (a segment's) or <index>.<n> (a fragment's)."
    return [
        {"name": "fragments", "in": "query", "schema": {"type": "string", "enum": ["1", "0", "true", "false"]},
         "description": "1: a fragment event for each fragment of audio as it is made, its audio inline; 0 (the "
                        "default): segment events only."},
        {"name": "Last-Event-ID", "in": "header", "schema": event_id, "description": resume},
        {"name": "last_event_id", "in": "query", "schema": event_id, "description": f"{resume} (Last-Event-ID wins)"},
    ]  # fmt: skip


def _service_paths() -> dict[str, Any]:
    """Return the paths beside jobs: speech in one call, the model registry, health and metrics."""
    return {
        "/v1/audio/speech": {
            "post": {
                "summary": "OpenAI-compatible speech; audio chunked as its fragments are made.",
                "requestBody": _body("SpeechBody"),
                "responses": {"200": _audio("speech"), **_errors(400, 401, 404, 408, 409, 413, 415, 422, 429, 503)},
            }
        },
        "/v1/models": {"get": {"summary": "The model registry.",
                               "responses": {"200": _json("ModelsView", "models"), **_errors(401)}}},
        "/healthz": {"get": {"summary": "Liveness.", "responses": {"200": {"description": "alive"}}}},
        "/readyz": {"get": {"summary": "Redis answers and a worker is alive.",
                            "responses": {"200": {"description": "ready"}, **_errors(503)}}},
        "/metrics": {"get": {"summary": "Prometheus metrics.", "responses": {"200": {"description": "metrics"}}}},
    }  # fmt: skip


def build_document(settings: Settings) -> dict[str, Any]:
    """Return the OpenAPI 3.1 document of this app (its limits come from ``settings``)."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "tts-queue",
            "version": "1",
            "description": "Task-queue TTS: submit, poll, stream. With API keys on, send "
            "'Authorization: Bearer <key>' (or 'X-API-Key'); a job answers only the key that submitted it.",
        },
        "paths": {**_job_paths(settings), **_service_paths()},
        "components": {
            "schemas": _components(settings),
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
            },
        },
    }


@bp.get("/openapi.json")
def openapi() -> dict[str, Any]:
    """Return the OpenAPI document."""
    document: dict[str, Any] = current_app.extensions["tts_openapi"]
    return document


def init_app(app: Flask, settings: Settings) -> None:
    """Build the document once, from the app's settings, and serve it."""
    app.extensions["tts_openapi"] = build_document(settings)
    app.register_blueprint(bp)
