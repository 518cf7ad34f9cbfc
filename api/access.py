"""Who is calling: optional API keys, each with its own quota of submissions per minute."""

from __future__ import annotations

import hashlib
import math

from flask import Flask, g, request

from api.services import services
from cache.limiter import RateLimiter
from core.errors import TooManyRequests, Unauthorized
from core.metrics import ADMISSION_REJECTIONS

#: Routes open to anyone: probes and scrapes must work without a key.
OPEN_ENDPOINTS = frozenset(
    {"health.healthz", "health.readyz", "metrics.metrics", "openapi.openapi", "web.index", "web.static"}
)
#: Routes that start work, and so spend quota.
SUBMITTING_ENDPOINTS = frozenset({"jobs.create_job", "speech.speech"})


def parse_keys(spec: str) -> dict[str, int]:
    """Parse ``key=per_minute,key2`` into key → submissions per minute (0 means no limit)."""
    found: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        key, _, limit = item.partition("=")
        found[key.strip()] = int(limit) if limit.strip() else 0
    return found


def caller_id(key: str) -> str:
    """Name a caller by a hash of its key, so no key is ever written to Redis or logs."""
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:16]


def _presented_key() -> str | None:
    auth = request.headers.get("Authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.headers.get("X-API-Key")


def _check_access() -> None:
    svc = services()
    keys = parse_keys(svc.settings.api_keys)
    per_minute = svc.settings.anonymous_per_minute
    g.caller = f"ip-{request.remote_addr}"
    if keys and request.endpoint not in OPEN_ENDPOINTS:
        presented = _presented_key()
        if presented is None or presented not in keys:
            raise Unauthorized("send a valid API key as 'Authorization: Bearer <key>' or 'X-API-Key: <key>'")
        g.caller = caller_id(presented)
        per_minute = keys[presented]
    if per_minute and request.endpoint in SUBMITTING_ENDPOINTS:
        wait = RateLimiter(svc.redis).take(g.caller, per_minute=per_minute)
        if wait:
            ADMISSION_REJECTIONS.labels("quota").inc()
            raise TooManyRequests(
                f"over your quota of {per_minute} submissions per minute; retry in {math.ceil(wait)} s",
                retry_after=math.ceil(wait),
            )


def init_app(app: Flask) -> None:
    """Check keys and quotas before every request."""
    app.before_request(_check_access)
