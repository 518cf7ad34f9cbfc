"""Read a request body into its contract model (api/contract.py); every problem becomes a ServiceError.

pydantic parses the raw bytes itself (its JSON parser is bounded: nesting deeper than 200, numbers out of range,
lone surrogates and invalid UTF-8 are parse errors, never a RecursionError or an OverflowError), so malformed JSON
is a 400 and a well-formed body with a wrong field is a 422 that names the field.
"""

from __future__ import annotations

import math
import time
from typing import IO, Any, TypeVar

from flask import Request
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails
from werkzeug.wsgi import get_input_stream

from api.contract import allowed_fields
from core.errors import BadRequest, PayloadTooLarge, UnsupportedMediaType, ValidationFailed

Body = TypeVar("Body", bound=BaseModel)
#: At most this many field errors are listed in one answer.
MAX_LISTED_ERRORS = 10
#: An oversized body is read and dropped up to this much, for this long, so that its client can read the 413.
DRAIN_MAX_BYTES = 64 * 2**20
DRAIN_MAX_S = 10.0
DRAIN_STEP = 64 * 1024


def _too_large(stream: IO[bytes], max_bytes: int) -> PayloadTooLarge:
    """Read what the client still sends and drop it, then return the 413 to raise.

    A server that answers while its client is still sending, then closes (as it does for ``Connection: close``),
    resets the connection and the client never reads the answer. Draining costs no CPU to speak of (greenlets
    wait on the socket) and is bounded: past ``DRAIN_MAX_BYTES`` or ``DRAIN_MAX_S`` the connection is dropped.
    """
    left, give_up = DRAIN_MAX_BYTES, time.monotonic() + DRAIN_MAX_S
    while left > 0 and time.monotonic() < give_up and (chunk := stream.read(min(DRAIN_STEP, left))):
        left -= len(chunk)
    return PayloadTooLarge(f"request body is over {max_bytes} bytes (TTS_MAX_BODY_BYTES)", limit=max_bytes)


def read_body(request: Request, model: type[Body], *, max_bytes: int, context: dict[str, Any] | None = None) -> Body:
    """Return the request body parsed and checked as ``model``, or raise 413/415/400/422."""
    # Not request.stream: past MAX_CONTENT_LENGTH it cuts a chunked body short silently. This one ends at the
    # Content-Length, or where the server says the body ends (a chunked body), and has no limit of its own.
    stream: IO[bytes] = get_input_stream(request.environ, max_content_length=None)
    if request.content_length is not None and request.content_length > max_bytes:
        raise _too_large(stream, max_bytes)
    if not request.is_json:
        raise UnsupportedMediaType("send the body as JSON with 'Content-Type: application/json'")
    raw = stream.read(max_bytes + 1)
    if len(raw) > max_bytes:
        raise _too_large(stream, max_bytes)
    try:
        return model.model_validate_json(raw, context=context)
    except ValidationError as e:
        raise contract_error(e, model) from None


def _field(error: ErrorDetails) -> str:
    return ".".join(str(part) for part in error["loc"]) or "body"


def _message(error: ErrorDetails, model: type[BaseModel]) -> str:
    kind = error["type"]
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        return f"unknown field; allowed: {allowed_fields(model)}"
    if kind == "model_type":
        return "must be a JSON object"
    message = error["msg"]
    if kind == "value_error":  # our own validators' words, after pydantic's "Value error, "
        message = message.removeprefix("Value error, ")
    return message[:1].lower() + message[1:]


def contract_error(error: ValidationError, model: type[BaseModel]) -> BadRequest | ValidationFailed:
    """Map pydantic's errors to ours: a JSON syntax error is 400; a wrong field is 422 naming it (and the rest)."""
    found = error.errors(include_url=False, include_input=False)
    for item in found:
        if item["type"] == "json_invalid":
            reason = item["msg"].removeprefix("Invalid JSON: ")
            return BadRequest(f"request body is not valid JSON: {reason}")
    listed = [{"field": _field(e), "message": _message(e, model)} for e in found[:MAX_LISTED_ERRORS]]
    first = listed[0]
    return ValidationFailed(first["field"], first["message"], errors=listed)


def parse_wait(raw: str | None, *, limit: float) -> float:
    """Return the long-poll time asked for with ?wait=, or raise 422."""
    if raw is None or raw == "":
        return 0.0
    try:
        wait = float(raw) if len(raw) <= 32 else math.nan
    except ValueError as e:
        raise ValidationFailed("wait", "must be a number of seconds") from e
    if not math.isfinite(wait) or not 0 <= wait <= limit:
        raise ValidationFailed("wait", f"must be between 0 and {limit:g} seconds")
    return wait
