"""Admission control: refuse work the service cannot start in time, and work it is failing at."""

from __future__ import annotations

import math

import redis

from cache.breaker import CircuitBreaker
from cache.stats import Stats
from cache.workers import WorkerRegistry
from celery_config import QUEUES, queue_keys
from core.errors import ServiceUnavailable
from core.metrics import ADMISSION_REJECTIONS
from core.settings import Settings


class Admission:
    """Estimate each lane's wait from queue depth and recent throughput; consult the breaker."""

    def __init__(self, client: redis.Redis, *, stats: Stats, breaker: CircuitBreaker, workers: WorkerRegistry,
                 settings: Settings, queues: tuple[str, ...] = QUEUES) -> None:  # fmt: skip
        self.redis = client
        self.stats = stats
        self.breaker = breaker
        self.workers = workers
        self.limits = {"realtime": settings.admission_realtime_wait_s, "batch": settings.admission_batch_wait_s}
        self.queues = dict(zip(QUEUES, queues, strict=True))  # lane → the Redis list holding its tasks

    def estimated_wait_s(self, lane: str, *, workers_alive: int) -> float:
        """Return the seconds a new segment on ``lane`` would wait, or 0 when nothing is known yet."""
        recent = self.stats.window()
        speed = recent.chars_per_busy_second * max(1, workers_alive)
        if speed <= 0:
            return 0.0
        # Workers take realtime first, so a batch segment also waits behind all realtime work.
        lanes = QUEUES[: QUEUES.index(lane) + 1]
        pipe = self.redis.pipeline(transaction=False)
        for name in lanes:
            for key in queue_keys(self.queues[name]):
                pipe.llen(key)
        depth = sum(int(n) for n in pipe.execute())
        return depth * recent.chars_per_segment / speed

    def admit(self, lane: str) -> None:
        """Raise ServiceUnavailable (503, Retry-After) unless a job on ``lane`` can be taken now."""
        alive = len(self.workers.alive())
        verdict = self.breaker.check(workers_alive=alive)
        if not verdict.allowed:
            ADMISSION_REJECTIONS.labels("breaker").inc()
            raise ServiceUnavailable(f"not accepting jobs: {verdict.reason}", retry_after=verdict.retry_after)
        wait = self.estimated_wait_s(lane, workers_alive=alive)
        limit = self.limits[lane]
        if wait > limit:
            ADMISSION_REJECTIONS.labels("overload").inc()
            raise ServiceUnavailable(
                f"the {lane} lane is {wait:.0f} s deep (limit {limit:g} s); retry later",
                retry_after=min(300, math.ceil(wait - limit) + 1),
                estimated_wait_s=round(wait, 1),
            )
