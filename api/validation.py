"""Parse and check request bodies; every problem becomes a ServiceError naming the field."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from flask import Request

from core.audio import MEDIA_TYPES
from core.errors import BadRequest, PayloadTooLarge, UnsupportedMediaType, ValidationFailed

MODES = ("fast", "balanced", "quality")
PRIORITIES = ("realtime", "batch")
SPEED_RANGE = (0.5, 2.0)
SEED_MAX = 2**31 - 1
JOB_FIELDS = frozenset({"text", "model", "voice", "speed", "mode", "format", "priority", "seed", "cache"})


@dataclass(frozen=True)
class JobInput:
    """A checked POST /v1/jobs body; model and voice are still names to resolve."""

    text: str
    model: str | None
    voice: str | None
    speed: float
    mode: str
    format: str
    priority: str | None
    seed: int | None
    cache: bool = True


def read_json_object(request: Request, *, max_bytes: int) -> dict[str, Any]:
    """Return the request body as a JSON object, or raise 413/415/400/422."""
    if request.content_length is not None and request.content_length > max_bytes:
        raise PayloadTooLarge(f"request body is over {max_bytes} bytes")
    if not request.is_json:
        raise UnsupportedMediaType("send the body as JSON with 'Content-Type: application/json'")
    raw = request.get_data(cache=True)
    if len(raw) > max_bytes:
        raise PayloadTooLarge(f"request body is over {max_bytes} bytes")
    try:
        body = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise BadRequest("request body is not valid UTF-8") from e
    except json.JSONDecodeError as e:
        raise BadRequest(f"request body is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from e
    if not isinstance(body, dict):
        raise ValidationFailed("body", "must be a JSON object")
    return body


def _optional_str(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ValidationFailed(name, "must be a non-empty string")
    return value


def _choice(body: dict[str, Any], name: str, choices: tuple[str, ...], default: str | None) -> str | None:
    value = body.get(name, default)
    if value is None:
        return None
    if value not in choices:
        raise ValidationFailed(name, f"must be one of {list(choices)}")
    return str(value)


def _speed(body: dict[str, Any]) -> float:
    value = body.get("speed", 1.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValidationFailed("speed", "must be a number")
    low, high = SPEED_RANGE
    if not low <= value <= high:
        raise ValidationFailed("speed", f"must be between {low} and {high}")
    return float(value)


def _seed(body: dict[str, Any]) -> int | None:
    value = body.get("seed")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= SEED_MAX:
        raise ValidationFailed("seed", f"must be an integer from 0 to {SEED_MAX}")
    return value


def parse_job(body: dict[str, Any], *, max_chars: int) -> JobInput:
    """Check a POST /v1/jobs body field by field."""
    unknown = sorted(set(body) - JOB_FIELDS)
    if unknown:
        raise ValidationFailed(unknown[0], f"unknown field; allowed: {sorted(JOB_FIELDS)}")
    text = body.get("text")
    if not isinstance(text, str):
        raise ValidationFailed("text", "is required and must be a string")
    if not text.strip():
        raise ValidationFailed("text", "must not be empty")
    if len(text) > max_chars:
        raise ValidationFailed("text", f"is {len(text)} characters; the limit is {max_chars}")
    return JobInput(
        text=text,
        model=_optional_str(body, "model"),
        voice=_optional_str(body, "voice"),
        speed=_speed(body),
        mode=_choice(body, "mode", MODES, "balanced") or "balanced",
        format=_choice(body, "format", tuple(MEDIA_TYPES), "wav") or "wav",
        priority=_choice(body, "priority", PRIORITIES, None),
        seed=_seed(body),
        cache=_flag(body, "cache", default=True),
    )


def _flag(body: dict[str, Any], name: str, *, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise ValidationFailed(name, "must be true or false")
    return value


def parse_wait(raw: str | None, *, limit: float) -> float:
    """Return the long-poll time asked for with ?wait=, or raise 422."""
    if raw is None or raw == "":
        return 0.0
    try:
        wait = float(raw)
    except ValueError as e:
        raise ValidationFailed("wait", "must be a number of seconds") from e
    if not math.isfinite(wait) or not 0 <= wait <= limit:
        raise ValidationFailed("wait", f"must be between 0 and {limit:g} seconds")
    return wait
