"""Plan what of a text stream's tail became speakable, append it to the job in one step, and enqueue it.

The planner runs under a short per-job lock (one piece at a time is planned, in any API process or worker): it
plans the tail up to its safe cut (core/text/stream.py), or the whole tail for a flush or a close, and appends the
new segments in one step (APPEND_SEGMENTS, which takes the planned text off the tail's front) with their playback
deadlines, the first of them enqueued while the job's window has room. The script appends nothing when the stream
moved since the planner read it (a lapsed lock's other planner appended first, or a piece came just before a
close): the planner reads it again.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import redis
from redis.exceptions import LockError

from cache import keys, scripts
from cache.job_reads import as_str
from cache.jobstore import JobStore
from cache.records import JobRecord
from cache.schedule import ScheduleBook
from cache.scripts import AppendResult
from core.errors import ServiceUnavailable, TextOverLimit
from core.policy import Lane, SchedulingPolicy
from core.schedule import heard_at, timeline
from core.text import plan_segments, ready_cut

log = logging.getLogger(__name__)

#: How long one piece may wait for another piece of its stream to be planned.
LOCK_WAIT_S = 5.0
#: How many times a planner reads its stream again when it moved under it, before it leaves the rest to the next
#: piece or sweep (each time means another planner or piece changed the stream meanwhile, which is rare).
REPLANS = 3

#: Put segment tasks on a lane's queue (workers/celery_app.Enqueue): job id, indexes, lane, broker deadlines.
Enqueue = Callable[[str, list[int], str, Sequence[float] | None], None]


@dataclass(frozen=True)
class Caps:
    """The planning limits a stream shares with a whole job (core settings)."""

    segment_max_chars: int = 120
    first_segment_max_chars: int = 40
    max_text_chars: int = 10_000
    max_segments: int = 2_000

    def segment_cap(self, planned_segments: int) -> int:
        """Return the length cap of the next segment: the first segment's while none is planned."""
        return self.first_segment_max_chars if planned_segments == 0 else self.segment_max_chars


class Advance(enum.Enum):
    """What one planning pass did to a stream."""

    NOTHING = "nothing"  # nothing was ready, or the stream ended or moved on meanwhile
    PLANNED = "planned"
    ENDED = "ended"


