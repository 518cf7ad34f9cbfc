"""Promises kept across a failover: a write the API is about to promise is on replicas first (Redis WAIT).

Replication is asynchronous: a primary that fails may take its last writes with it, and the replica promoted in
its place never had them. Before answering 202 for a job (or taking a text piece), the API waits until enough
replicas hold everything written so far: the job, its idempotency claim, its first tasks on the broker. Past
the timeout it refuses to promise (503): the work may still go on, and a retry with the same Idempotency-Key
finds it if it survived. This is not strong consistency (a promoted replica may lack a write another replica
had), but with one replica per confirmation and Sentinel promoting the most up-to-date replica, an accepted job
survives the loss of its primary.
"""

from __future__ import annotations

import time

import redis

from cache import keys
from core.errors import ServiceUnavailable
from core.metrics import REPLICA_CONFIRMATIONS

#: What a short confirmation's 503 asks a caller to wait: about as long as Sentinel takes to promote a replica.
RETRY_AFTER_S = 5


class Replication:
    """Wait until ``replicas`` replicas hold every write made so far, for at most ``timeout_ms``."""

    def __init__(self, client: redis.Redis, *, replicas: int, timeout_ms: int) -> None:
        self.redis = client
        self.replicas = replicas
        self.timeout_ms = timeout_ms

    def confirmed(self) -> int:
        """Return how many replicas hold every write made before this call (WAIT), waiting up to the timeout."""
        pipe = self.redis.pipeline(transaction=False)  # one connection: WAIT counts that connection's last write
        pipe.set(keys.REPLICATION_MARK, f"{time.time():.3f}")
        pipe.execute_command("WAIT", self.replicas, self.timeout_ms)  # type: ignore[no-untyped-call]
        return int(pipe.execute()[-1])

    def ensure(self, what: str, *, then: str) -> None:
        """Return once ``what`` is on enough replicas; raise ServiceUnavailable (503) saying what to do ``then``
        if it is not within the timeout. With no replicas to wait for, return at once."""
        if self.replicas == 0:
            return
        got = self.confirmed()
        if got >= self.replicas:
            REPLICA_CONFIRMATIONS.labels("confirmed").inc()
            return
        REPLICA_CONFIRMATIONS.labels("short").inc()
        raise ServiceUnavailable(
            f"{what} is written, but {got} of the {self.replicas} replicas it must be on confirmed it within "
            f"{self.timeout_ms} ms (the job store is failing over, or its replicas lag): {then}",
            retry_after=RETRY_AFTER_S,
        )
