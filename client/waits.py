"""How long a client's long-polls ask the service to wait, and what it asks for after a service refuses that."""

from __future__ import annotations

import re

from client.errors import TTSClientError

#: The ``?wait=`` a client asks for at first: the service's default ``TTS_MAX_WAIT_S``. A service set shorter
#: refuses it (422), and the client then asks for what that service allows (``allowed_wait``).
LONG_POLL_S = 30.0
#: The waits tried in turn after a refusal that does not say the service's limit.
FALLBACK_WAITS_S = (5.0, 1.0, 0.0)
#: The shortest time between two polls of a segment, however short the service's long-poll.
MIN_POLL_S = 0.5
#: How the service's 422 states its limit ("wait: must be between 0 and 5 seconds").
_WAIT_LIMIT = re.compile(r"between 0 and (\d+(?:\.\d+)?) seconds")


def allowed_wait(error: TTSClientError, asked: float) -> float | None:
    """Return the ``?wait=`` to ask for after ``error`` refused a wait of ``asked`` seconds, or None when
    ``error`` is no refusal of the wait: the limit the service states, else the next of ``FALLBACK_WAITS_S``."""
    if error.status != 422 or error.details.get("field") != "wait" or asked <= 0:
        return None
    # The service states its limit as ``max`` (and, before it did, only in the message): read it defensively, and
    # step down when it cannot be read.
    limit = error.details.get("max")
    if not isinstance(limit, int | float) or isinstance(limit, bool):
        stated = _WAIT_LIMIT.search(error.message)
        limit = float(stated.group(1)) if stated is not None else None
    if limit is not None and 0 <= float(limit) < asked:
        return float(limit)
    return next(wait for wait in FALLBACK_WAITS_S if wait < asked)
