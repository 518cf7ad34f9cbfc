"""Requests refused at the door, remembered so that the same request sent again after its Retry-After is a retry.

While refusals made for want of capacity await their retries, a newcomer must leave a margin that a retry may use
(``Admission``): under sustained overload a caller who waited as told is let in before newcomers, instead of
competing with them for the same room again. With none pending (below capacity), no margin is kept.
"""

from __future__ import annotations

import math

import redis

from cache import keys

#: A refusal is remembered this long past its Retry-After: a retry later than that is a newcomer again.
GRACE_S = 30.0
#: A retry this much before its Retry-After ends still counts (the header is whole seconds; clocks differ).
EARLY_S = 0.5

# KEYS[1] the refusal, KEYS[2] the pending set; ARGV[1] now. Forget the refusal when its Retry-After has passed
# (redeemed: 1, else 0); answer that and how many refusals for want of capacity still await their retries.
_REDEEM = """
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[1])
local redeemed = 0
local not_before = redis.call('GET', KEYS[1])
if not_before and tonumber(not_before) <= tonumber(ARGV[1]) then
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[2], KEYS[1])
  redeemed = 1
end
return {redeemed, redis.call('ZCARD', KEYS[2])}
"""


class Refusals:
    """Which (caller, request) pairs were refused lately, from when each may come back as a retry, and how many
    refused for want of capacity are still to come back."""

    def __init__(self, client: redis.Redis, *, grace_s: float = GRACE_S) -> None:
        self.redis = client
        self.grace_s = grace_s
        self._redeem = client.register_script(_REDEEM)

    def remember(self, caller: str, digest: str, *, retry_after_s: float, now: float, pending: bool) -> None:
        """Record a refusal whose answer said to come back in ``retry_after_s`` (one key, expiring by itself);
        ``pending``: it was refused for want of capacity (not only for the margin), so its retry is awaited."""
        key = keys.refusal(caller, digest)
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.set(key, f"{now + retry_after_s - EARLY_S:.3f}", ex=math.ceil(retry_after_s + self.grace_s))
            if pending:
                pipe.zadd(keys.REFUSALS_PENDING, {key: now + retry_after_s + self.grace_s})
            pipe.execute()

    def redeem(self, caller: str, digest: str, *, now: float) -> tuple[bool, int]:
        """Return whether this request was refused and has come back no sooner than it was told (True once), and
        how many refusals for want of capacity still await their retries."""
        redeemed, pending = self._redeem(
            keys=[keys.refusal(caller, digest), keys.REFUSALS_PENDING], args=[f"{now:.3f}"]
        )
        return bool(redeemed), int(pending)
