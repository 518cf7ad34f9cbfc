"""Read a request body into its contract model (api/contract.py); every problem becomes a ServiceError.

pydantic parses the raw bytes itself (its JSON parser is bounded: nesting deeper than 200, numbers out of range,
lone surrogates and invalid UTF-8 are parse errors, never a RecursionError or an OverflowError), so malformed JSON
is a 400 and a well-formed body with a wrong field is a 422 that names the field. The body itself is read within
bounds: an oversized one is a 413 at once; a malformed chunked body and one cut short are 400s, and one that stops
arriving (for ``BODY_WAIT_S``) a 408.
"""

from __future__ import annotations

import contextlib
import math
from typing import IO, Any, TypeVar

from flask import Request, Response, after_this_request
from gunicorn.http.errors import NoMoreData, ParseException
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails
from werkzeug.wsgi import get_input_stream

from api.contract import allowed_fields
from api.timeouts import within
from core.errors import BadRequest, PayloadTooLarge, RequestTimeout, UnsupportedMediaType, ValidationFailed

Body = TypeVar("Body", bound=BaseModel)
#: At most this many field errors are listed in one answer.
MAX_LISTED_ERRORS = 10
#: A body must have arrived whole this long after the view starts reading it; one that stops arriving is a 408.
BODY_WAIT_S = 10.0
#: Once its 413 is out, an oversized body is read and dropped up to this much, for this long, so that a client
#: still sending reads the answer rather than a reset connection.
DRAIN_MAX_BYTES = 64 * 2**20
DRAIN_MAX_S = 10.0
DRAIN_STEP = 64 * 1024


def read_body(request: Request, model: type[Body], *, max_bytes: int, context: dict[str, Any] | None = None) -> Body:
    """Return the request body parsed and checked as ``model``, or raise 413/415/400/422."""
    # Not request.stream: past MAX_CONTENT_LENGTH it cuts a chunked body short silently. This one ends at the
    # Content-Length, or where the server says the body ends (a chunked body), and has no limit of its own.
    stream: IO[bytes] = get_input_stream(request.environ, max_content_length=None)
    declared = request.content_length
    if declared is not None and declared > max_bytes:
        raise _too_large(stream, max_bytes)
    if not request.is_json:
        raise UnsupportedMediaType("send the body as JSON with 'Content-Type: application/json'")
    raw = _read(stream, max_bytes + 1)
    if len(raw) > max_bytes:
        raise _too_large(stream, max_bytes)
    if declared is not None and len(raw) < declared:  # gunicorn hands over what came before the client stopped
        raise BadRequest(f"request body is incomplete: {len(raw)} of the {declared} bytes its Content-Length announced")
    try:
        return model.model_validate_json(raw, context=context)
    except ValidationError as e:
        raise contract_error(e, model) from None


def _read(stream: IO[bytes], size: int) -> bytes:
    """Return up to ``size`` bytes of the body, or raise 400 for one that is malformed, 408 for one that stops
    arriving."""
    try:
        with within(BODY_WAIT_S, "the request body"):
            return stream.read(size)
    except TimeoutError as e:
        raise RequestTimeout(f"request body did not arrive within {BODY_WAIT_S:g} s; send it whole, at once") from e
    except NoMoreData as e:
        raise BadRequest("chunked request body ended before its last chunk (of size 0)") from e
    except ParseException as e:  # only a chunked body's framing (sizes, terminators, trailers) is parsed here
        raise BadRequest(f"chunked request body is malformed: {e}") from e
    except OSError as e:
        raise BadRequest(f"request body could not be read: {e}") from e


def _too_large(stream: IO[bytes], max_bytes: int) -> PayloadTooLarge:
    """Return the 413 to raise, and have what the client still sends read and dropped once the 413 is sent.

    A server that answers while its client is still sending, then closes (as it does for ``Connection: close``),
    resets the connection and the client never reads the answer; one that drains first leaves a client that waits
    for the answer waiting. So the answer goes out at once and the drain follows it (the response's close, which
    the server calls once it has written the answer), bounded by ``DRAIN_MAX_BYTES`` and ``DRAIN_MAX_S``.
    """

    @after_this_request
    def drain_once_sent(response: Response) -> Response:
        response.call_on_close(lambda: _drain(stream))
        return response

    return PayloadTooLarge(f"request body is over {max_bytes} bytes (TTS_MAX_BODY_BYTES)", limit=max_bytes)


def _drain(stream: IO[bytes]) -> None:
    """Read and drop the rest of the body, at most ``DRAIN_MAX_BYTES`` of it and for at most ``DRAIN_MAX_S``."""
    left = DRAIN_MAX_BYTES
    # The answer is out: a body that breaks off, stalls or is malformed now only ends the connection.
    with contextlib.suppress(OSError, ParseException), within(DRAIN_MAX_S, "the rest of the body"):
        while left > 0 and (chunk := stream.read(min(DRAIN_STEP, left))):
            left -= len(chunk)


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
        raise ValidationFailed("wait", f"must be between 0 and {limit:g} seconds", max=limit)
    return wait
