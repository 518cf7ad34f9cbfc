"""Admission control: refuse work the service cannot start in time, and work it is failing at."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Sequence

import redis

from cache.breaker import CircuitBreaker
from cache.budget import StoreBudget, Usage
from cache.refusals import Refusals
from cache.reservations import NOTHING, Reservations, Reserved, Verdict
from cache.schedule import ScheduleBook
from cache.stats import Stats
from cache.workers import WorkerRegistry
from core.errors import ServiceUnavailable, StoreFull, StoreTooSmall
from core.metrics import ADMISSION_REJECTIONS, ADMISSION_RETRIES_ADMITTED
from core.policy import SchedulingPolicy
from core.schedule import admission_excess
from core.settings import Settings

#: The admitted segments a realtime admission weighs: due from this long ago (older ones are a stuck stream's,
#: which the janitor ends) ...
PAST_S = 60.0
#: ... to this far ahead (later ones cannot make a job due now late) ...
HORIZON_S = 120.0
#: ... and at most this many (more is an overload whatever their deadlines).
MOST_WEIGHED = 2000
#: The first-audio check reads the first segments made this recently ...
FIRST_AUDIO_WINDOW_S = 5
#: ... and only when there were at least this many (fewer say little; an idle service is let in).
FIRST_AUDIO_SAMPLES = 3

#: A refusal's detail present only when the job was refused for the margin kept for retries alone (its value: the
#: margin): such a refusal is not for want of capacity, so its retry is not awaited.
KEPT_FOR_RETRIES = "room_kept_for_retries_s"

#: Who asks: the caller id and the digest of the request's body (None: not known, judged as a newcomer).
Asker = tuple[str, str] | None


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
        reservations: Reservations | None = None,
        refusals: Refusals | None = None,
    ) -> None:
        self.stats = stats
        self.budget = budget
        self.reservations = reservations
        self.breaker = breaker
        self.workers = workers
        self.book = book
        self.policy = policy
        self.limits = {"realtime": settings.admission_realtime_wait_s, "batch": settings.admission_batch_wait_s}
        self.lateness_s = settings.admission_lateness_s
        self.first_audio_s = settings.admission_first_audio_s
        self.retry_margin_s = settings.admission_retry_margin_s
        self.batch_share = settings.store_batch_share
        self.refusals = refusals
        # The last pace of a segment made alone this process saw: of any model ("") and of each model.
        self._solo_s_per_char: dict[str, float] = {}

    def pace(self, *, hosts: int) -> tuple[float, float]:
        """Return the engines' recent pace: seconds per segment, all of them together, and how long after its call
        starts a segment is heard (its first fragment; the whole call with fragments off); 0, 0 when unknown."""
        recent = self.stats.window()
        speed = recent.chars_per_busy_second * max(1, hosts)  # busy seconds overlap on the hosts
        return (recent.chars_per_segment / speed if speed > 0 else 0.0), recent.seconds_to_audio

    def segment_s(self, *, hosts: int) -> float:
        """Return the seconds the engines take per segment at their recent pace, all of them together (0: unknown)."""
        return self.pace(hosts=hosts)[0]

    def estimated_wait_s(self, due: float, *, hosts: int) -> float:
        """Return the seconds before a segment due at ``due`` would start, or 0 when nothing is known yet.

        Workers run the earliest deadline first, so only outstanding segments due no later than
        this one are ahead of it (with FIFO scheduling, every outstanding segment is).
        """
        return self.book.due_by(self.policy.ahead_until(due)) * self.segment_s(hosts=hosts)

    def excess_s_if_admitted(
        self, deadlines: Sequence[float], *, hosts: int, now: float, margin_s: float = 0.0
    ) -> float:
        """Return by how long admitting a job with these deadlines would delay some listener past the allowance
        (less ``margin_s``: the room it must leave)."""
        segment_s, call_s = self.pace(hosts=hosts)
        if segment_s <= 0 or not deadlines:
            return 0.0
        ahead, outstanding, overdue = self.book.window(now - PAST_S, now + HORIZON_S, limit=MOST_WEIGHED)
        # Also ahead of everything weighed: the long-overdue, and under FIFO everything not weighed.
        before = outstanding - len(ahead) if not self.policy.by_deadline else overdue
        new = [d for d in deadlines if d <= now + HORIZON_S]
        return admission_excess(now, ahead, new, segment_s=segment_s, allowance_s=self.lateness_s,
                                by_deadline=self.policy.by_deadline, before=before, call_s=call_s,
                                margin_s=margin_s)  # fmt: skip

    def check_listeners(self, deadlines: Sequence[float], *, hosts: int, margin_s: float = 0.0) -> None:
        """Raise ServiceUnavailable (503) when admitting a realtime job would make a listener wait: a segment of a
        stream already admitted (or playing) past its deadline, or its own audio past the allowance, or either
        with less than ``margin_s`` to spare (the room kept for retries).

        Retry-After is how long the engines need, at their pace, to clear the excess work (at least 1 s); a
        retry then is judged without the margin, which newcomers meanwhile leave free.
        """
        if self.lateness_s <= 0:
            return
        excess = self.excess_s_if_admitted(deadlines, hosts=hosts, now=time.time(), margin_s=margin_s)
        if excess > 0:
            ADMISSION_REJECTIONS.labels("deadlines").inc()
            excess = max(0.0, excess - margin_s)  # as a retry, judged without the margin, would find it
            over = (
                f"would delay a listener about {excess:.1f} s more than allowed"
                if excess > 0
                else f"would leave less than the {margin_s:g} s kept for retries (TTS_ADMISSION_RETRY_MARGIN_S)"
            )
            kept = {} if excess > 0 else {KEPT_FOR_RETRIES: margin_s}
            raise ServiceUnavailable(
                f"the engines are at capacity: admitting this realtime job {over} (streams already admitted: their "
                f"deadlines; this job: TTS_ADMISSION_LATENESS_S={self.lateness_s:g} s); retry after Retry-After, "
                'or submit with priority "batch"',
                retry_after=max(1, math.ceil(excess)),
                estimated_excess_s=round(excess, 2),
                **kept,
            )

    def estimated_first_audio_s(self, first_chars: int, model: str = "") -> float:
        """Return how long a first segment of ``first_chars`` would take to its first fragment, at the pace recent
        first segments of ``model`` (its variant's name) took, per character, or of every model's while it made too
        few lately to say; 0 when they made too few too."""
        recent = self.stats.window(seconds=FIRST_AUDIO_WINDOW_S)
        own = recent.of(model)
        if own.firsts >= FIRST_AUDIO_SAMPLES:
            return first_chars * own.first_audio_s_per_char
        if recent.firsts < FIRST_AUDIO_SAMPLES:
            return 0.0
        return first_chars * recent.first_audio_s_per_char

    def alone_first_audio_s(self, first_chars: int, model: str = "") -> float:
        """Return how long a segment of ``first_chars`` takes to its first fragment made alone, at the pace of the
        last minute's one-segment engine calls of ``model`` (or of the last ones this process saw), or of every
        model's while it has none; 0 before any."""
        recent = self.stats.window()
        paces = {"": recent.solo_s_per_char, **({model: recent.of(model).solo_s_per_char} if model else {})}
        self._solo_s_per_char.update({key: pace for key, pace in paces.items() if pace > 0})
        return first_chars * (self._solo_s_per_char.get(model, 0.0) or self._solo_s_per_char.get("", 0.0))

    def check_first_audio(self, first_chars: int, *, margin_s: float = 0.0, model: str = "") -> None:
        """Raise ServiceUnavailable (503) when a realtime job's first audio (its first segment's first fragment)
        would take longer than ``TTS_ADMISSION_FIRST_AUDIO_S`` to make, or, on engines that take longer than that
        alone, that much longer than alone (less ``margin_s``, the room kept for retries, down to half the limit at
        most), judged by how long recent first segments took to their first fragment, per character.

        The deadline check (``check_listeners``) counts the work queued ahead of a newcomer; this one sees what a
        queue estimate cannot: a first segment shares its engine call with every row in it, so under load it takes
        longer to make whatever is ahead of it. Refusing newcomers then shrinks the calls, and first segments speed
        up again. Retry-After is the time first segments take now, and never less than
        the window the estimate reads (``FIRST_AUDIO_WINDOW_S``): a retry sooner is judged on mostly the same slow
        first segments.
        """
        if self.first_audio_s <= 0 or first_chars <= 0:
            return
        estimate = self.estimated_first_audio_s(first_chars, model)
        if estimate <= 0:
            return
        # Engines that make a first segment within the limit are held to it; slower ones (a big model on CPUs),
        # to the limit beyond what they take alone, so that a job alone is still let in.
        alone = self.alone_first_audio_s(first_chars, model)
        over = alone if alone > self.first_audio_s else 0.0
        kept_s = min(margin_s, self.first_audio_s / 2)
        if estimate - over > self.first_audio_s - kept_s:
            ADMISSION_REJECTIONS.labels("first_audio").inc()
            less = f", less {kept_s:g} s kept for retries" if kept_s > 0 else ""
            raise ServiceUnavailable(
                f"the engines are at capacity: this realtime job's first audio would take about {estimate:.1f} s to "
                f"make{f', {estimate - over:.1f} s longer than alone' if over else ''} (limit "
                f"TTS_ADMISSION_FIRST_AUDIO_S={self.first_audio_s:g} s{less}); retry after Retry-After, "
                'or submit with priority "batch"',
                retry_after=max(FIRST_AUDIO_WINDOW_S, math.ceil(estimate)),
                estimated_first_audio_s=round(estimate, 2),
                **({KEPT_FOR_RETRIES: kept_s} if estimate - over <= self.first_audio_s else {}),
            )

    def reserve_audio(self, model: str, chars: int, lane: str = "realtime") -> Reserved:
        """Reserve the audio a job of ``chars`` characters on ``model`` will write; return what was reserved.

        Every job, even one whose audio is all cached, writes its audio into the job store. Raise StoreFull (503,
        Retry-After) when that audio, with the memory used and the audio live jobs have reserved, would pass the
        budget's full mark, and StoreTooSmall (413) when it would pass it with no other job's audio in the store
        (beside what the store keeps for good, judged when no job is live: records, queues). A batch job's mark is
        ``TTS_STORE_BATCH_SHARE`` of the full mark, so that realtime jobs always find room.
        """
        if self.budget is None or self.reservations is None:
            return NOTHING
        usage = self.budget.recent()
        if not usage.budget:
            return NOTHING
        share = self.batch_share if lane == "batch" else 1.0
        limit = int(usage.budget * self.budget.full_at * share)
        found = self.reservations.reserve(model, chars, largest=limit, most=limit - usage.used, lane=lane)
        estimate = found.audio
        mb = f"about {estimate.bytes / 2**20:.1f} MB at {estimate.per_char:,.0f} bytes per character"
        lane_note = f" for the batch lane: TTS_STORE_BATCH_SHARE={share:g}" if share < 1 else ""
        kept = None
        if found.verdict is Verdict.NO_ROOM and found.learned:  # with nothing live, can it ever fit?
            with contextlib.suppress(redis.RedisError):
                kept = self.budget.kept_for_good()
        if found.verdict is Verdict.TOO_LARGE or (kept is not None and kept + estimate.bytes > limit):
            ADMISSION_REJECTIONS.labels("store_too_small").inc()
            beside = "" if kept is None else f" beside what it keeps for good ({kept / 2**20:.1f} MB: records, queues)"
            raise StoreTooSmall(
                f"this job's audio ({mb}, what {model} wrote lately) would not fit in the job store's memory budget "
                f"({limit / 2**20:.0f} MB, its full mark{lane_note}){beside} even with no other job running: split "
                "the text into several jobs, or raise the budget (maxmemory; make run: TTS_REDIS_MAXMEMORY)",
                estimated_audio_bytes=estimate.bytes,
                budget_bytes=limit,
            )
        if found.verdict is Verdict.NO_ROOM:
            ADMISSION_REJECTIONS.labels("store_full").inc()
            if found.learned:  # older finished audio makes way for it (an estimate at the default says little)
                with contextlib.suppress(redis.RedisError):  # at the memory limit: the 503 is still the answer
                    self.reservations.want_room(limit - estimate.bytes, estimate.bytes, lane)
            raise StoreFull(
                f"not accepting this job: its audio ({mb}) would not fit in the job store's memory budget "
                f"({Usage(usage.used, usage.budget, found.owed).describe()}, full for this lane at "
                f"{self.budget.full_at * share:.0%}); "
                "retry when live jobs finish, or submit a shorter text",
                retry_after=10,
                estimated_audio_bytes=estimate.bytes,
            )
        return estimate

    def store_full(self) -> bool:
        """Return whether the memory used and the audio live jobs have reserved reach the budget's full mark (as read
        at most ``read_every_s`` ago). A text stream's later piece then adds no text (cache/text_streams.py): its
        audio could not be reserved, and a stream grown into a full store would have the budget fail other jobs."""
        if self.budget is None:
            return False
        usage = self.budget.recent()
        return bool(usage.budget) and usage.projected_share >= self.budget.full_at

    def release_audio(self, reserved: int) -> None:
        """Give back a reservation no job was written for (its submission failed after ``reserve_audio``)."""
        if self.reservations is not None:
            self.reservations.release(reserved)

    def check_realtime(
        self, deadlines: Sequence[float], first_chars: int, *, hosts: int, asker: Asker, model: str = ""
    ) -> None:
        """Run both realtime checks; while refusals for want of capacity await their retries, with the margin kept
        for them, unless ``asker`` (caller, request digest) is one of those, back after its Retry-After. Remember
        a refused asker (nothing is kept when both checks are off, when no margin is set, or without an asker)."""
        if self.lateness_s <= 0 and self.first_audio_s <= 0:
            return
        if self.refusals is None or asker is None or self.retry_margin_s <= 0:
            self.check_listeners(deadlines, hosts=hosts)
            self.check_first_audio(first_chars, model=model)
            return
        now = time.time()
        retry, pending = self.refusals.redeem(*asker, now=now)
        margin = self.retry_margin_s if pending and not retry else 0.0  # below capacity none are pending
        try:
            self.check_listeners(deadlines, hosts=hosts, margin_s=margin)
            self.check_first_audio(first_chars, margin_s=margin, model=model)
        except ServiceUnavailable as refused:
            # Refused for the margin alone, it is not awaited: only want of capacity keeps the margin up.
            awaited = KEPT_FOR_RETRIES not in refused.details
            self.refusals.remember(*asker, retry_after_s=refused.retry_after, now=now, pending=awaited)
            raise
        if retry:
            ADMISSION_RETRIES_ADMITTED.inc()

    def admit(
        self, lane: str, deadlines: Sequence[float] = (), first_chars: int = 0, asker: Asker = None, model: str = ""
    ) -> float:
        """Raise ServiceUnavailable (503, Retry-After) unless a job on ``lane`` can start in time; return its wait.

        ``deadlines`` are the playback deadlines of the job's segments still to make (the first one now when
        none are given), ``first_chars`` the length of its first segment when the engines must make it, and
        ``model`` the variant that makes it (its first audio is judged by that variant's pace). A
        realtime job is refused when it or an admitted stream would miss a deadline (``check_listeners``), its
        first segment would take too long to make (``check_first_audio``) or wait longer than the lane's limit
        (both checks keep a margin for retries: ``check_realtime``, with ``asker`` the caller and request digest);
        a batch job, which yields to realtime work, only past the batch limit, and otherwise accepted with the
        estimate stated.
        """
        alive = self.workers.alive()
        # Each worker says how many model hosts it runs (what its `auto` layout chose); older ones, one.
        hosts = sum(int(w.get("hosts") or 1) for w in alive)
        verdict = self.breaker.check(workers_alive=len(alive))
        if not verdict.allowed:
            ADMISSION_REJECTIONS.labels("breaker").inc()
            raise ServiceUnavailable(f"not accepting jobs: {verdict.reason}", retry_after=verdict.retry_after)
        due = deadlines[0] if deadlines else time.time()
        if lane == "realtime":
            self.check_realtime(deadlines or [due], first_chars, hosts=hosts, asker=asker, model=model)
        wait = self.estimated_wait_s(due, hosts=hosts)
        limit = self.limits[lane]
        if wait > limit:
            ADMISSION_REJECTIONS.labels("overload").inc()
            raise ServiceUnavailable(
                f"the {lane} lane's first audio would start in about {wait:.0f} s (limit {limit:g} s); retry later",
                retry_after=min(300, math.ceil(wait - limit) + 1),
                estimated_wait_s=round(wait, 1),
            )
        return wait