@dataclass
class StreamPlanner:
    """Plan text streams' tails into their jobs' segments and enqueue them; end streams that are over."""

    store: JobStore
    book: ScheduleBook
    policy: SchedulingPolicy
    enqueue: Enqueue
    language_of: Callable[[str], str]  # a model's language, for normalisation
    caps: Caps = field(default_factory=Caps)
    flush_s: float = 1.5
    idle_s: float = 30.0

    def __post_init__(self) -> None:
        self._append = self.store.redis.register_script(scripts.APPEND_SEGMENTS)

    @property
    def redis(self) -> redis.Redis:
        return self.store.redis

    @contextlib.contextmanager
    def locked(self, job_id: str) -> Iterator[None]:
        """Hold the stream's lock: one piece at a time is joined and planned, in any API process or worker."""
        lock = self.redis.lock(keys.text_lock(job_id), timeout=30, blocking_timeout=LOCK_WAIT_S)
        if not lock.acquire():
            raise ServiceUnavailable("another piece of this text stream is still being planned; retry", retry_after=1)
        try:
            yield
        finally:
            try:
                lock.release()
            except LockError:
                log.warning("text stream %s: its lock lapsed before its piece was planned", job_id)

    def advance(self, job_id: str, *, swept_at: float | None = None) -> Advance:
        """Plan what of the tail is ready and append it, reading the stream again when it moved meanwhile; run
        under the stream's lock. ``swept_at``: the sweep's pass, which plans an idle tail whole and ends a stream
        idle past ``idle_s``."""
        for _ in range(REPLANS):
            advanced = self._advance_once(job_id, swept_at)
            if advanced is not None:
                return advanced
        log.warning("text stream %s: it moved each time it was planned; the next piece or sweep plans it", job_id)
        return Advance.NOTHING

    def plan(self, text: str, language: str, *, planned_chars: int, segments: int) -> list[str]:
        """Plan ``text`` into segments after the ``segments`` (of ``planned_chars`` characters) already planned."""
        caps = self.caps
        return plan_segments(
            text,
            max_chars=caps.segment_max_chars,
            first_max_chars=caps.first_segment_max_chars,
            language=language,
            max_total_chars=caps.max_text_chars,
            max_segments=caps.max_segments,
            planned_chars=planned_chars,
            planned_segments=segments,
        )

    def _advance_once(self, job_id: str, swept_at: float | None) -> Advance | None:
        """Plan what of the tail is ready (all of it for a flush or a close), append it, and close the stream once
        its final piece is in (or it was idle); return None when the stream moved before the append."""
        fields = ["text_tail", "text_next_seq", "text_final_seq", "segments_total", "chars_total", "request",
                  "text_last_at", "text_top_seq", "text_open"]  # fmt: skip
        tail_raw, next_raw, final_raw, total_raw, chars_raw, request_raw, last_raw, top_raw, open_raw = (
            self.redis.hmget(keys.job(job_id), fields)
        )
        if request_raw is None or open_raw != b"1":
            return Advance.NOTHING  # gone, or closed by another pass (a sweep, a lapsed lock's other planner)
        tail, next_seq, last = as_str(tail_raw or b""), int(next_raw or 0), as_str(last_raw or b"")
        reason = None
        if swept_at is not None:
            idle_s = swept_at - float(last or 0)
            if idle_s < self.flush_s:
                return Advance.NOTHING  # a piece came since the sweep looked
            if idle_s >= self.idle_s:
                reason = self._idle_reason(next_seq, int(top_raw if top_raw is not None else -1))
        close = (final_raw is not None and next_seq > int(final_raw)) or reason is not None
        total, chars = int(total_raw or 0), int(chars_raw or 0)
        cut = (
            len(tail)
            if close or swept_at is not None
            else ready_cut(tail, final=False, max_chars=self.caps.segment_cap(total))
        )
        if cut == 0 and not close:
            return Advance.NOTHING  # nothing ready (or a flush of an empty tail)
        request = JobRecord.from_hash({"id": job_id, "request": as_str(request_raw)}).request
        try:
            texts = self.plan(tail[:cut], self.language_of(request.model), planned_chars=chars, segments=total)
        except TextOverLimit as e:
            self.store.fail(job_id, f"the text stream went over the limit: {e.message}")
            raise
        why = reason or "final"
        result, published = self._write(
            job_id, request.priority, texts, tail[:cut], close=close, reason=why, read=(total, last),
            empty_error=f"the text stream ended ({why}) with nothing a voice can speak",
        )  # fmt: skip
        if result is AppendResult.STALE:
            return None
        if published:
            self._enqueue(job_id, published)
        if result in (AppendResult.FINISHED, AppendResult.FAILED) or (close and result is AppendResult.APPENDED):
            return Advance.ENDED
        return Advance.PLANNED if texts and result is AppendResult.APPENDED else Advance.NOTHING

    def _idle_reason(self, next_seq: int, top_seq: int) -> str:
        """Say why an idle stream ended, naming the pieces that waited for one that never came: taken, not spoken."""
        reason = f"idle: no text for {self.idle_s:g} s (TTS_TEXT_STREAM_IDLE_S)"
        if top_seq >= next_seq:
            reason += f"; piece {next_seq} never came, so the pieces taken after it (up to {top_seq}) were not spoken"
        return reason

    def _write(
        self,
        job_id: str,
        lane: Lane,
        texts: Sequence[str],
        planned: str,
        *,
        close: bool,
        reason: str,
        read: tuple[int, str],
        empty_error: str,
    ) -> tuple[AppendResult, list[int]]:
        """Append the segments planned from the tail's front ``planned`` in one step, unless the stream moved since
        ``read`` (its segments total and last piece's time when planned); return what it did and those to enqueue
        now."""
        now = time.time()
        store = self.store
        total, last = read
        reply = self._append(
            keys=[*keys.all_job_keys(job_id), keys.text_pieces(job_id), keys.OUTBOX, keys.LIVE_JOBS, keys.TEXT_STREAMS,
                  keys.AUDIO_KEPT, keys.STORE_OWED],
            args=[planned, empty_error, ",".join(str(len(t)) for t in texts), f"{now:.6f}", store.ttl,
                  "1" if close else "0", reason, job_id, f"{now + store.outbox_grace_s:.6f}", self.policy.window(lane),
                  store.audio_ttl, f"{now + store.audio_ttl:.3f}", total, last, *texts],
        )  # fmt: skip
        result = AppendResult(int(reply[0]))
        if result is AppendResult.FINISHED:
            store.forget_live(job_id)
        return result, [int(i) for i in reply[2:]] if result is AppendResult.APPENDED else []

    def _enqueue(self, job_id: str, indexes: list[int]) -> None:
        """Publish new segments at their playback deadlines (the listener's timeline, from the first audio)."""
        record, meta = self.store.get_with_meta(job_id)
        if record is None:
            return
        lane = record.request.priority
        deadlines = timeline(
            lane=lane,
            accepted_at=record.created_at,
            chars=list(record.segment_chars or ()),
            seconds_per_char=record.seconds_per_char or self.book.default_seconds_per_char,
            policy=self.policy.deadlines,
            durations={i: float(m["duration_s"]) for i, m in meta.items() if "duration_s" in m},
            arrivals={i: heard_at(m, 0.0) for i, m in meta.items() if "finished_at" in m},
        ).deadlines()
        due = {i: deadlines[i] if i < len(deadlines) else time.time() for i in indexes}
        try:
            self.book.add(job_id, due)
            self.enqueue(job_id, indexes, lane, self.policy.broker_order(list(due.values())))
            self.store.published(job_id, indexes)
        except Exception as e:  # they wait in the outbox, which a worker's janitor publishes after its grace
            log.warning("text stream %s: could not enqueue segments %s (%s); the outbox will", job_id, indexes, e)
