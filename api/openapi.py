"""The OpenAPI document of the HTTP contract, served at /openapi.json."""

from __future__ import annotations

from typing import Any

from flask import Blueprint

from api.validation import JOB_FIELDS, MODES, PRIORITIES, SEED_MAX, SPEED_RANGE
from core.audio import MEDIA_TYPES

bp = Blueprint("openapi", __name__)

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {"code": {"type": "string"}, "message": {"type": "string"}, "field": {"type": "string"}},
        }
    },
}
_JOB = {
    "type": "object",
    "required": ["id", "status", "segments_total", "segments_done"],
    "properties": {
        "id": {"type": "string"},
        "status": {"enum": ["queued", "running", "done", "failed", "canceled"]},
        "segments_total": {"type": "integer", "minimum": 1},
        "segments_done": {"type": "integer", "minimum": 0},
        "cached_segments": {"type": "integer", "minimum": 0},
        "progress": {"type": "number"},
        "first_due_at": {"type": "number", "nullable": True, "description": "When segment 0 is due (epoch seconds)."},
        "start_estimate_s": {
            "type": "number",
            "nullable": True,
            "description": "Estimated seconds from acceptance until the first segment starts.",
        },
        "audio_expires_at": {
            "type": "number",
            "nullable": True,
            "description": "When a finished job's audio stops being kept (epoch seconds); 410 gone after it.",
        },
        "audio_removed_at": {
            "type": "number",
            "nullable": True,
            "description": "When the memory budget removed a finished job's audio early (epoch seconds).",
        },
        "error": {"type": "string"},
        "urls": {"type": "object"},
    },
}
_JOB_REQUEST_FIELDS: dict[str, Any] = {
    "text": {"type": "string", "minLength": 1},
    "model": {"type": "string"},
    "voice": {"type": "string"},
    "speed": {"type": "number", "minimum": SPEED_RANGE[0], "maximum": SPEED_RANGE[1]},
    "mode": {"enum": list(MODES)},
    "format": {"enum": list(MEDIA_TYPES)},
    "priority": {"enum": list(PRIORITIES)},
    "seed": {"type": "integer", "minimum": 0, "maximum": SEED_MAX},
    "cache": {"type": "boolean"},
}
if set(_JOB_REQUEST_FIELDS) != JOB_FIELDS:
    raise RuntimeError("api/openapi.py must document exactly the fields api/validation.py accepts")
_JOB_REQUEST = {
    "type": "object",
    "required": ["text"],
    "additionalProperties": False,
    "properties": _JOB_REQUEST_FIELDS,
}


def _errors(*statuses: int) -> dict[str, Any]:
    return {str(s): {"description": "error", "content": {"application/json": {"schema": _ERROR}}} for s in statuses}


def _audio(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"audio/*": {"schema": {"type": "string", "format": "binary"}}}}


_JOB_ID = {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string"}}
_JSON_JOB = {"application/json": {"schema": _JOB}}
_WAIT = {"name": "wait", "in": "query", "schema": {"type": "number", "minimum": 0, "maximum": 30}}

DOCUMENT: dict[str, Any] = {
    "openapi": "3.0.3",
    "info": {"title": "tts-queue", "version": "1", "description": "Task-queue TTS: submit, poll, stream."},
    "paths": {
        "/v1/jobs": {
            "post": {
                "summary": "Submit text; answers at once with a job id.",
                "parameters": [{"name": "Idempotency-Key", "in": "header", "schema": {"type": "string"}}],
                "requestBody": {"required": True, "content": {"application/json": {"schema": _JOB_REQUEST}}},
                "responses": {"202": {"description": "accepted", "content": _JSON_JOB},
                              **_errors(400, 401, 404, 413, 415, 422, 429, 503)},
            }
        },
        "/v1/jobs/{job_id}": {
            "get": {"summary": "Status and progress.", "parameters": [_JOB_ID],
                    "responses": {"200": {"description": "the job", "content": _JSON_JOB}, **_errors(401, 404)}},
            "delete": {"summary": "Cancel.", "parameters": [_JOB_ID],
                       "responses": {"200": {"description": "canceled", "content": _JSON_JOB}, **_errors(401, 404)}},
        },
        "/v1/jobs/{job_id}/segments/{index}": {
            "get": {
                "summary": "One segment's audio; 409 not_ready until it exists.",
                "parameters": [_JOB_ID, {"name": "index", "in": "path", "required": True,
                                         "schema": {"type": "integer", "minimum": 0}},
                               _WAIT],
                "responses": {"200": _audio("segment audio"), **_errors(401, 404, 409, 410, 422, 429, 503)},
            }
        },
        "/v1/jobs/{job_id}/audio": {
            "get": {"summary": "The whole audio; grows while the job runs (wav, pcm, mp3, opus, ogg).",
                    "parameters": [_JOB_ID, {"name": "wait", "in": "query", "schema": {"type": "number"}}],
                    "responses": {"200": _audio("whole audio"), **_errors(401, 404, 409, 410, 422, 429, 503)}},
        },
        "/v1/jobs/{job_id}/events": {
            "get": {"summary": "Server-sent events: one per finished segment (id = index), then the end.",
                    "parameters": [_JOB_ID, {"name": "Last-Event-ID", "in": "header", "schema": {"type": "string"}}],
                    "responses": {"200": {"description": "event stream", "content": {"text/event-stream": {}}},
                                  **_errors(401, 404, 422, 429, 503)}},
        },
        "/v1/audio/speech": {
            "post": {
                "summary": "OpenAI-compatible speech; audio chunked as segments finish.",
                "requestBody": {"required": True, "content": {"application/json": {"schema": {
                    "type": "object", "required": ["input"],
                    "properties": {"model": {"type": "string"}, "input": {"type": "string"},
                                   "voice": {"type": "string"},
                                   "response_format": {"enum": ["mp3", "opus", "flac", "wav", "pcm"]},
                                   "speed": {"type": "number"}}}}}},
                "responses": {"200": _audio("speech"), **_errors(400, 401, 404, 413, 415, 422, 429, 503)},
            }
        },
        "/v1/models": {"get": {"summary": "The model registry.",
                               "responses": {"200": {"description": "models", "content": {"application/json": {
                                   "schema": {"type": "object", "required": ["default", "data"]}}}},
                                   **_errors(401)}}},
        "/healthz": {"get": {"summary": "Liveness.", "responses": {"200": {"description": "alive"}}}},
        "/readyz": {"get": {"summary": "Redis answers and a worker is alive.",
                            "responses": {"200": {"description": "ready"}, **_errors(503)}}},
        "/metrics": {"get": {"summary": "Prometheus metrics.", "responses": {"200": {"description": "metrics"}}}},
    },
}  # fmt: skip


@bp.get("/openapi.json")
def openapi() -> dict[str, Any]:
    """Return the OpenAPI document."""
    return DOCUMENT
