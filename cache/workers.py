"""Worker heartbeats in Redis, so the API can tell whether anyone is serving."""

from __future__ import annotations

import json
import time
from typing import Any

import redis

from cache import keys


class WorkerRegistry:
    """Record and list live workers through keys that expire unless renewed."""

    def __init__(self, client: redis.Redis, *, ttl_s: float) -> None:
        self.redis = client
        self.ttl_ms = max(1000, int(ttl_s * 1000))

    def beat(self, hostname: str, info: dict[str, Any]) -> None:
        """Announce that a worker is alive, with what it serves."""
        payload = json.dumps({**info, "hostname": hostname, "seen_at": time.time()})
        self.redis.set(keys.worker(hostname), payload, px=self.ttl_ms)

    def remove(self, hostname: str) -> None:
        """Forget a worker that is shutting down."""
        self.redis.delete(keys.worker(hostname))

    def alive(self) -> list[dict[str, Any]]:
        """Return the announcements of every live worker."""
        found = list(self.redis.scan_iter(match=keys.WORKER_PATTERN, count=100))
        if not found:
            return []
        values = self.redis.mget(found)
        return [json.loads(v) for v in values if v is not None]
