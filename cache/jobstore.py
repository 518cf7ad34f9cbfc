"""The job store: job records, segment texts and finished segment audio in Redis."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import redis
from redis.commands.core import Script
from redis.typing import EncodableT, FieldT, KeyT

from cache import keys, scripts
from cache.events import EventWaiter
from cache.job_reads import JobReads, as_bytes, as_text, pairs, record_of
from cache.records import (
    TERMINAL,
    EndResult,
    FragmentResult,
    JobRecord,
    JobRequest,
    JobStatus,
    SegmentStart,
    SegmentWrite,
    StartState,
    WriteResult,
)
from cache.replication import Replication, replication_of
from core.audio import PackedAudio
from core.settings import Settings

__all__ = [
    "OUTBOX_GRACE_S",
    "TERMINAL",
    "JobRecord",
    "JobRequest",
    "JobStatus",
    "JobStore",
    "SegmentStart",
    "SegmentWrite",
    "StartState",
    "WriteResult",
    "store_of",
]

#: A segment taken off a job's pending list is published by its taker at once; past this grace a sweeper
#: publishes it instead (its taker crashed, or lost Redis, between the two steps).
OUTBOX_GRACE_S = 5.0


class JobStore(JobReads):
    """Read and change jobs in Redis; every change of a job is atomic."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        ttl: int,
        audio_ttl: int | None = None,
        codec: str = "flac",
        outbox_grace_s: float = OUTBOX_GRACE_S,
        waiter: EventWaiter | None = None,
        replication: Replication | None = None,
    ) -> None:
        self.redis = client
        # With replicas to wait for, what a worker builds on (a segment, a job's end) is written with a WAIT: a
        # write an old primary takes after a failover is refused to its writer, who tries again (cache/replication.py).
        self.replication = replication or Replication(client, replicas=0, timeout_ms=0)
        self.waiter = waiter  # shares one blocked connection among every wait (cache/events.py); None blocks here
        self.ttl = ttl  # a finished job's record
        self.audio_ttl = min(ttl, audio_ttl or ttl)  # a finished job's audio
        self.codec = codec  # how segment audio is kept (core.audio.STORE_CODECS)
        self.outbox_grace_s = outbox_grace_s
        self._write_segment = client.register_script(scripts.WRITE_SEGMENT)
        self._finish = client.register_script(scripts.FINISH)
        self._start_segment = client.register_script(scripts.START_SEGMENT)
        self._write_fragment = client.register_script(scripts.WRITE_FRAGMENT)

    def create(
        self,
        request: JobRequest,
        texts: list[str],
        *,
        job_id: str | None = None,
        cached: int = 0,
        pending: list[int] | None = None,
        publish: Iterable[int] = (),
        fields: dict[str, str] | None = None,
        owed: tuple[int, float] = (0, 0.0),
    ) -> str:
        """Write a new queued job with its segment texts; return its id.

        ``publish`` are the segments the caller enqueues next (they wait in the outbox until ``published``
        says so), ``pending`` the ones fed in later as others finish. ``owed`` is the audio reserved for the job
        (``Reservations.reserve``, already counted in the owed total): its bytes, and the bytes per character a
        text stream's later characters reserve; the job's writes spend it, and its end gives back the rest.
        """
        streaming = (fields or {}).get("text_open") == "1"  # a text stream may open before a sentence is complete
        if not texts and not streaming:
            raise ValueError("a job needs at least one segment")
        job_id = job_id or uuid.uuid4().hex
        now = str((fields or {}).get("created_at") or f"{time.time():.6f}")
        pipe = self.redis.pipeline(transaction=True)
        record: dict[FieldT, EncodableT] = {
            "id": job_id,
            "status": JobStatus.QUEUED.value,
            "request": request.to_json(),
            "segments_total": len(texts),
            "segments_done": 0,
            "cached_segments": cached,
            "chars_total": sum(len(t) for t in texts),
            "segment_chars": ",".join(str(len(t)) for t in texts),
            "created_at": now,
            "updated_at": now,
        }
        owed_bytes, owed_per_char = owed
        if owed_bytes > 0 or owed_per_char > 0:
            record.update(owed_bytes=owed_bytes, owed_per_char=f"{owed_per_char:.1f}")
        record.update((fields or {}).items())
        pipe.hset(keys.job(job_id), mapping=record)
        if texts:
            pipe.rpush(keys.texts(job_id), *texts)
        if streaming:
            pipe.zadd(keys.TEXT_STREAMS, {job_id: float(now)})
        if pending:
            pipe.rpush(keys.pending(job_id), *pending)
        outbox = {keys.segment_member(job_id, i): time.time() + self.outbox_grace_s for i in publish}
        if outbox:
            pipe.zadd(keys.OUTBOX, outbox)
        pipe.zadd(keys.LIVE_JOBS, {job_id: float(now)})
        pipe.execute()
        return job_id

    def published(self, job_id: str, indexes: Iterable[int]) -> None:
        """Take segments out of the outbox once they are on the broker."""
        members = [keys.segment_member(job_id, i) for i in indexes]
        if members:
            self.redis.zrem(keys.OUTBOX, *members)

    def forget_live(self, job_id: str) -> None:
        """Drop a finished (or vanished) job from the live index."""
        self.redis.zrem(keys.LIVE_JOBS, job_id)

    def released(self, job_ids: Iterable[str]) -> dict[str, list[int]]:
        """Return, for each live job, the segments released to be made: all it has planned but those still
        pending (in one round trip). Read before anything a released segment moves through (see ``written``)."""
        job_ids = list(job_ids)
        pipe = self.redis.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hmget(keys.job(job_id), ["status", "segments_total"])
            pipe.lrange(keys.pending(job_id), 0, -1)
        replies = pipe.execute()
        found = {}
        for n, job_id in enumerate(job_ids):
            (status, total), pending = replies[2 * n : 2 * n + 2]
            if status is None or JobStatus(as_bytes(status).decode()).terminal:
                continue
            waiting = {int(as_bytes(i)) for i in pending}
            found[job_id] = [i for i in range(int(as_bytes(total))) if i not in waiting]
        return found

    def written(self, job_ids: Iterable[str]) -> dict[str, set[int]]:
        """Return the indexes of the segments each job has written (in one round trip)."""
        job_ids = list(job_ids)
        pipe = self.redis.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hkeys(keys.audio(job_id))
        return {
            job_id: {int(as_bytes(i)) for i in found} for job_id, found in zip(job_ids, pipe.execute(), strict=True)
        }

    def touch(self, job_id: str) -> None:
        """Mark the job as looked after now (the reconciler's last visit)."""
        self.redis.hset(keys.job(job_id), "updated_at", f"{time.time():.6f}")

    def start_segment(
        self, job_id: str, index: int, *, worker: str = "", token: str | None = None, known: bool = False
    ) -> SegmentStart:
        """Read what making one segment needs, hold it for ``worker`` and count the attempt (see START_SEGMENT).

        ``token`` names the delivery (a task id and its retry count): a redelivery with the same token is
        the same attempt. Without one, every call is a new attempt. ``known`` says the caller already has the
        job's timeline, so only the metadata of the segments just before this one is read.
        """
        reply = self._start_segment(
            keys=[keys.job(job_id), keys.audio(job_id), keys.attempts(job_id), keys.texts(job_id),
                  keys.segment_meta(job_id), keys.claims(job_id), keys.held(worker), keys.HOLDERS],
            args=[str(index), f"{time.time():.6f}", token or uuid.uuid4().hex, keys.segment_member(job_id, index),
                  worker, "1" if known else "0"],
        )  # fmt: skip
        state = StartState(int(reply[0]))
        if state is not StartState.GO:
            return SegmentStart(state)
        _, record, attempt, text, meta, redelivered, failed = reply
        return SegmentStart(
            state,
            record=record_of(pairs(record)),  # None for a stray partial hash: the segment is skipped
            attempt=int(attempt),
            redelivered=bool(int(redelivered)),
            failed=int(failed),
            text=as_text(text) if text else None,
            meta={int(k): json.loads(v) for k, v in pairs(meta).items()},
        )

    def pack(self, audio: bytes | PackedAudio, sample_rate: int) -> PackedAudio:
        """Return segment audio as the store keeps it: raw PCM is encoded with the store's codec."""
        return audio if isinstance(audio, PackedAudio) else PackedAudio.pack(audio, sample_rate, self.codec)

    def _write_args(
        self,
        job_id: str,
        index: int,
        audio: bytes | PackedAudio,
        rate: int,
        meta: dict[str, Any],
        *,
        worker: str,
        advance: bool,
        learn: tuple[str, int] = ("", 0),
    ) -> tuple[list[str], list[EncodableT]]:
        now = time.time()
        script_keys = [
            *keys.all_job_keys(job_id), keys.held(worker), keys.OUTBOX, keys.LIVE_JOBS, keys.DUE, keys.AUDIO_KEPT,
            keys.STORE_OWED, keys.BYTES_PER_CHAR, keys.fragments(job_id),
        ]  # fmt: skip
        args: list[EncodableT] = [
            index, self.pack(audio, rate).data, json.dumps(meta), f"{now:.6f}", self.ttl, rate,
            keys.segment_member(job_id, index), job_id, f"{now + self.outbox_grace_s:.6f}", "1" if advance else "0",
            self.audio_ttl, f"{now + self.audio_ttl:.3f}", learn[0], learn[1],
        ]  # fmt: skip
        return script_keys, args

    def write_segments(
        self, job_id: str, segments: Mapping[int, tuple[bytes | PackedAudio, int, dict[str, Any]]]
    ) -> list[WriteResult]:
        """Store several finished segments (index → audio, rate, meta) in one round trip, advancing nothing."""
        pipe = self.redis.pipeline(transaction=False)
        for index, (audio, rate, meta) in sorted(segments.items()):
            script_keys, args = self._write_args(job_id, index, audio, rate, meta, worker="", advance=False)
            self._write_segment(keys=script_keys, args=args, client=pipe)
        return [WriteResult(int(reply[0])) for reply in pipe.execute()]  # the API confirms them before its 202

    def write_segment(
        self,
        job_id: str,
        index: int,
        audio: bytes | PackedAudio,
        *,
        sample_rate: int,
        meta: dict[str, Any],
        worker: str = "",
        advance: bool = False,
        learn: tuple[str, int] = ("", 0),
    ) -> SegmentWrite:
        """Store a finished segment once (raw PCM, or audio already packed), releasing ``worker``'s hold; with
        ``advance``, move the next pending one to the outbox (the caller publishes it, then calls ``published``).
        ``learn`` (model, the segment's characters) counts its bytes in the model's bytes per character.

        A store at its memory limit raises ``redis.OutOfMemoryError`` having changed nothing.
        """
        script_keys, args = self._write_args(
            job_id, index, audio, sample_rate, meta, worker=worker, advance=advance, learn=learn
        )
        result, next_index = self._durable(self._write_segment, script_keys, args)
        return SegmentWrite(WriteResult(int(result)), None if int(next_index) < 0 else int(next_index))

    def write_fragment(self, job_id: str, index: int, number: int, pcm: bytes, *, sample_rate: int) -> FragmentResult:
        """Store fragment ``number`` of a segment being made (raw 16-bit PCM) once, in order (see WRITE_FRAGMENT).

        A store at its memory limit raises ``redis.OutOfMemoryError`` having changed nothing.
        """
        reply = self._write_fragment(  # not waited for: the segment's write carries its audio (cache/replication.py)
            keys=[keys.job(job_id), keys.audio(job_id), keys.fragments(job_id), keys.events(job_id)],
            args=[index, number, pcm, sample_rate, f"{time.time():.6f}", self.audio_ttl],
        )
        return FragmentResult(int(reply))

    def _durable(self, script: Script, script_keys: Sequence[KeyT], args: Sequence[EncodableT]) -> Any:
        """Run a script; with replicas to wait for, in one round trip with its WAIT (Replication.execute)."""
        if not self.replication.replicas:
            return script(keys=script_keys, args=args)
        pipe = self.redis.pipeline(transaction=False)
        script(keys=script_keys, args=args, client=pipe)
        return self.replication.execute(pipe)[0]

    def hold(self, worker: str, job_id: str, index: int) -> None:
        """Record that a segment was delivered to ``worker`` (START_SEGMENT records it again)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.sadd(keys.held(worker), keys.segment_member(job_id, index))
        pipe.sadd(keys.HOLDERS, worker)
        pipe.execute()

    def count_failure(self, job_id: str, index: int) -> int:
        """Count one failed attempt of a segment (its engine raised); return how many it has had."""
        if not self.redis.exists(keys.job(job_id)):
            return 0  # gone: nothing to count on, and no key to create without a TTL
        return int(self.redis.hincrby(keys.attempts(job_id), keys.failed_field(index), 1))

    def release(self, worker: str, job_id: str, index: int) -> None:
        """Say that ``worker`` stopped working on a segment without writing it (its task failed or retries)."""
        self.redis.srem(keys.held(worker), keys.segment_member(job_id, index))

    def fail(self, job_id: str, reason: str, *, drop_audio: bool = False) -> bool:
        """Mark the job failed with a reason unless it already ended; say whether it changed. ``drop_audio``: remove
        its audio in the same step (only if it was still live), to make room in a full store."""
        return self._end(job_id, JobStatus.FAILED, reason, drop_audio=drop_audio)

    def cancel(self, job_id: str) -> bool:
        """Mark the job canceled unless it already ended; say whether it changed."""
        return self._end(job_id, JobStatus.CANCELED, "canceled by the client")

    def _end(self, job_id: str, status: JobStatus, reason: str, *, drop_audio: bool = False) -> bool:
        now = time.time()
        expires = f"{now + self.audio_ttl:.3f}"
        args = [
            status.value,
            reason,
            f"{now:.6f}",
            self.ttl,
            self.audio_ttl,
            expires,
            job_id,
            "1" if drop_audio else "0",
        ]
        script_keys = [*keys.all_job_keys(job_id), keys.AUDIO_KEPT, keys.STORE_OWED, keys.fragments(job_id)]
        result = EndResult(self._durable(self._finish, script_keys, args))
        if result is not EndResult.ALREADY_OVER:
            self.forget_live(job_id)
        return result is EndResult.ENDED


def store_of(client: redis.Redis, settings: Settings, *, waiter: EventWaiter | None = None) -> JobStore:
    """Return the job store on ``client`` with the settings' retention, audio codec and replicas to wait for."""
    replication = replication_of(client, settings.redis_url, replicas=settings.replicas_to_wait_for,
                                 timeout_ms=settings.redis_wait_timeout_ms)  # fmt: skip
    return JobStore(client, ttl=settings.job_ttl_s, audio_ttl=settings.audio_ttl_s, codec=settings.audio_store_codec,
                    waiter=waiter, replication=replication)  # fmt: skip
