"""A circuit breaker whose state lives in Redis, so every API replica agrees.

Closed: requests pass. It opens when recent segment attempts fail too often. Open:
requests get 503 until the cool-down ends; then one trial request passes (half-open).
A success after that closes it; a failure opens it again. While no worker is alive,
requests get 503 too, but nothing opens: the first request after a worker is back
passes (a restart of the only worker costs its seconds, not a cool-down).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis

from cache import keys
from cache.stats import Stats

#: The refusal while no worker is alive, and the Retry-After it carries (a worker's heartbeat is 2 s).
NO_WORKER = "no worker is alive"
NO_WORKER_RETRY_S = 5


@dataclass(frozen=True)
class Verdict:
    """Whether a request may pass, and if not, why and for how long."""

    allowed: bool
    reason: str = ""
    retry_after: int = 0


class CircuitBreaker:
    """Decide per request from shared state, worker heartbeats and recent outcomes."""

    def __init__(
        self,
        client: redis.Redis,
        stats: Stats,
        *,
        failure_rate: float,
        min_failures: int,
        cooldown_s: float,
        trial_timeout_s: float = 60.0,
    ) -> None:
        self.redis = client
        self.stats = stats
        self.failure_rate = failure_rate
        self.min_failures = min_failures
        self.cooldown_s = cooldown_s
        self.trial_timeout_s = trial_timeout_s

    def state(self) -> tuple[str, float, str]:
        """Return (state, since, reason)."""
        raw = self.redis.hgetall(keys.BREAKER)
        found = {(k.decode() if isinstance(k, bytes) else str(k)): (v.decode() if isinstance(v, bytes) else str(v))
                 for k, v in raw.items()}  # fmt: skip
        return found.get("state", "closed"), float(found.get("since", 0)), found.get("reason", "")

    def _set(self, state: str, reason: str = "") -> None:
        self.redis.hset(keys.BREAKER, mapping={"state": state, "since": time.time(), "reason": reason})

    def check(self, *, workers_alive: int) -> Verdict:
        """Return whether a new job may be accepted now."""
        if not workers_alive:
            return Verdict(False, NO_WORKER, NO_WORKER_RETRY_S)
        state, since, reason = self.state()
        if state == "open" and reason == NO_WORKER:  # tripped so by an earlier version: the worker is back
            self._set("closed")
            return Verdict(True)
        if state == "open":
            return self._open(since, reason)
        if state == "half_open":
            return self._half_open(since, reason)
        return self._closed(since)

    def _open(self, since: float, reason: str) -> Verdict:
        remaining = self.cooldown_s - (time.time() - since)
        if remaining > 0:
            return Verdict(False, reason, max(1, round(remaining)))
        self._set("half_open", reason)
        return Verdict(True)  # this request is the trial

    def _half_open(self, since: float, reason: str) -> Verdict:
        recent = self.stats.window(since=since)
        if recent.ok > 0:
            self._set("closed")
            return Verdict(True)
        if recent.failed > 0:
            return self._trip(reason)
        if time.time() - since > self.trial_timeout_s:
            self._set("half_open", reason)  # the trial never finished: let another one through
            return Verdict(True)
        return Verdict(False, "waiting for a trial request to finish", 2)

    def _closed(self, since: float) -> Verdict:
        recent = self.stats.window(since=since)
        if recent.failed >= self.min_failures and recent.failure_rate >= self.failure_rate:
            return self._trip(f"{recent.failed:.0f} of {recent.ok + recent.failed:.0f} recent segment attempts failed")
        return Verdict(True)

    def _trip(self, reason: str) -> Verdict:
        self._set("open", reason)
        return Verdict(False, reason, max(1, round(self.cooldown_s)))
