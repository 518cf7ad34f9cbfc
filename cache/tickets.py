"""Retry tickets: a refused realtime job's place kept for its retry, so that a retry at Retry-After is let in.

A realtime job refused because the engines could not keep every listener on time is answered 503 with a
Retry-After and a ticket. Until the retry comes, the deadlines the job would have had, counted from its
Retry-After, stay in the admission check as work already admitted: newcomers in the meantime see that
capacity as taken. A retry that brings its ticket within the ticket's window gives the kept place up and is
weighed as any job, so that it is not counted twice; it finds the capacity the newcomers were refused. A ticket
not used within ``GRACE_S`` of its time lapses, and its place with it.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import redis

from cache import keys

#: A ticket is good from this long before its time (Retry-After is whole seconds; clocks differ) ...
EARLY_S = 1.0
#: ... until this long after it; then it lapses, and the capacity kept for it is free again.
GRACE_S = 5.0
#: Outstanding tickets at most; past it a refusal carries none (the door is refusing more than it can keep).
MOST = 10_000
#: Lapsed tickets removed per read, at most (each read removes some; none piles up).
PRUNE = 500

# Take a ticket: good only within its window, and only once.
_REDEEM = """
local due = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not due then return 0 end
due = tonumber(due)
local now = tonumber(ARGV[2])
if now < due - tonumber(ARGV[3]) or now > due + tonumber(ARGV[4]) then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
return 1
"""

# Drop lapsed tickets, then return the due time and reserved deadlines of those still good, up to a time.
_RESERVED = """
local lapsed = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
if #lapsed > 0 then
  redis.call('ZREM', KEYS[1], unpack(lapsed))
  redis.call('HDEL', KEYS[2], unpack(lapsed))
end
local live = redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[1], ARGV[2], 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[4]))
local out = {}
for i = 1, #live, 2 do
  out[#out + 1] = live[i + 1]
  out[#out + 1] = redis.call('HGET', KEYS[2], live[i]) or ''
end
return out
"""


class RetryTickets:
    """Grant, take and count retry tickets, shared by every API process through Redis."""

    def __init__(self, client: redis.Redis, *, key: str = keys.TICKETS, work_key: str = keys.TICKET_WORK) -> None:
        self.redis = client
        self.keys = [key, work_key]
        self._redeem = client.register_script(_REDEEM)
        self._reserved = client.register_script(_RESERVED)

    def grant(self, due: float, offsets: Sequence[float]) -> str | None:
        """Keep a place for a retry due at ``due`` whose segments would be due ``offsets`` seconds after it came;
        return the ticket, or None when ``MOST`` are outstanding."""
        if self.redis.zcard(self.keys[0]) >= MOST:
            return None
        ticket = uuid.uuid4().hex
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.zadd(self.keys[0], {ticket: due})
            pipe.hset(self.keys[1], ticket, ",".join(f"{x:.3f}" for x in offsets))
            pipe.execute()
        return ticket

    def redeem(self, ticket: str, now: float) -> bool:
        """Take ``ticket`` if it is good at ``now``; True once at most, whoever asks."""
        return bool(self._redeem(keys=self.keys, args=[ticket, now, EARLY_S, GRACE_S]))

    def reserved(self, now: float, until: float, *, limit: int = 2000) -> list[float]:
        """Return the deadlines kept for retries still good at ``now`` and due by ``until`` (lapsed ones are
        dropped): each retry's segments as if it came at its time, or now if that has passed."""
        flat = self._reserved(keys=self.keys, args=[now - GRACE_S, until, PRUNE, limit])
        deadlines: list[float] = []
        for i in range(0, len(flat), 2):
            start = max(now, float(flat[i]))
            text = flat[i + 1].decode() if isinstance(flat[i + 1], bytes) else str(flat[i + 1])
            deadlines.extend(start + float(x) for x in text.split(",") if x)
        return deadlines
