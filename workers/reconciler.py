"""Find live jobs that nothing is working on, and put their missing segments back on the queue.

Closes the gaps at-least-once delivery leaves: an API that died between writing a
job and enqueueing it, a message lost between BRPOP and kombu's unacked record, a
chain of pending segments broken by a crash. Re-enqueueing is safe because segment
writes are idempotent. Jobs past their deadline fail with a reason.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import redis

from cache import keys
from cache.jobstore import JobStore
from cache.schedule import ScheduleBook
from workers.celery_app import Enqueue

log = logging.getLogger(__name__)


@dataclass
class Reconciler:
    """One pass over the live jobs; run it from one worker at a time (see ``run_once``)."""

    store: JobStore
    enqueue: Enqueue
    stall_s: float
    deadline_s: float
    book: ScheduleBook | None = None

    def reconcile(self, now: float | None = None) -> dict[str, int]:
        """Re-enqueue stalled jobs' missing segments and fail jobs past their deadline; return counts."""
        now = time.time() if now is None else now
        counts = {"requeued_jobs": 0, "requeued_segments": 0, "expired": 0, "forgotten": 0}
        for job_id in self.store.live_jobs():
            record = self.store.get(job_id)
            if record is None or record.status.terminal:
                self.store.forget_live(job_id)
                counts["forgotten"] += 1
                continue
            if now - record.created_at > self.deadline_s:
                self.store.fail(job_id, f"deadline of {self.deadline_s:.0f} s exceeded")
                counts["expired"] += 1
                continue
            if now - record.updated_at < self.stall_s:
                continue
            waiting = set(self.store.pending(job_id))  # not lost: the enqueue window feeds them in later
            missing = [i for i in self.store.missing_segments(job_id, record.segments_total) if i not in waiting]
            if not missing:
                continue
            lane = record.request.priority
            self.store.touch(job_id)
            if self.book is not None:
                self.book.add(job_id, dict.fromkeys(missing, now))  # overdue: due now
            self.enqueue(job_id, missing, lane)
            log.warning("job %s stalled: re-enqueued %d segments", job_id, len(missing),
                        extra={"job_id": job_id, "segments": len(missing)})  # fmt: skip
            counts["requeued_jobs"] += 1
            counts["requeued_segments"] += len(missing)
        counts["unscheduled"] = self.prune_schedule(now)
        return counts

    def prune_schedule(self, now: float) -> int:
        """Forget overdue schedule entries of segments already written or of jobs that ended; return how many."""
        if self.book is None:
            return 0
        gone: dict[str, list[int]] = {}
        for job_id, index in self.book.overdue_since(now - self.stall_s / 10):
            record = self.store.get(job_id)
            if record is None or record.status.terminal or self.store.has_segment(job_id, index):
                gone.setdefault(job_id, []).append(index)
        for job_id, indexes in gone.items():
            self.book.remove(job_id, indexes)
        return sum(len(i) for i in gone.values())

    def run_once(self, *, holder: str, interval_s: float) -> dict[str, int] | None:
        """Reconcile if no other worker holds the lock this interval; return counts, or None if skipped."""
        client: redis.Redis = self.store.redis
        if not client.set(keys.RECONCILER_LOCK, holder, nx=True, px=int(interval_s * 1000)):
            return None
        return self.reconcile()
