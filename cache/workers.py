"""Worker heartbeats in Redis, so the API can tell whether anyone is serving."""

from __future__ import annotations

import json
import time
from typing import Any

import redis

from cache import keys


class WorkerRegistry:
    """Record and list live workers through keys that expire unless renewed.

    ``max_age_s`` lets a reader answer from a list it read that recently (the API: every submission asks who is
    alive, and a worker is judged dead only ``ttl_s`` after its last beat, so half a second later changes little).
    """

    def __init__(self, client: redis.Redis, *, ttl_s: float, max_age_s: float = 0.0) -> None:
        self.redis = client
        self.ttl_ms = max(1000, int(ttl_s * 1000))
        self.max_age_s = max_age_s
        self._seen: tuple[float, list[dict[str, Any]]] | None = None

    def beat(self, hostname: str, info: dict[str, Any]) -> None:
        """Announce that a worker is alive, with what it serves."""
        now = time.time()
        payload = json.dumps({**info, "hostname": hostname, "seen_at": now})
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(keys.worker(hostname), payload, px=self.ttl_ms)
        pipe.zadd(keys.WORKERS, {hostname: now})
        pipe.execute()

    def remove(self, hostname: str) -> None:
        """Forget a worker that is shutting down."""
        self.redis.delete(keys.worker(hostname))
        self.redis.zrem(keys.WORKERS, hostname)

    def last_beats(self) -> dict[str, float]:
        """Return each known worker's last heartbeat time."""
        entries: list[tuple[bytes, float]] = self.redis.zrange(keys.WORKERS, 0, -1, withscores=True)  # type: ignore[assignment]
        return {name.decode(): float(score) for name, score in entries}

    def alive(self) -> list[dict[str, Any]]:
        """Return the announcements of every live worker (an index lookup, never a keyspace scan)."""
        if self.max_age_s > 0:
            seen = self._seen
            if seen is not None and time.monotonic() - seen[0] < self.max_age_s:
                return seen[1]
            found = self._read_alive()
            self._seen = (time.monotonic(), found)
            return found
        return self._read_alive()

    def _read_alive(self) -> list[dict[str, Any]]:
        now = time.time()
        self.redis.zremrangebyscore(keys.WORKERS, "-inf", now - 10 * self.ttl_ms / 1000)
        names = self.redis.zrangebyscore(keys.WORKERS, now - self.ttl_ms / 1000, "+inf")
        if not names:
            return []
        values = self.redis.mget([keys.worker(n.decode() if isinstance(n, bytes) else str(n)) for n in names])
        return [json.loads(v) for v in values if isinstance(v, bytes)]
