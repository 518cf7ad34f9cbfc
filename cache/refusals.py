"""Requests refused at the door, remembered so that the same request sent again after its Retry-After is a retry.

A retry is judged without the margin kept for retries (``Admission``): under sustained overload a caller who
waited as told is let in before newcomers, instead of competing with them for the same room again.
"""

from __future__ import annotations

import math

import redis

from cache import keys

#: A refusal is remembered this long past its Retry-After: a retry later than that is a newcomer again.
GRACE_S = 30.0
#: A retry this much before its Retry-After ends still counts (the header is whole seconds; clocks differ).
EARLY_S = 0.5

# KEYS[1] the refusal; ARGV[1] now. Forget it and answer 1 when its Retry-After has passed; else 0.
_REDEEM = """
local not_before = redis.call('GET', KEYS[1])
if not_before and tonumber(not_before) <= tonumber(ARGV[1]) then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"""


class Refusals:
    """Which (caller, request) pairs were refused lately, and from when each may come back as a retry."""

    def __init__(self, client: redis.Redis, *, grace_s: float = GRACE_S) -> None:
        self.redis = client
        self.grace_s = grace_s
        self._redeem = client.register_script(_REDEEM)

    def remember(self, caller: str, digest: str, *, retry_after_s: float, now: float) -> None:
        """Record a refusal whose answer said to come back in ``retry_after_s`` (one key, expiring by itself)."""
        ttl = math.ceil(retry_after_s + self.grace_s)
        self.redis.set(keys.refusal(caller, digest), f"{now + retry_after_s - EARLY_S:.3f}", ex=ttl)

    def redeem(self, caller: str, digest: str, *, now: float) -> bool:
        """Return True, once, when this request was refused and has come back no sooner than it was told."""
        return bool(self._redeem(keys=[keys.refusal(caller, digest)], args=[f"{now:.3f}"]))
