"""Turn a checked request into a durable, enqueued job: plan → look up → admit → persist → enqueue (no Flask)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from api.admission import Asker
from api.contract import JobBody
from cache.idempotency import body_digest
from cache.jobstore import JobRequest, JobStore
from cache.reservations import NOTHING, Reserved, chars_at_speed_one
from cache.schedule import ScheduleBook
from cache.sentences import SentenceCache, segment_keys
from cache.text_streams import TextStreams
from core.audio import PackedAudio
from core.errors import ServiceUnavailable, ValidationFailed
from core.metrics import CACHE_LOOKUPS, JOBS_SUBMITTED
from core.policy import SchedulingPolicy
from core.registry import ModelSpec, Registry
from core.schedule import timeline
from core.settings import Settings
from core.text import plan_segments
from workers.celery_app import Enqueue

log = logging.getLogger(__name__)

#: A cached segment as the job store takes it: audio, sample rate, metadata.
Hit = tuple[bytes | PackedAudio, int, dict[str, Any]]


@dataclass(frozen=True)
class Planned:
    """A request resolved against the registry and cut into segment texts."""

    spec: ModelSpec
    request: JobRequest
    texts: list[str]
    #: A text stream's opening text not yet speakable (None: the job took its whole text at once).
    tail: str | None = None
    text_chars: int = 0


@dataclass(frozen=True)
class Looked:
    """What the sentence cache already has of a planned job, at the moment it was accepted."""

    accepted_at: float
    hits: dict[int, Hit]
    misses: list[int]


@dataclass(frozen=True)
class Admitted:
    """A job that may start: its segments' deadlines, the pace they were set from, and its estimated wait."""

    deadlines: list[float]
    pace: float
    start_estimate_s: float
    #: The audio reserved for it in the job store (none without a budget).
    reserved: Reserved = NOTHING


