"""Admission control: refuse work the service cannot start in time, and work it is failing at."""

from __future__ import annotations

import math
import time

from cache.breaker import CircuitBreaker
from cache.budget import StoreBudget
from cache.schedule import ScheduleBook
from cache.stats import Stats
from cache.workers import WorkerRegistry
from core.errors import ServiceUnavailable, StoreFull
from core.metrics import ADMISSION_REJECTIONS
from core.policy import SchedulingPolicy
from core.settings import Settings


class Admission:
    """Estimate when a new job's first segment would start, from the work due before it; consult the breaker."""

    def __init__(
        self,
        *,
        stats: Stats,
        breaker: CircuitBreaker,
        workers: WorkerRegistry,
        book: ScheduleBook,
        settings: Settings,
        policy: SchedulingPolicy,
        budget: StoreBudget | None = None,
    ) -> None:
        self.stats = stats
        self.budget = budget
        self.breaker = breaker
        self.workers = workers
        self.book = book
        self.policy = policy
        self.replicas = settings.model_replicas  # busy seconds overlap on a worker's replicas
        self.limits = {"realtime": settings.admission_realtime_wait_s, "batch": settings.admission_batch_wait_s}

    def estimated_wait_s(self, due: float, *, workers_alive: int) -> float:
        """Return the seconds before a segment due at ``due`` would start, or 0 when nothing is known yet.

        Workers run the earliest deadline first, so only outstanding segments due no later than
        this one are ahead of it (with FIFO scheduling, every outstanding segment is).
        """
        recent = self.stats.window()
        speed = recent.chars_per_busy_second * max(1, workers_alive) * self.replicas
        if speed <= 0:
            return 0.0
        ahead = self.book.due_by(self.policy.ahead_until(due))
        return ahead * recent.chars_per_segment / speed

    def check_room(self) -> None:
        """Raise StoreFull (503, Retry-After) when the job store is past its budget's full mark: every job, even
        one whose audio is all cached, writes its audio into the store."""
        full = self.budget.full() if self.budget is not None else None
        if full is not None:
            ADMISSION_REJECTIONS.labels("store_full").inc()
            raise StoreFull(
                f"not accepting jobs: the job store is near its memory budget ({full.describe()}) with live jobs "
                "alone; retry when they finish",
                retry_after=10,
            )

    def admit(self, lane: str, due: float | None = None) -> float:
        """Raise ServiceUnavailable (503, Retry-After) unless a job on ``lane`` can start in time; return its wait.

        ``due`` is the job's first deadline (now when not given). A realtime job is refused when
        its first segment would wait longer than the lane's limit; a batch job only past the
        batch limit, and otherwise accepted with the estimate stated.
        """
        alive = len(self.workers.alive())
        verdict = self.breaker.check(workers_alive=alive)
        if not verdict.allowed:
            ADMISSION_REJECTIONS.labels("breaker").inc()
            raise ServiceUnavailable(f"not accepting jobs: {verdict.reason}", retry_after=verdict.retry_after)
        wait = self.estimated_wait_s(time.time() if due is None else due, workers_alive=alive)
        limit = self.limits[lane]
        if wait > limit:
            ADMISSION_REJECTIONS.labels("overload").inc()
            raise ServiceUnavailable(
                f"the {lane} lane's first audio would start in about {wait:.0f} s (limit {limit:g} s); retry later",
                retry_after=min(300, math.ceil(wait - limit) + 1),
                estimated_wait_s=round(wait, 1),
            )
        return wait
