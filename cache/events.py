"""One waiter per API process for every event stream its requests wait on: a single XREAD for all of them."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Protocol

import redis

from core.loops import OnDemandLoop

log = logging.getLogger(__name__)

#: A stream entry id ("<ms>-<seq>") as numbers, so that ids compare as Redis orders them.
StreamId = tuple[int, int]

#: How long the loop rests after Redis failed, before it tries again.
RETRY_S = 0.5


class EventWaiter(Protocol):
    """Block until a stream has an entry newer than a given id (the job store's waits go through one)."""

    def wait(self, key: str, after: str, timeout_s: float) -> str:
        """Return an id newer than ``after`` once stream ``key`` has one, or ``after`` when time runs out."""
        ...


def parse_id(raw: str | bytes) -> StreamId:
    """Return a stream entry id as (milliseconds, sequence)."""
    text = raw.decode() if isinstance(raw, bytes) else raw
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


class _Waiter:
    __slots__ = ("after", "error", "newest", "woken")

    def __init__(self, after: StreamId) -> None:
        self.after = after
        self.woken = threading.Event()
        self.newest: str | None = None
        self.error: Exception | None = None


class EventHub:
    """Wait on many Redis streams with one blocked connection: one loop XREADs every stream someone waits on.

    A waiter registers the newest id it had read, then the loop wakes it once its stream has a newer entry. A
    waiter that registers while the loop is blocked joins the next round (at most ``block_ms`` later), and misses
    nothing: an entry written meanwhile is newer than the id it registered. The loop runs only while someone
    waits (a thread, or a greenlet under gevent's patched threading) and ends after ``idle_s`` without waiters.
    """

    def __init__(self, client: redis.Redis, *, block_ms: int = 100, idle_s: float = 5.0) -> None:
        self.redis = client
        self.block_ms = block_ms
        self.idle_s = idle_s
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._waiting: dict[str, list[_Waiter]] = {}
        self._loop = OnDemandLoop("event-hub", self._lock, self._round, lambda: bool(self._waiting))

    def wait(self, key: str, after: str, timeout_s: float) -> str:
        """Block until stream ``key`` has an entry newer than ``after`` or time runs out; return the id seen."""
        waiter = _Waiter(parse_id(after))
        with self._lock:
            self._waiting.setdefault(key, []).append(waiter)
            self._loop.start()
            self._changed.notify()
        try:
            waiter.woken.wait(max(0.0, timeout_s))
        finally:
            with self._lock:
                self._drop(key, waiter)
        if waiter.error is not None:
            raise waiter.error
        return waiter.newest or after

    def close(self) -> None:
        """Close the hub's connection (its loop, if running, reconnects on its next round)."""
        self.redis.close()

    def waiting(self) -> int:
        """Return how many waits are in progress."""
        with self._lock:
            return sum(len(found) for found in self._waiting.values())

    def _drop(self, key: str, waiter: _Waiter) -> None:
        found = self._waiting.get(key)
        if found is not None and waiter in found:
            found.remove(waiter)
            if not found:
                del self._waiting[key]

    def _round(self) -> bool:
        with self._lock:
            if not self._waiting:
                self._changed.wait(self.idle_s)
            if not self._waiting:
                return False
            # The oldest id each stream's waiters hold: any entry after it wakes at least one of them.
            streams = {key: min(w.after for w in found) for key, found in self._waiting.items()}
        try:
            reply = self.redis.xread(
                {key: f"{ms}-{seq}" for key, (ms, seq) in streams.items()}, count=1, block=self.block_ms
            )
        except Exception as e:  # every waiter of this round hears it; the loop goes on
            log.warning("event hub: reading %d streams failed: %s", len(streams), e)
            self._fail(streams, e)
            time.sleep(RETRY_S)
            return True
        self._wake(reply)
        return True

    def _wake(self, reply: Any) -> None:
        with self._lock:
            for raw_key, entries in reply.items() if isinstance(reply, dict) else reply or []:
                if not entries:
                    continue
                key = raw_key.decode() if isinstance(raw_key, bytes) else str(raw_key)
                raw_id = entries[-1][0]
                newest = parse_id(raw_id)
                for waiter in list(self._waiting.get(key, [])):
                    if waiter.after < newest:
                        waiter.newest = raw_id.decode() if isinstance(raw_id, bytes) else str(raw_id)
                        waiter.woken.set()
                        self._drop(key, waiter)

    def _fail(self, streams: dict[str, StreamId], error: Exception) -> None:
        with self._lock:
            for key in streams:
                for waiter in list(self._waiting.get(key, [])):
                    waiter.error = error
                    waiter.woken.set()
                    self._drop(key, waiter)
