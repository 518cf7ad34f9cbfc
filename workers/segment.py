"""Make one segment of one job: read it, synthesise it, write it once in the step that advances its job.

What only observes the write (metrics, the sentence-cache fill, the pace book, the job's summary) is handed to
observers afterwards (workers/observers.py).
"""

from __future__ import annotations

import contextlib
import enum
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable

import redis

from cache import keys
from cache.jobstore import JobRecord, JobStore, SegmentStart, SegmentWrite, StartState, WriteResult
from cache.reservations import chars_at_speed_one
from cache.schedule import ScheduleBook
from cache.sentences import SentenceCache
from cache.stats import Stats
from core.audio import to_pcm16
from core.errors import StoreFull
from core.metrics import SEGMENT_REDELIVERIES, SEGMENTS, STORE_FULL_WAITS
from core.policy import SchedulingPolicy
from core.registry import Registry
from core.schedule import Timeline
from workers.arrivals import FirstArrivals
from workers.backend import SynthesisBackend
from workers.celery_app import Enqueue
from workers.engines.base import SynthesisRequest
from workers.fragment_writer import FragmentWriter
from workers.observers import MadeSegment, SegmentObserver, default_observers
from workers.timelines import Timelines

log = logging.getLogger(__name__)


class Outcome(enum.Enum):
    """What became of one segment task."""

    WRITTEN = "written"
    DUPLICATE = "duplicate"
    SKIPPED = "skipped"
    GAVE_UP = "gave_up"


