"""Who is calling: optional API keys (checked once, at start), each with its own quota of submissions per minute."""

from __future__ import annotations

import math

import redis
from flask import Flask, g, request

from api.services import services
from cache.idempotency import IdempotencyKeys
from cache.limiter import RateLimiter
from core.errors import TooManyRequests, Unauthorized
from core.metrics import ADMISSION_REJECTIONS

#: Routes open to anyone: probes and scrapes must work without a key.
OPEN_ENDPOINTS = frozenset(
    {"health.healthz", "health.readyz", "metrics.metrics", "openapi.openapi", "web.index", "web.static"}
)
#: Routes that start work, and so spend quota.
SUBMITTING_ENDPOINTS = frozenset({"jobs.create_job", "speech.speech", "voice.voice_socket"})


def _presented_key() -> str | None:
    auth = request.headers.get("Authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip() or None
    return request.headers.get("X-API-Key") or None


def _replay(client: redis.Redis) -> bool:
    """Say whether this submission repeats an Idempotency-Key whose job exists: it gets that job and starts no work,
    so it spends no quota (a client retrying a submission after a timeout, as it should, is not locked out)."""
    key = request.headers.get("Idempotency-Key")
    if request.endpoint != "jobs.create_job" or not key or len(key) > 255:
        return False
    return IdempotencyKeys(client).created(g.caller, key)


def _check_access() -> None:
    svc = services()
    per_minute = svc.settings.anonymous_per_minute
    # Without keys nobody is told apart from anyone else: the address only scopes quotas and stream slots.
    g.caller = f"ip-{request.remote_addr}"
    g.owner = ""
    if svc.keys and request.endpoint not in OPEN_ENDPOINTS:
        presented = _presented_key()
        found = svc.keys.match(presented) if presented is not None else None
        if found is None:
            raise Unauthorized("send a valid API key as 'Authorization: Bearer <key>' or 'X-API-Key: <key>'")
        g.caller = g.owner = found.caller
        per_minute = found.per_minute
    if per_minute and request.endpoint in SUBMITTING_ENDPOINTS and not _replay(svc.redis):
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
