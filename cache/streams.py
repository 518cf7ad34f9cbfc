"""Each caller's open streams and long-polls, counted across API processes in Redis.

A caller's slots are a sorted set of slot ids scored by when each lapses. An open stream renews its slot as it
goes; a process that crashed renews nothing, so its slots lapse on their own and none is held forever. Only
slots not yet lapsed count.
"""

from __future__ import annotations

import uuid

import redis

from cache import keys

# Redis's clock, not ours: API hosts whose clocks differ still agree on which slots lapsed.
_NOW_MS = "local t = redis.call('TIME') local now = t[1] * 1000 + math.floor(t[2] / 1000)"

#: KEYS[1] the caller's slots; ARGV slot id, limit, ttl in ms. Returns 1 when the slot was taken, 0 when full.
OPEN = f"""
{_NOW_MS}
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  return 0
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""

#: KEYS[1] the caller's slots; ARGV slot id, ttl in ms. Renews (or, if it lapsed meanwhile, retakes) the slot.
RENEW = f"""
{_NOW_MS}
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""


class CallerStreams:
    """Take, renew and give back callers' stream slots, at most ``limit`` live ones per caller."""

    def __init__(self, client: redis.Redis, *, ttl_s: float) -> None:
        self.redis = client
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self._open = client.register_script(OPEN)
        self._renew = client.register_script(RENEW)

    def open(self, caller: str, *, limit: int) -> str | None:
        """Take a slot for ``caller``; return its id, or None when the caller already holds ``limit``."""
        slot = uuid.uuid4().hex
        taken = int(self._open(keys=[keys.streams(caller)], args=[slot, limit, self.ttl_ms]))
        return slot if taken else None

    def renew(self, caller: str, slot: str) -> None:
        """Keep the slot for another ttl."""
        self._renew(keys=[keys.streams(caller)], args=[slot, self.ttl_ms])

    def close(self, caller: str, slot: str) -> None:
        """Give the slot back."""
        self.redis.zrem(keys.streams(caller), slot)

    def count(self, caller: str) -> int:
        """Return how many slots the caller holds (lapsed ones included until the next open prunes them)."""
        return int(self.redis.zcard(keys.streams(caller)))
