"""Who holds which segment, and the outbox of segments that must reach the broker.

A worker holds a segment from the moment it starts on it (START_SEGMENT) until it writes it
(WRITE_SEGMENT) or gives it up. A segment taken off a job's pending list, or taken from a
worker known dead, waits in the outbox until it is published. Together they say where every
unfinished segment is, so nothing waits for kombu's visibility timeout or a stall timer.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import redis

from cache import keys, scripts


class Custody:
    """Read and move the worker hold sets and the outbox (see cache/scripts.py: HAND_OVER, RELEASE_STALE)."""

    def __init__(self, client: redis.Redis) -> None:
        self.redis = client
        self._hand_over = client.register_script(scripts.HAND_OVER)
        self._release_stale = client.register_script(scripts.RELEASE_STALE)

    def holders(self) -> list[str]:
        """Return the names of workers that may hold segments."""
        return sorted(_text(name) for name in self.redis.smembers(keys.HOLDERS))

    def held(self, worker: str) -> set[str]:
        """Return the segment members a worker holds, as Redis has them."""
        return {_text(member) for member in self.redis.smembers(keys.held(worker))}

    def hand_over(self, worker: str, now: float | None = None) -> int:
        """Move a dead worker's segments to the outbox, due now, and forget the worker; return how many."""
        now = time.time() if now is None else now
        script_keys = [keys.held(worker), keys.OUTBOX, keys.WORKERS, keys.HOLDERS, keys.worker(worker)]
        return int(self._hand_over(keys=script_keys, args=[worker, f"{now:.6f}"]))

    def release_stale(self, worker: str, members: Iterable[str], now: float | None = None) -> int:
        """Move segments a live worker holds in Redis but no longer works on to the outbox; return how many."""
        members = list(members)
        if not members:
            return 0
        now = time.time() if now is None else now
        return int(self._release_stale(keys=[keys.held(worker), keys.OUTBOX], args=[f"{now:.6f}", *members]))

    def due(self, now: float | None = None, limit: int = 500) -> list[str]:
        """Return up to ``limit`` outbox members whose publish time has come, oldest first."""
        now = time.time() if now is None else now
        return [_text(m) for m in self.redis.zrangebyscore(keys.OUTBOX, "-inf", now, start=0, num=limit)]

    def size(self) -> int:
        """Return how many segments wait in the outbox."""
        return int(self.redis.zcard(keys.OUTBOX))

    def published(self, members: Iterable[str]) -> None:
        """Take members out of the outbox."""
        members = list(members)
        if members:
            self.redis.zrem(keys.OUTBOX, *members)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