@dataclass
class Submitter:
    """Submit jobs with one set of dependencies.

    ``admit(lane, deadlines to make, characters of the first segment if it is to make, asker)`` raises
    ServiceUnavailable when the job cannot be made in time, and otherwise returns the estimated seconds until its
    first segment starts; ``asker`` (caller, body digest) lets it tell a retry from a newcomer.
    ``reserve_audio(model, characters, lane)`` reserves the audio the job will write in the job store, raising StoreFull
    when there is no room for it, and ``release_audio(bytes)`` gives back a reservation no job was written for
    (cache/reservations.py). ``device_kinds()`` are the kinds of device the live workers run on (empty when none
    is known): a mode whose model runs on none of them is refused.
    """

    settings: Settings
    registry: Registry
    store: JobStore
    cache: SentenceCache
    enqueue: Enqueue
    book: ScheduleBook
    policy: SchedulingPolicy
    #: Admission (api/admission.Admission.admit): lane, deadlines, first segment's characters, asker, variant.
    admit: Callable[[str, Sequence[float], int, Asker, str], float] | None = None
    reserve_audio: Callable[[str, int, str], Reserved] | None = None
    release_audio: Callable[[int], None] | None = None
    text_streams: TextStreams | None = None
    device_kinds: Callable[[], frozenset[str]] = frozenset

    def submit(
        self, job: JobBody, *, owner: str = "", cache_scope: str = "", caller: str | None = None,
        job_id: str | None = None,
    ) -> str:  # fmt: skip
        """Plan the text, fill what the cache has, write the job and enqueue only the misses; return the id.

        ``owner`` (a caller id, or "" with keys off) is the only caller the job's routes answer;
        ``cache_scope`` is whose sentence-cache entries it may reuse; ``caller`` (who sent it, keys or not)
        lets admission know the same request sent again after a refusal; ``job_id``, when given, is the id the job
        is written under (an idempotency key claimed it first).
        """
        planned = self.plan(job, cache_scope=cache_scope)
        looked = self.look_up(planned)
        asker = (caller, body_digest(job.model_dump())) if caller is not None else None
        admitted = self.admit_job(planned, looked, asker)
        job_id, first = self.persist(planned, looked, admitted, owner=owner, job_id=job_id)
        if looked.misses:  # else every segment was cached: the job is done before the answer leaves
            self.publish(job_id, planned.request.priority, first, admitted.deadlines)
        JOBS_SUBMITTED.labels(planned.request.priority).inc()
        log.info(
            "job %s accepted: model %s, %d segments (%d cached), lane %s",
            job_id,
            planned.spec.name,
            len(planned.texts),
            len(looked.hits),
            planned.request.priority,
        )
        return job_id

    def plan(self, job: JobBody, *, cache_scope: str) -> Planned:
        """Resolve model, mode and voice, and cut the text into segments (TextOverLimit, 413, before anything is
        written). ``spec`` is the model in the job's mode: its own host, pace and cache entries."""
        model, mode = self.registry.named_mode(job.model, job.mode)
        spec = self.registry.get(model, mode, device_kinds=self.device_kinds())
        settings = self.settings
        tail = None
        if job.text_stream and self.text_streams is not None:
            texts, tail = self.text_streams.first_plan(job.text, spec.language)
        else:
            texts = plan_segments(
                job.text,
                max_chars=settings.segment_max_chars,
                first_max_chars=settings.first_segment_max_chars,
                language=spec.language,
                max_total_chars=settings.max_text_chars,
                max_segments=settings.max_segments,
            )
        if not texts and tail is None:
            raise ValidationFailed("text", "has nothing a voice can speak (only symbols or emoji?)")
        request = JobRequest(
            model=spec.model,
            voice=spec.resolve_voice(job.voice),
            speed=job.speed,
            mode=mode,
            format=job.format,
            priority=self.policy.lane_for(len(job.text), job.priority),
            seed=job.seed,
            cache=job.cache,
            cache_scope=cache_scope,
        )
        return Planned(spec, request, texts, tail, len(job.text))

    def look_up(self, planned: Planned) -> Looked:
        """Return the segments the sentence cache has, stamped as arriving now, and those to make."""
        request = planned.request
        found = (
            self.cache.get_many(segment_keys(planned.spec, request, planned.texts))
            if request.cache
            else [None] * len(planned.texts)
        )
        now = time.time()
        hits: dict[int, Hit] = {
            i: (c.audio, c.sample_rate, {**c.meta, "cached": True, "finished_at": round(now, 4)})
            for i, c in enumerate(found)
            if c is not None
        }
        misses = [i for i, c in enumerate(found) if c is None]
        if request.cache:
            CACHE_LOOKUPS.labels("hit").inc(len(hits))
            CACHE_LOOKUPS.labels("miss").inc(len(misses))
        return Looked(now, hits, misses)

    def admit_job(self, planned: Planned, looked: Looked, asker: Asker = None) -> Admitted:
        """Set the segments' deadlines and admit the job: 503 before anything is written, never 202 for work we
        cannot do."""
        pace = self.book.seconds_per_char(planned.spec.name)
        deadlines = timeline(
            lane=planned.request.priority,
            accepted_at=looked.accepted_at,
            chars=[len(t) for t in planned.texts],
            seconds_per_char=pace,
            policy=self.policy.deadlines,
            arrivals=dict.fromkeys(looked.hits, looked.accepted_at),
        ).deadlines(looked.accepted_at)
        wait = 0.0
        if (looked.misses or planned.tail is not None) and self.admit is not None:
            window = looked.misses[: self.policy.window(planned.request.priority)]  # what enters the queue now
            first_chars = len(planned.texts[0]) if looked.misses and looked.misses[0] == 0 else 0
            wait = self.admit(
                planned.request.priority, [deadlines[i] for i in window], first_chars, asker, planned.spec.name
            )
        reserved = NOTHING
        if self.reserve_audio is not None:  # last: a job refused for anything else reserves nothing
            chars = chars_at_speed_one(sum(len(t) for t in planned.texts), planned.request.speed)
            reserved = self.reserve_audio(planned.spec.name, chars, planned.request.priority)
        return Admitted(deadlines, pace, wait, reserved)

    def persist(
        self, planned: Planned, looked: Looked, admitted: Admitted, *, owner: str, job_id: str | None = None
    ) -> tuple[str, list[int]]:
        """Write the job and its cached segments; return its id and the misses to enqueue now.

        Long jobs are fed through a window: a book's segments enter the queue as its earlier ones finish, so a
        second book (or a short request on the same lane) is not stuck behind the whole first one. The first
        window waits in the outbox until it is enqueued: an API killed in between leaves it to a worker.
        """
        window = self.policy.window(planned.request.priority)
        first, later = looked.misses[:window], looked.misses[window:]
        fields = {
            "created_at": f"{looked.accepted_at:.6f}",
            "seconds_per_char": f"{admitted.pace:.5f}",
            "first_due_at": f"{admitted.deadlines[0] if admitted.deadlines else looked.accepted_at:.3f}",
            "start_estimate_s": f"{admitted.start_estimate_s:.1f}",
            "owner": owner,
        }
        if planned.tail is not None:  # a text stream: open for pieces, the opening text's tail kept back
            fields.update(text_open="1", text_next_seq="0", text_tail=planned.tail,
                          text_chars=str(planned.text_chars), text_last_at=fields["created_at"])  # fmt: skip
        store = self.store
        reserved = admitted.reserved
        try:
            job_id = store.create(
                planned.request, planned.texts, job_id=job_id, cached=len(looked.hits), pending=later, publish=first,
                fields=fields, owed=(reserved.bytes, reserved.per_char / planned.request.speed),
            )  # fmt: skip
        except BaseException:
            if self.release_audio is not None:  # no job holds the reservation (once written, its end gives it back)
                with contextlib.suppress(redis.RedisError):
                    self.release_audio(reserved.bytes)
            raise
        if looked.hits:
            try:
                store.write_segments(job_id, looked.hits)
            except redis.RedisError:
                with contextlib.suppress(redis.RedisError):  # never a half-written job that looks fine
                    store.fail(job_id, "could not write its cached segments (the job store is full or unavailable)")
                raise
        return job_id, first

    def publish(self, job_id: str, lane: str, first: list[int], deadlines: list[float]) -> None:
        """Enqueue the first window; a queue that refuses fails the job (503) rather than leave it waiting."""
        due = [deadlines[i] for i in first]
        try:
            self.book.add(job_id, dict(zip(first, due, strict=True)))
            self.enqueue(job_id, first, lane, self.policy.broker_order(due))
        except Exception as e:
            self.store.fail(job_id, "could not enqueue the job's segments")
            self.book.remove(job_id, first)
            raise ServiceUnavailable("the task queue is unavailable; retry shortly") from e
        with contextlib.suppress(redis.RedisError):  # enqueued: an entry left behind is only published twice
            self.store.published(job_id, first)
