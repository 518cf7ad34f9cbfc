"""Jobs whose text arrives in pieces: take each piece in seq order, and let the planner plan what became speakable.

A text stream is a job whose record says ``text_open``. Its pieces are kept by seq (so a retry is recognised
and spoken once). One script (TAKE_PIECE) checks a piece and joins it, with every piece that now follows
without a gap, to the record's ``text_tail``: most pieces cost that alone. When the tail holds a safe cut
(core/text/stream.py: a complete sentence, or past the length cut-off a clause or word boundary that splits no
number), or the final piece is in, the planner (cache/stream_planner.py) plans it under the stream's lock.
``sweep`` runs in every worker: a tail idle past ``flush_s`` is planned whole (the idle cut-off), and a stream
idle past ``idle_s`` ends with what it has, its record saying why (and naming the pieces that waited for a gap
that never filled). A stream that ends with nothing to speak fails, and says why it ended all the same.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from cache import keys, scripts
from cache.job_reads import as_str
from cache.jobstore import JobStore
from cache.records import JobStatus, PieceResult
from cache.schedule import ScheduleBook
from cache.stream_planner import Advance, Caps, Enqueue, StreamPlanner
from core.errors import ServiceUnavailable, TextOverLimit
from core.policy import SchedulingPolicy
from core.settings import Settings
from core.text import ready_cut

log = logging.getLogger(__name__)

#: A piece may run this far ahead of the next seq expected (later ones wait for the gap to fill).
MAX_AHEAD = 256
#: How many idle streams one sweep pass looks at (the rest wait for the next pass, oldest first).
SWEEP_BATCH = 200


@dataclass(frozen=True)
class PieceAnswer:
    """What became of one piece, and where its stream stands."""

    result: PieceResult
    seq: int
    detail: int = 0  # the final seq (AFTER_FINAL), the next expected (TOO_FAR) or the characters (TOO_LONG)
    segments_total: int = 0
    open: bool = True
    next_seq: int = 0
    taken_past: int | None = None  # a final piece refused (CONFLICT): the highest seq already taken past it


@dataclass
class TextStreams:
    """Take text-stream pieces and have them planned into a job's segments; end idle streams."""

    planner: StreamPlanner
    pieces_ttl_s: int = 6 * 3600 + 86400

    def __post_init__(self) -> None:
        self._take = self.redis.register_script(scripts.TAKE_PIECE)

    @property
    def redis(self) -> redis.Redis:
        return self.planner.redis

    @property
    def flush_s(self) -> float:
        return self.planner.flush_s

    @property
    def idle_s(self) -> float:
        return self.planner.idle_s

    def first_plan(self, text: str, language: str) -> tuple[list[str], str]:
        """Plan what of a stream's opening text is speakable now; return its segments and the tail kept back."""
        cut = ready_cut(text, final=False, max_chars=self.planner.caps.first_segment_max_chars)
        return self.planner.plan(text[:cut], language, planned_chars=0, segments=0), text[cut:]

    def take(
        self, job_id: str, *, seq: int, text: str, final: bool, owner: str | None = None, store_full: bool = False
    ) -> PieceAnswer:
        """Take one piece; plan and enqueue what it made speakable. Raise TextOverLimit (413) when the stream's
        text, once normalised, would be more than one job may carry (the job fails with the reason).

        With ``owner``, a job some other caller owns is GONE to this one (404), checked in the same script. With
        ``store_full``, a piece that adds text is NO_ROOM and not kept (a retry, a final mark or an empty final
        piece is still taken): its audio, reserved as it is planned, would have no room in the job store.

        Most pieces only join the tail (one script); the stream's lock and the planner run only when the tail
        holds a safe cut, or the final piece.
        """
        caps = self.planner.caps
        reply = self._take(
            keys=[keys.job(job_id), keys.text_pieces(job_id), keys.TEXT_STREAMS],
            args=[seq, text, "1" if final else "0", len(text), caps.max_text_chars, self.pieces_ttl_s,
                  f"{time.time():.6f}", MAX_AHEAD, job_id, "1" if store_full else "0",
                  *(() if owner is None else (owner,))],
        )  # fmt: skip
        result = PieceResult(int(reply[0]))
        if result is not PieceResult.TAKEN:
            taken_past = int(reply[2]) if result is PieceResult.CONFLICT and len(reply) > 2 else None
            return self._answer(job_id, result, seq, int(reply[1]), taken_past)
        tail, final_reached, total, next_seq = as_str(reply[2]), bool(int(reply[3])), int(reply[4]), int(reply[5])
        if not final_reached and ready_cut(tail, final=False, max_chars=caps.segment_cap(total)) == 0:
            return PieceAnswer(result, seq, 0, total, True, next_seq)  # nothing speakable yet: it waits
        with self.planner.locked(job_id):
            self.planner.advance(job_id)
        return self._answer(job_id, result, seq, 0)

    def _answer(
        self, job_id: str, result: PieceResult, seq: int, detail: int, taken_past: int | None = None
    ) -> PieceAnswer:
        status, total, open_raw, next_seq = self.redis.hmget(
            keys.job(job_id), ["status", "segments_total", "text_open", "text_next_seq"]
        )
        is_open = open_raw == b"1" and not (status is None or JobStatus(as_str(status)).terminal)
        return PieceAnswer(result, seq, detail, int(total or 0), is_open, int(next_seq or 0), taken_past)

    def sweep(self, now: float | None = None) -> dict[str, int]:
        """Plan the tails of streams idle past ``flush_s``; end those idle past ``idle_s``; return the counts."""
        now = time.time() if now is None else now
        flush_s, idle_s = self.flush_s, self.idle_s
        counts = {"flushed": 0, "ended": 0}
        for raw in self.redis.zrangebyscore(keys.TEXT_STREAMS, "-inf", now - flush_s, start=0, num=SWEEP_BATCH):
            job_id = as_str(raw)
            swept = self._swept(job_id)
            if swept is None:  # gone, over, or its stream closed
                self.redis.zrem(keys.TEXT_STREAMS, job_id)
                continue
            last, tail_bytes = swept
            if not tail_bytes and now - last < idle_s:
                # Nothing to flush: due again only when it would end idle (a piece brings it back sooner), so that
                # streams opened and left empty do not take the turns of those with a sentence waiting.
                self.redis.zadd(keys.TEXT_STREAMS, {job_id: last + idle_s - flush_s}, gt=True)
                continue
            # Looked at now: to the back of the index, so that more than a pass's worth of open streams all get
            # their turn (a piece moves it later still; idleness is judged on the record's last piece).
            self.redis.zadd(keys.TEXT_STREAMS, {job_id: now}, gt=True)
            if now - last < flush_s:
                continue  # a piece came meanwhile
            try:
                with self.planner.locked(job_id):
                    advanced = self.planner.advance(job_id, swept_at=now)
                if advanced is not Advance.NOTHING:
                    counts["ended" if advanced is Advance.ENDED else "flushed"] += 1
            except (ServiceUnavailable, TextOverLimit) as e:
                log.warning("text stream %s: %s", job_id, e)
            except redis.RedisError:
                raise  # the pass fails as a whole; the next one tries again
            except Exception:  # one stream's fault (its model left the registry, say) must not stop the sweep
                log.exception("text stream %s: its idle pass failed", job_id)
        return counts

    def _swept(self, job_id: str) -> tuple[float, int] | None:
        """Return when an open stream's last piece came and how many bytes its tail holds, in one round trip (the
        tail itself is read only by the planner); None when the job is gone or over, or its stream closed."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hmget(keys.job(job_id), ["status", "text_open", "text_last_at", "created_at"])
        pipe.hstrlen(keys.job(job_id), "text_tail")
        (status, open_raw, last_raw, created_raw), tail_bytes = pipe.execute()
        if status is None or JobStatus(as_str(status)).terminal or open_raw != b"1":
            return None
        return float(last_raw or created_raw or 0), int(tail_bytes)


def build_text_streams(
    settings: Settings,
    *,
    store: JobStore,
    book: ScheduleBook,
    policy: SchedulingPolicy,
    enqueue: Enqueue,
    language_of: Callable[[str], str],
) -> TextStreams:
    """Return the text streams of one process (the API's, or a worker's sweep) from the settings."""
    caps = Caps(
        segment_max_chars=settings.segment_max_chars,
        first_segment_max_chars=settings.first_segment_max_chars,
        max_text_chars=settings.max_text_chars,
        max_segments=settings.max_segments,
    )
    planner = StreamPlanner(
        store=store,
        book=book,
        policy=policy,
        enqueue=enqueue,
        language_of=language_of,
        caps=caps,
        flush_s=settings.text_stream_flush_s,
        idle_s=settings.text_stream_idle_s,
    )
    return TextStreams(planner=planner, pieces_ttl_s=int(settings.job_deadline_s) + settings.job_ttl_s)
