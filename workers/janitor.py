"""Hand on what a dead worker held, and publish what the outbox holds, within seconds.

Every worker runs a pass each heartbeat. It first checks its own hold set: a segment Redis says
it holds but none of its threads works on (a write or a release lost to a Redis fault) moves to
the outbox. Then one worker at a time (a short lock) hands over the hold sets of workers whose
heartbeat is older than ``dead_after_s``, and publishes the outbox entries whose time has come:
segments of dead workers (due at once) and pending segments whose taker did not publish them
within the grace (``cache.jobstore.OUTBOX_GRACE_S``). Publishing twice is safe: a segment is
written once (WRITE_SEGMENT), and its taker skips it if it exists.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import redis

from cache import keys, shedding
from cache.budget import StoreBudget, Usage
from cache.custody import Custody
from cache.jobstore import JobStore
from cache.reservations import Reservations
from cache.schedule import ScheduleBook
from cache.workers import WorkerRegistry
from core.metrics import OUTBOX_PUBLISHED, SEGMENTS_HANDED_OVER
from core.policy import SchedulingPolicy
from workers.celery_app import Enqueue

log = logging.getLogger(__name__)

#: A recount of the owed audio that corrects the total by this much is logged.
RECOUNT_LOGGED_BYTES = 2**20


def dead_workers(
    holders: Iterable[str],
    beats: Mapping[str, float],
    *,
    me: str,
    now: float,
    dead_after_s: float,
    reachable_since: float,
    interval_s: float,
) -> list[str]:
    """Return the holders whose last heartbeat (none counts as long ago) is older than ``dead_after_s``.

    Nobody is dead to a janitor that has reached Redis for less than two intervals: right after an outage
    every heartbeat is old, and live workers need a beat's time to renew theirs.
    """
    if now - reachable_since < 2 * interval_s:
        return []
    return [w for w in holders if w != me and now - beats.get(w, 0.0) > dead_after_s]


@dataclass
class Janitor:
    """One worker's view of custody: its own hold set, dead workers, and the outbox."""

    store: JobStore
    custody: Custody
    heartbeats: WorkerRegistry
    enqueue: Enqueue
    book: ScheduleBook
    worker: str
    dead_after_s: float
    interval_s: float
    working_on: Callable[[], set[str]]
    account_every_s: float = 15.0
    policy: SchedulingPolicy = field(default_factory=SchedulingPolicy)
    budget: StoreBudget | None = None  # kept each pass, by every worker (deletions are idempotent)
    reservations: Reservations | None = None  # the owed audio's total, recounted with each account
    _reachable_since: float | None = field(default=None, init=False)
    _last_pass: float = field(default=0.0, init=False)
    _last_account: float = field(default=0.0, init=False)
    _account_until: float = field(default=0.0, init=False)
    _full_since: float | None = field(default=None, init=False)  # since when live work alone filled the store

    def alarm(self) -> None:
        """Account for every segment in the next passes: a Redis error may have dropped a delivery or a reply.

        (A delivery counts as lost only once it is ``dead_after_s`` old, hence several passes.)
        """
        self._account_until = time.time() + self.dead_after_s + 2 * self.interval_s

    def run_once(self) -> dict[str, int]:
        """Run one pass; return what it moved. A pass that cannot reach Redis raises RedisError."""
        now = time.time()
        try:
            if self._reachable_since is None and self._last_pass == 0.0:
                # A fresh janitor: live workers have been beating since Redis came up (unless it just did).
                uptime = float(self.store.redis.info("server").get("uptime_in_seconds", 0))
                self._reachable_since = now - uptime
            elif self._reachable_since is None:
                self._reachable_since = now  # back from an outage: live workers need a beat's time to renew
            elif now - self._last_pass > 3 * self.interval_s:
                self._reachable_since = now  # a pause stalled every heartbeat, ours too: let them beat again
            self._last_pass = now
            counts = dict.fromkeys(("dead", "handed_over", "lost", "published"), 0)
            # First, outside the janitor's lock: at Redis's memory limit that lock's SET and every custody write are
            # refused, while trimming (deletions only; one worker at a time under a lock of its own, each worker
            # when the store refuses that one too) still runs, and is what lets them run again.
            counts["trimmed"] = self.keep_budget(now)
            counts["stale"] = self.release_own_stale(now)
            if self.store.redis.set(keys.JANITOR_LOCK, self.worker, nx=True, px=int(self.interval_s * 1000)):
                counts["dead"], counts["handed_over"] = self.bury_dead(now)
                due = now - self._last_account >= self.account_every_s or now <= self._account_until
                if counts["dead"] or due:
                    self._last_account = now
                    counts["lost"] = self.account(now)
                    self.recount_owed()
                counts["published"] = self.publish_due(now)
        except Exception:  # Redis, or the broker (the same Redis) failing a publish: kombu's OperationalError
            self._reachable_since = None
            self.alarm()
            raise
        return counts

    def keep_budget(self, now: float) -> int:
        """Keep the store inside its memory budget (cache/budget.py); return how many jobs' audio it removed."""
        if self.budget is None:
            return 0
        lock = self.store.redis.lock(keys.TRIM_LOCK, timeout=max(1.0, 2 * self.interval_s))
        try:
            held = bool(lock.acquire(blocking=False))
            if not held:
                return 0  # another worker's janitor trims now: two would remove up to twice what is needed
        except redis.OutOfMemoryError:
            held = False  # at the limit the lock's SET is refused: trim without it (deletions let writes run again)
        try:
            trimmed = self.budget.trim(now)
        finally:
            if held:
                with contextlib.suppress(redis.exceptions.LockError, redis.OutOfMemoryError):
                    lock.release()  # lapsed meanwhile (a long trim), or refused at the limit: it lapses
        if trimmed.jobs or trimmed.cache_entries:
            log.warning(
                "job store past %.0f%% of its memory budget, or short of room for a job refused lately (%s): "
                "removed the audio of the %d oldest finished jobs and %d cache entries (now %s)",
                self.budget.trim_at * 100, trimmed.before.describe() if trimmed.before else "?", trimmed.jobs,
                trimmed.cache_entries, trimmed.after.describe() if trimmed.after else "?",
                extra={"jobs": trimmed.jobs, "cache_entries": trimmed.cache_entries},
            )  # fmt: skip
        after = trimmed.after
        stuck = after is not None and bool(after.budget) and after.share >= self.budget.write_at
        if not stuck:
            self._full_since = None
        elif self._full_since is None:
            self._full_since = now  # segment writes wait; judged again next pass, after another trim
        elif now - self._full_since >= self.interval_s and after is not None:
            self._full_since = None
            self._shed(after)
        return trimmed.jobs

    def recount_owed(self) -> None:
        """Correct the audio live jobs have reserved by what their records say, where a difference lasts
        (cache/reservations.py): a sum kept by increments drifts when a process dies between two of its steps."""
        if self.reservations is None:
            return
        before, now = self.reservations.recount()
        if abs(before - now) >= RECOUNT_LOGGED_BYTES:
            log.warning(
                "the audio live jobs have reserved was counted as %d bytes, %d more than their records hold on two "
                "recounts in a row: corrected", before, before - now,
            )  # fmt: skip

    def _shed(self, usage: Usage) -> None:
        """Fail the newest live jobs of a store their audio has filled, so that the older finish (cache/shedding.py);
        one worker at a time (a lock, unless the store refuses even that), and only if their audio is what fills it."""
        assert self.budget is not None
        try:
            if not self.store.redis.set(keys.SHED_LOCK, self.worker, nx=True, px=int(2 * self.interval_s * 1000)):
                return  # another worker's janitor sheds
        except redis.OutOfMemoryError:
            pass  # at the limit: shed without it (each job is failed once; a second worker finds it over)
        needed = (usage.share - self.budget.trim_at) * usage.budget
        live_audio = shedding.live_audio_bytes(self.store.redis)
        if live_audio < needed:
            log.error(
                "job store full (%s), but not with live jobs' audio (%.0f MB of it): failing jobs would not make room. "
                "Raise its budget (maxmemory; make run: TTS_REDIS_MAXMEMORY), or keep finished jobs' records for less "
                "(TTS_JOB_TTL_S)", usage.describe(), live_audio / 2**20,
            )  # fmt: skip
            return
        shed = shedding.shed(self.budget, lambda job_id, reason, drop: self.store.fail(job_id, reason, drop_audio=drop))
        if shed:
            log.error(
                "job store full of live work (%s) with no finished audio left to remove, so no job could go on: "
                "failed the %d newest live jobs to let the older finish (%s)",
                usage.describe(), len(shed), ", ".join(shed[:8]), extra={"shed_jobs": len(shed)},
            )  # fmt: skip

    def release_own_stale(self, now: float) -> int:
        """Move to the outbox what Redis says this worker holds but no thread of it works on; return how many."""
        before = self.working_on()
        in_redis = self.custody.held(self.worker)
        stale = in_redis - before - self.working_on()  # read around the Redis read: a segment started meanwhile
        moved = self.custody.release_stale(self.worker, stale, now)
        if moved:
            log.warning("worker %s held %d segments it no longer works on: handed to the outbox", self.worker, moved)
        return moved

    def bury_dead(self, now: float) -> tuple[int, int]:
        """Hand over every dead worker's segments; return (workers buried, segments handed over)."""
        if self._reachable_since is None:
            return 0, 0
        beats = self.heartbeats.last_beats()
        dead = dead_workers(
            self.custody.holders(),
            beats,
            me=self.worker,
            now=now,
            dead_after_s=self.dead_after_s,
            reachable_since=self._reachable_since,
            interval_s=self.interval_s,
        )
        moved = 0
        for worker in dead:
            count = self.custody.hand_over(worker, now)
            moved += count
            SEGMENTS_HANDED_OVER.inc(count)
            last = beats.get(worker)
            seen = f"{now - last:.1f} s ago" if last else "never"
            log.warning("worker %s is dead (last heartbeat %s): handed over %d segments", worker, seen, count,
                        extra={"dead_worker": worker, "segments": count})  # fmt: skip
        return len(dead), moved

    def account(self, now: float) -> int:
        """Find live jobs' segments that are nowhere (not written, pending, in the outbox, queued, freshly
        delivered or held) and put them in the outbox; return how many.

        What a worker killed between kombu's pop and its hold, or a reply lost to a dropped connection, leaves.
        Segments move released (a live job's, not pending) → outbox → queue → delivered → held → written, and
        are read in that order, so one moving on during the pass is seen at least once (only kombu's own
        pop-to-unacked step can hide one: the result is a duplicate task, which is harmless). Reading the jobs
        first matters: a job submitted, or a stream's segment released, after the outbox was read would
        otherwise look lost, and be published a second time beside the API's own publish.
        """
        released = self.store.released(self.store.live_jobs())
        outbox = self.custody.in_outbox()
        queued = self.custody.queued()
        delivered = self.custody.deliveries()
        deliveries = {d.member: d for d in delivered}
        held: set[str] = set()  # a dead worker's too: handing those on is bury_dead's part
        for worker in self.custody.holders():
            held |= self.custody.held(worker)
        lost, orphaned, spent = [], [], []
        written = self.store.written(released)
        unfinished = {job_id: [i for i in indexes if i not in written[job_id]] for job_id, indexes in released.items()}
        for entry in delivered:  # an ack lost with a connection leaves one: kombu would redeliver it in an hour
            job_id, index = keys.parse_segment_member(entry.member)
            if now - entry.delivered_at >= self.dead_after_s and index not in unfinished.get(job_id, ()):
                spent.append(entry.tag)  # written, or its job ended: nothing to redeliver
        for job_id, indexes in unfinished.items():
            for index in indexes:
                member = keys.segment_member(job_id, index)
                if member in outbox or member in queued or member in held:
                    continue
                delivery = deliveries.get(member)
                if delivery is not None:
                    if now - delivery.delivered_at < self.dead_after_s:
                        continue  # just delivered: a live worker is about to hold it
                    orphaned.append(delivery.tag)  # delivered to a worker that died before holding it
                lost.append(member)
        self.custody.to_outbox(lost, now)
        self.custody.forget_deliveries(orphaned + spent)
        if lost:
            log.warning("found %d segments nowhere (%d of them delivered to a dead worker): to the outbox",
                        len(lost), len(orphaned), extra={"segments": len(lost)})  # fmt: skip
        return len(lost)

    def publish_due(self, now: float) -> int:
        """Publish the outbox entries whose time has come, skipping written segments and ended jobs."""
        members = self.custody.due(now)
        by_job: dict[str, list[int]] = {}
        for member in members:
            job_id, index = keys.parse_segment_member(member)
            by_job.setdefault(job_id, []).append(index)
        published = 0
        for job_id, indexes in by_job.items():
            record = self.store.get(job_id)
            if record is not None and not record.status.terminal:
                missing = [i for i in indexes if not self.store.has_segment(job_id, i)]
                if missing:
                    lane = record.request.priority
                    self.book.add(job_id, dict.fromkeys(missing, now))  # overdue: due now
                    self.enqueue(job_id, missing, lane, self.policy.broker_order([now] * len(missing)))
                    published += len(missing)
                    OUTBOX_PUBLISHED.inc(len(missing))
                    log.info("published %d segments of job %s from the outbox", len(missing), job_id,
                             extra={"job_id": job_id, "segments": len(missing)})  # fmt: skip
            self.store.published(job_id, indexes)
        return published