class SegmentSynthesizer:
    """Read a segment from the job store, synthesise it, write its audio once."""

    def __init__(
        self,
        *,
        store: JobStore,
        cache: SentenceCache,
        stats: Stats,
        enqueue: Enqueue,
        registry: Registry,
        backend: SynthesisBackend,
        max_attempts: int,
        worker: str,
        book: ScheduleBook,
        policy: SchedulingPolicy,
        wait_for_room: Callable[[float], bool] | None = None,
        has_room: Callable[[], bool] | None = None,
        room_wait_s: float = 60.0,
        observer: SegmentObserver | None = None,
        arrivals: FirstArrivals | None = None,
    ) -> None:
        self.store = store
        self.cache = cache
        self.stats = stats
        self.enqueue = enqueue
        self.registry = registry
        self.backend = backend
        self.max_attempts = max_attempts
        self.worker = worker
        self.book = book
        self.policy = policy
        self.wait_for_room = wait_for_room  # blocks until the store has room (cache/budget.py), or says it timed out
        self.has_room = has_room  # whether a segment may be written now, short of the limit (cache/budget.py)
        self.room_wait_s = room_wait_s
        self._timelines = Timelines(
            store=store, policy=policy.deadlines, default_pace=book.default_seconds_per_char, arrivals=arrivals
        )
        self.observer = observer or default_observers(stats=stats, cache=cache, book=book, store=store)
        self._working_on: Counter[str] = Counter()  # deliveries received and not let go
        self._running: Counter[str] = Counter()  # of those, the ones a thread has started on
        self._working_lock = threading.Lock()

    def working_on(self) -> set[str]:
        """Return the segments (``keys.segment_member``) delivered to this worker and not yet let go."""
        with self._working_lock:
            return set(self._working_on) | set(self._running)

    def received(self, job_id: str, index: int) -> bool:
        """Hold a delivered segment before a thread starts on it (a worker killed meanwhile hands it on too);
        say whether Redis has the hold (START_SEGMENT records it again)."""
        with self._working_lock:  # before Redis holds it: the janitor never finds it held and unowned
            self._working_on[keys.segment_member(job_id, index)] += 1
        try:
            self.store.hold(self.worker, job_id, index)
        except redis.RedisError:
            return False
        return True

    def _deliveries_here(self, member: str) -> int:
        with self._working_lock:
            return self._working_on[member]

    def started(self, job_id: str, index: int) -> None:
        """Note that a thread has started on a delivered segment (``let_go`` ends it)."""
        with self._working_lock:
            self._running[keys.segment_member(job_id, index)] += 1

    def let_go(self, job_id: str, index: int) -> None:
        """Forget a delivered segment whose task has ended (written, skipped, failed or retried)."""
        member = keys.segment_member(job_id, index)
        with self._working_lock:
            for counts in (self._working_on, self._running):
                counts[member] -= 1
                if counts[member] <= 0:
                    del counts[member]

    def forget_unstarted(self) -> int:
        """Forget the deliveries no thread has started; return how many. Call it when Celery's consumer loses its
        broker connection: Celery then drops every such request (a retry waiting out its countdown, a request
        reserved for a thread), so no task will let them go. Their holds go stale, and the janitor hands the
        segments on (kombu may also deliver their messages again: a segment made twice is written once)."""
        with self._working_lock:
            before = sum(self._working_on.values())
            self._working_on &= self._running  # what runs stays held until it ends
            return before - sum(self._working_on.values())

    def run(self, job_id: str, index: int, *, token: str | None = None) -> Outcome:
        """Make segment ``index`` of ``job_id`` unless it exists or its job is over.

        ``token`` names this delivery (see ``JobStore.start_segment``): a redelivery of the same attempt is
        not counted against the segment's attempts.
        """
        # One atomic read: the job, whether the segment exists, the attempt, its text, what is done (all of it
        # only when this worker does not know the job yet: a segment's start never reads the whole job).
        known = self._timelines.known(job_id)
        start = self.store.start_segment(job_id, index, worker=self.worker, token=token, known=known)
        if start.state is not StartState.GO:
            # Nothing to make: the hold its delivery took goes now, not as a stale one the janitor must hand on.
            with contextlib.suppress(redis.RedisError):
                self.store.release(self.worker, job_id, index)
            if start.state is StartState.WRITTEN:
                return Outcome.DUPLICATE
            self._timelines.forget(job_id)  # failed, canceled or finished elsewhere: none of its segments comes here
            return Outcome.SKIPPED
        if start.redelivered:
            SEGMENT_REDELIVERIES.inc()
            if self._deliveries_here(keys.segment_member(job_id, index)) > 1:
                # kombu put this message back (a lost connection) while its first delivery runs here: that one
                # writes the segment; making it twice would only double the work of a worker catching up.
                SEGMENTS.labels(Outcome.DUPLICATE.value).inc()
                return Outcome.DUPLICATE
        try:
            return self._make(job_id, index, start)
        except Exception:
            with contextlib.suppress(redis.RedisError):  # else the janitor finds the hold stale
                self.store.release(self.worker, job_id, index)
            raise

    def _make(self, job_id: str, index: int, start: SegmentStart) -> Outcome:
        """Synthesise a started segment, write it in the step that advances its job, then tell the observers."""
        if start.failed >= self.max_attempts:
            # A delivery after its worker died on it each time (a crash the worker could not report): stop the
            # loop. Only failures count: redeliveries, duplicate publishes and Redis faults never fail a job.
            self.store.release(self.worker, job_id, index)
            reason = f"segment {index} failed {start.failed} times (its engine raised or its worker died making it)"
            self.store.fail(job_id, reason)
            self._timelines.forget(job_id)
            return Outcome.GAVE_UP
        if start.record is None or start.text is None:
            self.store.release(self.worker, job_id, index)
            return Outcome.SKIPPED
        self.observer.started(start, index)
        plan = self._timelines.of(job_id, start)
        lane = start.record.request.priority
        if index > 0 and self.policy.by_deadline:
            # Its listener starts when segment 0 is written, perhaps by another worker: learn of it at once.
            self._timelines.await_first(job_id, plan, lane)
        made = self._synthesize(job_id, index, start.record, start.text, plan)
        self.observer.made(made)
        write = self._write(made, start.attempt)
        outcome = _OUTCOMES[write.result]
        if outcome is Outcome.WRITTEN:  # later segments here follow its listener
            plan.arrived(index, made.first_heard_at, made.duration_s * self.policy.deadlines.stretch(lane))
        self.observer.written(made, outcome.value)
        if write.result is WriteResult.FINISHED:
            self._timelines.forget(job_id)
            self.observer.job_finished(job_id, lane)
        elif write.next_index is not None:
            self._feed_next(job_id, write.next_index, plan, lane)
        return outcome

    def _synthesize(self, job_id: str, index: int, record: JobRecord, text: str, plan: Timeline) -> MadeSegment:
        """Run the segment through the engine by its deadline, which moves with its listener meanwhile."""
        request = record.request
        spec = self.registry.get(request.model, request.mode)  # the mode's variant, in its own host

        def due() -> float:  # moves with the job's listener as its earlier segments arrive
            return plan.deadline(index)

        started = time.perf_counter()
        writer = FragmentWriter(self.store, job_id, index, has_room=self.has_room)
        wave, rate = self.backend.synthesize(
            spec,
            SynthesisRequest(text=text, voice=request.voice, speed=request.speed, seed=request.seed, mode=request.mode),
            deadline=(plan.due0 if index == 0 else due) if self.policy.by_deadline else None,
            # A later segment is early (ordered before its deadline) only once its listener plays: until the job's
            # first segment has arrived, none of its later ones can stall anyone, and none goes before it.
            early=plan.started if index > 0 else False,
            fragment=writer,
        )
        synth_s = time.perf_counter() - started
        joined = writer.joined()
        pcm = joined.pcm if joined.lengths else to_pcm16(wave)  # a backend that tells no fragments: one, the whole
        return MadeSegment(
            job_id=job_id,
            index=index,
            text=text,
            spec=spec,
            request=request,
            audio=self.store.pack(pcm, rate),  # encoded once: the store and the cache keep these bytes
            sample_rate=rate,
            duration_s=len(pcm) / 2 / rate,
            synth_s=synth_s,
            finished_at=time.time(),
            deadline=due(),
            accepted_at=record.created_at,
            worker=self.worker,
            heard_at=joined.first_at or 0.0,
            fragments=tuple(joined.lengths),
        )

    def _write(self, made: MadeSegment, attempt: int) -> SegmentWrite:
        """Write a made segment; while the store is at its memory limit, wait for room rather than lose the work.

        A full store is not the engine's fault: nothing is counted against the segment or the breaker. After
        ``room_wait_s`` the StoreFull error lets the task retry later, as the same attempt (workers/tasks.py).
        """
        job_id, index, meta = made.job_id, made.index, {**made.meta(), "attempt": attempt}
        waited_from = time.monotonic()
        while True:
            refused: redis.OutOfMemoryError | None = None
            # Short of the limit, not at it: Redis at maxmemory refuses the broker's own writes too (a reserved
            # task's bookkeeping), which Celery's consumer takes for an unrecoverable error, and the worker dies.
            if self.has_room is None or self.has_room():
                try:
                    return self.store.write_segment(
                        job_id, index, made.audio, sample_rate=made.sample_rate, meta=meta, worker=self.worker,
                        advance=True, learn=(made.spec.name, chars_at_speed_one(len(made.text), made.request.speed)),
                    )  # fmt: skip
                except redis.OutOfMemoryError as e:
                    refused = e
            STORE_FULL_WAITS.inc()
            left = self.room_wait_s - (time.monotonic() - waited_from)
            if left <= 0 or self.wait_for_room is None or not self.wait_for_room(left):
                raise StoreFull(f"the job store stayed at its memory limit for {self.room_wait_s:g} s") from refused
            log.warning("job %s: the store is full; segment %d waits for room to be written", job_id, index)

    def _feed_next(self, job_id: str, index: int, plan: Timeline, lane: str) -> None:
        """Publish the pending segment the write moved to the outbox: each one finished lets one more in."""
        deadline = plan.deadline(index)
        try:
            self.book.add(job_id, {index: deadline})
            self.enqueue(job_id, [index], lane, self.policy.broker_order([deadline]))
            self.store.published(job_id, [index])
        except Exception as e:  # the segment is written: failing its task now would only repeat it
            log.warning("job %s: could not publish segment %d (%s); the outbox will", job_id, index, e)


_OUTCOMES = {
    WriteResult.FINISHED: Outcome.WRITTEN,
    WriteResult.WRITTEN: Outcome.WRITTEN,
    WriteResult.DUPLICATE: Outcome.DUPLICATE,
    WriteResult.GONE: Outcome.SKIPPED,
    WriteResult.OVER: Outcome.SKIPPED,
}
