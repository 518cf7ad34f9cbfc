"""Map every error to one JSON shape and the right HTTP status, in one place."""

from __future__ import annotations

import logging
from typing import Any

import redis
from flask import Flask, Response, jsonify, request
from werkzeug.exceptions import HTTPException

from api.contract import ErrorBody, ErrorDetail
from cache.connect import NoReplicasError
from cache.replication import RETRY_AFTER_S, Unreplicated
from core.errors import ServiceError, ServiceUnavailable, StoreFull, TooManyRequests

log = logging.getLogger(__name__)

_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
    429: "too_many_requests",
}


def error_response(status: int, code: str, message: str, /, **details: Any) -> Response:
    """Build the JSON error body every failure uses: the contract's ErrorBody, the one the document states."""
    body = ErrorBody(error=ErrorDetail(code=code, message=message, **details))
    response = jsonify(body.model_dump(mode="json", exclude_none=True))
    response.status_code = status
    return response


def retry_after_of(error: ServiceError) -> int | None:
    """Return the seconds a caller is told to wait before trying ``error``'s request again, or None: the
    Retry-After header over HTTP, the error event's ``retry_after`` on the voice socket."""
    if isinstance(error, (ServiceUnavailable, TooManyRequests)):
        return error.retry_after
    return 1 if error.code == "not_ready" else None


def _service_error(error: ServiceError) -> Response:
    response = error_response(error.status, error.code, error.message, **error.details)
    retry_after = retry_after_of(error)
    if retry_after is not None:
        response.headers["Retry-After"] = str(retry_after)
    return response


def _http_error(error: HTTPException) -> Response:
    status = error.code or 500
    code = _HTTP_CODES.get(status, "http_error")
    message = error.description or error.name
    allowed = getattr(error, "valid_methods", None)  # a 405's: its Allow header is required (RFC 9110)
    if allowed:
        message = f"{request.method} is not allowed here; this route takes {', '.join(sorted(allowed))}"
    response = error_response(status, code, message)
    for name, value in error.get_headers():  # Allow, WWW-Authenticate, Retry-After ...; not werkzeug's HTML type
        if name.lower() != "content-type":
            response.headers[name] = value
    return response


def _redis_down(error: redis.RedisError) -> Response:
    log.error("redis unavailable: %s", error)
    return _service_error(ServiceUnavailable("the job store (Redis) is unavailable; retry shortly", retry_after=5))


def _no_replicas(error: NoReplicasError) -> Response:
    log.error("the job store's primary refuses writes: %s", error)
    return _service_error(
        ServiceUnavailable(
            "the job store's primary refuses writes: none of its replicas answer it (it may be cut off while "
            "Sentinel promotes another); retry shortly",
            retry_after=5,
        )
    )


def unreplicated(error: Unreplicated) -> Response:
    """Answer 503 for what the job store could not confirm is on a replica (it is failing over)."""
    log.warning("the job store did not confirm an answer: %s", error)
    return _service_error(
        ServiceUnavailable(
            f"the job store could not confirm this answer: {error}; retry shortly", retry_after=RETRY_AFTER_S
        )
    )


def _store_full(error: redis.OutOfMemoryError) -> Response:
    log.warning("the job store refused a write at its memory limit: %s", error)
    return _service_error(
        StoreFull(
            "the job store is at its memory limit; finished audio is being removed: retry shortly", retry_after=10
        )
    )


def _unexpected(error: Exception) -> Response:
    log.exception("unhandled error")
    return error_response(500, "internal_error", "internal error; the service logged the details")


def init_app(app: Flask) -> None:
    """Register the handlers that turn every error into JSON."""
    app.register_error_handler(ServiceError, _service_error)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(redis.RedisError, _redis_down)
    app.register_error_handler(NoReplicasError, _no_replicas)
    app.register_error_handler(Unreplicated, unreplicated)
    app.register_error_handler(redis.OutOfMemoryError, _store_full)
    app.register_error_handler(Exception, _unexpected)
