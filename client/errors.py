"""The client's one error, and reading the service's JSON answers: bounded in size and time, errors parsed."""

from __future__ import annotations

import json
from typing import Any

import requests

from client.deadline import Watchdog, shutter

#: The most a JSON answer (a job's record, the model list, an error) is read: a larger one is not the service's.
MAX_ANSWER_BYTES = 1 << 20
#: The longest a JSON answer's body may take to arrive, however it trickles (the client's ``timeout`` by default).
ANSWER_WITHIN_S = 30.0


class TTSClientError(Exception):
    """Raised when the service answers with an error, cannot be reached, or a job fails.

    ``details`` holds the error body's other keys (a text piece's 409 says its ``reason``: conflict, after_final,
    final_before_taken, closed, over, too_far); ``retry_after`` is the Retry-After header's seconds, when the
    answer had one.
    """

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        details: dict[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details = details or {}
        self.retry_after = retry_after

    @property
    def reason(self) -> str | None:
        """The error body's ``reason`` (why a text piece was refused), if it has one."""
        reason = self.details.get("reason")
        return None if reason is None else str(reason)


def error_from(response: requests.Response, *, within_s: float = ANSWER_WITHIN_S) -> TTSClientError:
    try:
        retry_after: float | None = float(response.headers["Retry-After"])
    except (KeyError, ValueError):
        retry_after = None
    try:
        body = read_answer(response, within_s=within_s)["error"]
        details = {k: v for k, v in body.items() if k not in ("code", "message")}
        return TTSClientError(
            response.status_code,
            str(body["code"]),
            str(body.get("message", "")),
            details=details,
            retry_after=retry_after,
        )
    except (TTSClientError, KeyError, TypeError, AttributeError):
        return TTSClientError(response.status_code, "http_error", response.reason or "", retry_after=retry_after)


def read_answer(response: requests.Response, *, within_s: float = ANSWER_WITHIN_S) -> dict[str, Any]:
    """Read a JSON object answer, at most ``MAX_ANSWER_BYTES`` of it and within ``within_s``; raise TTSClientError
    (``bad_answer``) for one that is larger, not JSON or not an object: a server that is not the TTS service (or a
    proxy's page); ``unreachable`` for one that broke off or took longer."""
    where = f"{response.request.method} {response.url}" if response.request is not None else response.url
    body = bytearray()
    # An answer built by hand (a test's stand-in) has its body already and no connection to read it from.
    shut = shutter(response.raw)
    try:
        with Watchdog(within_s, shut) as watchdog:
            chunks = [response.content] if response.raw is None else response.iter_content(chunk_size=64 * 1024)
            for chunk in chunks:
                body += chunk
                if len(body) > MAX_ANSWER_BYTES:
                    raise TTSClientError(0, "bad_answer", f"{where}: the answer is over {MAX_ANSWER_BYTES:,} bytes; "
                                         "is this the TTS service?")  # fmt: skip
    except (requests.RequestException, OSError, ValueError) as e:
        # A socket shut under a read is a broken answer to requests, or, over TLS, an OSError or a ValueError.
        if watchdog.fired:
            raise TTSClientError(0, "unreachable", f"{where}: the answer took over {within_s:g} s to arrive") from e
        if not isinstance(e, requests.RequestException):
            raise
        raise TTSClientError(0, "unreachable", f"{where}: the answer broke off: {e}") from e
    finally:
        if response.raw is not None:  # one built by hand (a test's stand-in) has no connection to give back
            response.close()
    try:
        found = json.loads(body)
    except ValueError:
        found = None
    if not isinstance(found, dict):
        kind = response.headers.get("Content-Type", "no content type")
        raise TTSClientError(0, "bad_answer", f"{where}: the answer is not a JSON object ({kind}); "
                             "is this the TTS service?")  # fmt: skip
    return found
