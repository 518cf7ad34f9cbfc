"""Who holds which segment, and the outbox of segments that must reach the broker.

A worker holds a segment from the moment it starts on it (START_SEGMENT) until it writes it
(WRITE_SEGMENT) or gives it up. A segment taken off a job's pending list, or taken from a
worker known dead, waits in the outbox until it is published. Together they say where every
unfinished segment is, so nothing waits for kombu's visibility timeout or a stall timer.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import redis

from cache import keys, scripts


@dataclass(frozen=True)
class Delivery:
    """A segment task the broker delivered and no worker acknowledged yet (kombu's unacked hash)."""

    tag: str
    member: str
    delivered_at: float


@dataclass(frozen=True)
class BrokerKeys:
    """Where the broker keeps segment tasks: the queue lists, and kombu's unacked hash and its index."""

    queues: Sequence[str] = ()
    unacked: str = "unacked"
    unacked_index: str = "unacked_index"


class Custody:
    """Read and move the worker hold sets and the outbox (see cache/scripts.py: HAND_OVER, RELEASE_STALE)."""

    def __init__(self, client: redis.Redis, broker: BrokerKeys | None = None, *, task_name: str = "") -> None:
        self.redis = client
        self.broker = broker or BrokerKeys()
        self.task_name = task_name
        self._hand_over = client.register_script(scripts.HAND_OVER)
        self._release_stale = client.register_script(scripts.RELEASE_STALE)

    def holders(self) -> list[str]:
        """Return the names of workers that may hold segments."""
        return sorted(_text(name) for name in self.redis.smembers(keys.HOLDERS))

    def held(self, worker: str) -> set[str]:
        """Return the segment members a worker holds, as Redis has them."""
        return {_text(member) for member in self.redis.smembers(keys.held(worker))}

    def hand_over(self, worker: str, now: float | None = None) -> int:
        """Move a dead worker's segments to the outbox, due now, count a failed attempt for each it had
        started, and forget the worker; return how many it held."""
        now = time.time() if now is None else now
        script_keys = [keys.held(worker), keys.OUTBOX, keys.WORKERS, keys.HOLDERS, keys.worker(worker)]
        head, tail = keys.attempts("\0").split("\0")
        return int(self._hand_over(keys=script_keys, args=[worker, f"{now:.6f}", head, tail]))

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

    def to_outbox(self, members: Iterable[str], now: float | None = None) -> None:
        """Put segments in the outbox, due now."""
        now = time.time() if now is None else now
        entries = dict.fromkeys(members, now)
        if entries:
            self.redis.zadd(keys.OUTBOX, entries)  # type: ignore[arg-type]

    def in_outbox(self) -> set[str]:
        """Return every segment in the outbox."""
        return {_text(m) for m in self.redis.zrange(keys.OUTBOX, 0, -1)}

    def queued(self) -> set[str]:
        """Return every segment whose task waits on a broker queue (reads whole lists: for rare, full passes)."""
        pipe = self.redis.pipeline(transaction=False)
        for queue in self.broker.queues:
            pipe.lrange(queue, 0, -1)
        found = set()
        for raw in (item for items in pipe.execute() for item in items):
            member = self._member_of(_json(raw))
            if member is not None:
                found.add(member)
        return found

    def deliveries(self) -> list[Delivery]:
        """Return the segment tasks delivered and not yet acknowledged, with their delivery times."""
        raw: dict[bytes, bytes] = self.redis.hgetall(self.broker.unacked)  # type: ignore[assignment]
        times: list[tuple[bytes, float]] = self.redis.zrange(self.broker.unacked_index, 0, -1, withscores=True)  # type: ignore[assignment]
        delivered_at = {tag.decode(): score for tag, score in times}
        found = []
        for tag, value in raw.items():
            entry = _json(value)
            member = self._member_of(entry[0]) if isinstance(entry, list) and entry else None
            if member is not None:
                found.append(Delivery(tag.decode(), member, delivered_at.get(tag.decode(), 0.0)))
        return found

    def forget_deliveries(self, tags: Iterable[str]) -> None:
        """Drop delivered messages whose segments were enqueued afresh (else kombu redelivers them an hour on)."""
        tags = list(tags)
        if tags:
            pipe = self.redis.pipeline(transaction=True)
            pipe.zrem(self.broker.unacked_index, *tags)
            pipe.hdel(self.broker.unacked, *tags)
            pipe.execute()

    def _member_of(self, message: object) -> str | None:
        """Return the segment a kombu message of a segment task names (None for any other message)."""
        if not isinstance(message, dict) or message.get("headers", {}).get("task") != self.task_name:
            return None
        try:
            args = json.loads(base64.b64decode(message["body"]))[0]
            return keys.segment_member(str(args[0]), int(args[1]))
        except (KeyError, IndexError, TypeError, ValueError, binascii.Error):
            return None


def _json(raw: object) -> object:
    try:
        return json.loads(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
