"""Per-caller quotas, counted in Redis by the `limits` library (Flask-Limiter's engine), shared by all replicas."""

from __future__ import annotations

import time

import redis
from limits import RateLimitItemPerMinute
from limits.storage import RedisStorage
from limits.strategies import SlidingWindowCounterRateLimiter


class RateLimiter:
    """Allow each caller ``per_minute`` submissions in any sliding minute."""

    def __init__(self, client: redis.Redis) -> None:
        # Reuse the API's connection pool: one set of connections, and passwords and TLS come with it.
        storage = RedisStorage("redis://", connection_pool=client.connection_pool, key_prefix="tts:quota")
        self._limiter = SlidingWindowCounterRateLimiter(storage)

    def take(self, caller: str, *, per_minute: int) -> float:
        """Spend one submission of ``caller``'s quota; return 0 when allowed, else seconds until one frees up."""
        item = RateLimitItemPerMinute(per_minute)
        if self._limiter.hit(item, caller):
            return 0.0
        stats = self._limiter.get_window_stats(item, caller)
        return max(0.001, stats.reset_time - time.time())
