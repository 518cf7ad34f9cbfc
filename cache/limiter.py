"""Per-caller quotas: a token bucket kept in Redis, shared by every API replica."""

from __future__ import annotations

import time

import redis

from cache import keys

# KEYS: bucket; ARGV: capacity, refill per second, now, cost.
# Returns {allowed (1/0), seconds until enough tokens}.
_TAKE = """
local capacity = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(state[1]) or capacity
local at = tonumber(state[2]) or now
tokens = math.min(capacity, tokens + (now - at) * rate)
local allowed = 0
local wait = 0
if tokens >= cost then
  tokens = tokens - cost
  allowed = 1
else
  wait = (cost - tokens) / rate
end
redis.call('HSET', KEYS[1], 'tokens', tokens, 'at', now)
redis.call('EXPIRE', KEYS[1], math.ceil(capacity / rate) + 60)
return {allowed, tostring(wait)}
"""


class RateLimiter:
    """Allow each caller ``per_minute`` requests, refilled continuously, with bursts up to that many."""

    def __init__(self, client: redis.Redis) -> None:
        self.redis = client
        self._take = client.register_script(_TAKE)

    def take(self, caller: str, *, per_minute: int) -> float:
        """Spend one request of ``caller``'s quota; return 0 when allowed, else seconds to wait."""
        allowed, wait = self._take(keys=[keys.quota(caller)], args=[per_minute, per_minute / 60, time.time(), 1])
        return 0.0 if int(allowed) == 1 else max(0.001, float(wait))
