"""The service's one error tree: a client-facing branch (api/errors.py maps it to HTTP in one place) and a
worker-side branch (engines and model hosts).

Every class is the same few lines (a docstring, a status and a code): that is the shape of an error tree, one
class per thing a caller may want to catch, and it is kept so rather than generated.
"""

from __future__ import annotations

from typing import Any


class TTSError(Exception):
    """Raised when anything in the service fails in a way it foresaw; the root of every error it defines."""


class SettingsInvalid(TTSError, ValueError):
    """Raised at start-up when a setting has a value the service cannot run with; the message names its variable."""


class WorkerError(TTSError):
    """Raised when a worker cannot make audio: an engine, or the model host that runs it, failed."""


class EngineLoadError(WorkerError):
    """Raised when an engine cannot load its model; the message says where the weights must go."""


class SynthesisError(WorkerError):
    """Raised when an engine cannot turn a batch into exactly one waveform per request."""


class HostCrashed(SynthesisError):
    """Raised when a model host died or stopped answering during a call."""


class HostHung(HostCrashed):
    """Raised when a model host did not answer within the call's time limit (and was killed for it)."""


class ServiceError(TTSError):
    """Raised when a request cannot be served; base of every error a client sees."""

    status = 500
    code = "internal_error"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class BadRequest(ServiceError):
    """Raised when a request body is malformed (not parseable JSON)."""

    status = 400
    code = "bad_request"


class RequestTimeout(ServiceError):
    """Raised when a request's body stops arriving before it is whole."""

    status = 408
    code = "request_timeout"


class Unauthorized(ServiceError):
    """Raised when API keys are configured and a request has no valid one."""

    status = 401
    code = "unauthorized"


class NotFound(ServiceError):
    """Raised when a job, segment, model or voice does not exist."""

    status = 404
    code = "not_found"


class PayloadTooLarge(ServiceError):
    """Raised when a request body is over the configured size limit."""

    status = 413
    code = "payload_too_large"


class UnsupportedMediaType(ServiceError):
    """Raised when a request body is not declared as JSON."""

    status = 415
    code = "unsupported_media_type"


class ValidationFailed(ServiceError):
    """Raised when a field of a well-formed request is invalid."""

    status = 422
    code = "invalid_field"

    def __init__(self, field: str, message: str, **details: Any) -> None:
        details.setdefault("errors", [{"field": field, "message": message}])  # every 422 lists what is wrong
        super().__init__(f"{field}: {message}", field=field, **details)


class NotReady(ServiceError):
    """Raised when a segment or the audio of a job is not ready yet."""

    status = 409
    code = "not_ready"


class JobFailed(ServiceError):
    """Raised when the audio of a failed or canceled job is asked for."""

    status = 409
    code = "job_failed"


class Conflict(ServiceError):
    """Raised when a request contradicts what the service already took (a text stream's piece out of turn)."""

    status = 409
    code = "conflict"


class TooManyRequests(ServiceError):
    """Raised when a caller is over its own quota."""

    status = 429
    code = "too_many_requests"

    def __init__(self, message: str, *, retry_after: int, **details: Any) -> None:
        super().__init__(message, **details)
        self.retry_after = retry_after


class ServiceUnavailable(ServiceError):
    """Raised when Redis or the workers cannot take the request now."""

    status = 503
    code = "unavailable"

    def __init__(self, message: str, *, retry_after: int = 5, **details: Any) -> None:
        super().__init__(message, **details)
        self.retry_after = retry_after


class StoreFull(ServiceUnavailable):
    """Raised when the job store is at its memory budget: no new work until finished audio makes room."""

    code = "store_full"


class StoreTooSmall(PayloadTooLarge):
    """Raised when a job's audio would not fit in the job store's memory budget even with nothing else in it."""

    code = "store_too_small"


class Gone(ServiceError):
    """Raised when a finished job's audio is no longer kept (its audio TTL passed, or the memory budget needed it)."""

    status = 410
    code = "gone"


class TextOverLimit(PayloadTooLarge):
    """Raised when a text is over a job's limit once normalised: too many characters, or too many segments."""

    def __init__(self, problem: str, *, limit: int, setting: str) -> None:
        env = f"TTS_{setting.upper()}"
        super().__init__(f"text: {problem}; the limit is {limit:,} ({env})", field="text", limit=limit, setting=env)
